//! Kafka helpers for integration tests: locate the broker through
//! `DEDUCTOR_KAFKA_BROKERS` (loopback default), a fresh input / outcome /
//! dead-letter topic triple and consumer group per test, producing events
//! keyed by `order_id`, reading a whole topic back, and the committed offsets
//! of a group.
//!
//! A test that cannot reach Kafka fails: it never skips. Blocking librdkafka
//! calls run on the blocking pool, so an in-process service on the same
//! runtime keeps running.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::future::join_all;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata, StreamConsumer};
use rdkafka::message::{Header, Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;

pub const DEFAULT_BROKERS: &str = "127.0.0.1:9092";

/// `DEDUCTOR_KAFKA_BROKERS`, or the loopback default.
pub fn brokers() -> String {
    std::env::var("DEDUCTOR_KAFKA_BROKERS").unwrap_or_else(|_| DEFAULT_BROKERS.to_owned())
}

/// A name no other test (or run) uses: `t-<label>-<random>`.
pub fn unique(label: &str) -> String {
    format!(
        "t-{label}-{:012x}",
        rand::random::<u64>() & 0xffff_ffff_ffff
    )
}

/// The topics and consumer group of one test.
#[derive(Debug, Clone)]
pub struct Topics {
    pub input: String,
    pub outcome: String,
    pub dlq: String,
    pub group: String,
    pub partitions: i32,
}

fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("creating a Kafka admin client")
}

/// Creates a fresh input / outcome / dead-letter topic triple (each with
/// `partitions` partitions) and names a fresh consumer group. Fails the test
/// when Kafka cannot be reached.
pub async fn fresh_topics(label: &str, partitions: i32) -> Topics {
    let base = unique(label);
    let t = Topics {
        input: format!("{base}.in"),
        outcome: format!("{base}.out"),
        dlq: format!("{base}.dlq"),
        group: format!("{base}.group"),
        partitions,
    };
    create_topics(&[&t.input, &t.outcome, &t.dlq], partitions).await;
    t
}

/// Creates topics and waits until every partition has a leader.
pub async fn create_topics(names: &[&str], partitions: i32) {
    let new: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| NewTopic::new(n, partitions, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(20)))
        .request_timeout(Some(Duration::from_secs(20)));
    let results = admin()
        .create_topics(new.iter(), &opts)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot reach Kafka at {} (start it with scripts/dev-stack up): {e}",
                brokers()
            )
        });
    for r in results {
        if let Err((name, code)) = r {
            panic!(
                "creating topic {name} on {}: {code} (is Kafka up? scripts/dev-stack up)",
                brokers()
            );
        }
    }
    for name in names {
        wait_for_leaders(name, partitions).await;
    }
}

/// Sets `configs` (e.g. `max.message.bytes`) on an existing topic (its
/// other settings go back to the broker's defaults) and waits until the
/// broker describes the new values.
pub async fn set_topic_config(topic: &str, configs: &[(&str, &str)]) {
    let mut change = AlterConfig::new(ResourceSpecifier::Topic(topic));
    for (k, v) in configs {
        change = change.set(k, v);
    }
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(20)));
    let results = admin()
        .alter_configs([&change], &opts)
        .await
        .unwrap_or_else(|e| panic!("altering {topic} on {}: {e}", brokers()));
    for r in results {
        if let Err((resource, code)) = r {
            panic!("altering {resource:?}: {code}");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let topic_spec = ResourceSpecifier::Topic(topic);
    loop {
        let described = admin().describe_configs([&topic_spec], &opts).await;
        let applied = match described.as_deref() {
            Ok([Ok(resource)]) => configs
                .iter()
                .all(|(k, v)| resource.get(k).and_then(|e| e.value.as_deref()) == Some(*v)),
            _ => false,
        };
        if applied {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{topic}: {configs:?} not applied after 30s: {described:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes topics (best effort: cleanup after a passed test).
pub async fn delete_topics(names: &[&str]) {
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let _ = admin().delete_topics(names, &opts).await;
}

async fn wait_for_leaders(topic: &str, partitions: i32) {
    let topic = topic.to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let t = topic.clone();
        let ready = tokio::task::spawn_blocking(move || {
            let c = metadata_consumer();
            let md = c.fetch_metadata(Some(&t), Duration::from_secs(5)).ok()?;
            let mt = md.topics().iter().find(|x| x.name() == t)?;
            Some(
                mt.error().is_none()
                    && mt.partitions().len() == partitions as usize
                    && mt.partitions().iter().all(|p| p.leader() >= 0),
            )
        })
        .await
        .unwrap();
        if ready == Some(true) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "topic {topic} has no leader for every partition after 30s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn metadata_consumer() -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("creating a Kafka client")
}

/// A consumer of `group` (auto commit off) with the given session timeout
/// (heartbeats a sixth of it, at most librdkafka's default 3 s): a member
/// the tests join, leave or take metadata from.
pub fn group_member(group: &str, session_timeout_ms: u32) -> StreamConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", session_timeout_ms.to_string())
        .set(
            "heartbeat.interval.ms",
            (session_timeout_ms / 6).clamp(100, 3000).to_string(),
        )
        .create()
        .expect("creating a group consumer")
}

/// An idempotent, `acks=all` producer, shared by the tests of a binary.
pub fn producer() -> FutureProducer {
    static PRODUCER: std::sync::OnceLock<FutureProducer> = std::sync::OnceLock::new();
    PRODUCER.get_or_init(new_producer).clone()
}

fn new_producer() -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        // Long enough to ride out a broker restart in the outage tests.
        .set("message.timeout.ms", "120000")
        .create()
        .expect("creating a Kafka producer")
}

/// A producer like [`producer`] whose `message.max.bytes` is 10 MB, for
/// records larger than librdkafka's default of 1,000,000 bytes.
pub fn large_producer() -> FutureProducer {
    static PRODUCER: std::sync::OnceLock<FutureProducer> = std::sync::OnceLock::new();
    PRODUCER
        .get_or_init(|| {
            ClientConfig::new()
                .set("bootstrap.servers", brokers())
                .set("enable.idempotence", "true")
                .set("acks", "all")
                .set("message.max.bytes", "10000000")
                .set("message.timeout.ms", "120000")
                .create()
                .expect("creating a Kafka producer")
        })
        .clone()
}

/// Where a record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Placed {
    pub partition: i32,
    pub offset: i64,
    /// The record's timestamp (ms) as the broker stored it.
    pub timestamp: i64,
}

/// One raw record to produce.
#[derive(Debug, Clone, Default)]
pub struct Raw {
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// Forces a partition (None: the key decides).
    pub partition: Option<i32>,
    /// Explicit timestamp in ms (None: the producer's clock).
    pub timestamp: Option<i64>,
    /// Record headers, in order.
    pub headers: Vec<(String, String)>,
}

/// Produces `records` in order (all in flight at once, acks awaited);
/// returns where each landed.
pub async fn produce_raw(topic: &str, records: &[Raw]) -> Vec<Placed> {
    produce_raw_with(&producer(), topic, records).await
}

/// [`produce_raw`] through the producer `p`.
pub async fn produce_raw_with(p: &FutureProducer, topic: &str, records: &[Raw]) -> Vec<Placed> {
    let sends = records.iter().map(|r| {
        let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic);
        if let Some(k) = &r.key {
            rec = rec.key(k.as_slice());
        }
        if let Some(v) = &r.payload {
            rec = rec.payload(v.as_slice());
        }
        if let Some(part) = r.partition {
            rec = rec.partition(part);
        }
        if let Some(ts) = r.timestamp {
            rec = rec.timestamp(ts);
        }
        if !r.headers.is_empty() {
            let mut h = rdkafka::message::OwnedHeaders::new();
            for (k, v) in &r.headers {
                h = h.insert(Header {
                    key: k,
                    value: Some(v.as_bytes()),
                });
            }
            rec = rec.headers(h);
        }
        p.send(rec, Duration::from_secs(30))
    });
    join_all(sends)
        .await
        .into_iter()
        .map(|r| match r {
            Ok(d) => Placed {
                partition: d.partition,
                offset: d.offset,
                timestamp: d.timestamp.to_millis().unwrap_or(-1),
            },
            Err((e, _)) => panic!("producing to {topic} on {}: {e}", brokers()),
        })
        .collect()
}

/// Produces JSON events keyed by their `order_id`, in order.
pub async fn produce_events(topic: &str, events: &[Value]) -> Vec<Placed> {
    let raws: Vec<Raw> = events
        .iter()
        .map(|e| Raw {
            key: e["order_id"].as_str().map(|s| s.as_bytes().to_vec()),
            payload: Some(serde_json::to_vec(e).unwrap()),
            ..Raw::default()
        })
        .collect();
    produce_raw(topic, &raws).await
}

/// A record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// Header name -> value (UTF-8, lossy); repeated names keep the last.
    pub headers: BTreeMap<String, String>,
    /// Every header in the record's order, repeats included.
    pub header_list: Vec<(String, String)>,
}

impl Record {
    /// The payload as JSON; panics when it is not.
    pub fn json(&self) -> Value {
        let bytes = self.payload.as_deref().unwrap_or_default();
        serde_json::from_slice(bytes).unwrap_or_else(|e| {
            panic!(
                "record {}@{} is not JSON ({e}): {}",
                self.partition,
                self.offset,
                String::from_utf8_lossy(bytes)
            )
        })
    }

    pub fn key_str(&self) -> Option<String> {
        self.key
            .as_ref()
            .map(|k| String::from_utf8_lossy(k).into_owned())
    }
}

fn record_of<M: Message>(m: &M) -> Record {
    let mut headers = BTreeMap::new();
    let mut header_list = Vec::new();
    if let Some(h) = m.headers() {
        for Header { key, value } in h.iter() {
            let value = value
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            headers.insert(key.to_owned(), value.clone());
            header_list.push((key.to_owned(), value));
        }
    }
    Record {
        partition: m.partition(),
        offset: m.offset(),
        timestamp: m.timestamp().to_millis(),
        key: m.key().map(<[u8]>::to_vec),
        payload: m.payload().map(<[u8]>::to_vec),
        headers,
        header_list,
    }
}

/// Per-partition high watermarks (the log end) of `topic`.
pub async fn end_offsets(topic: &str) -> BTreeMap<i32, i64> {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let c = metadata_consumer();
        let md = c
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("metadata of {topic} from {}: {e}", brokers()));
        let parts: Vec<i32> = md.topics()[0].partitions().iter().map(|p| p.id()).collect();
        parts
            .into_iter()
            .map(|p| {
                let (_, high) = c
                    .fetch_watermarks(&topic, p, Duration::from_secs(10))
                    .unwrap_or_else(|e| panic!("watermarks of {topic}/{p}: {e}"));
                (p, high)
            })
            .collect()
    })
    .await
    .unwrap()
}

/// Reads `topic` from the beginning until `done(records so far)` holds, then
/// on to the log end as it is at that moment (so repeats written before it
/// are seen too). Panics after `timeout` with what was read.
pub async fn read_until(
    topic: &str,
    timeout: Duration,
    mut done: impl FnMut(&[Record]) -> bool,
) -> Vec<Record> {
    let c: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .expect("creating a Kafka reader");
    let ends = end_offsets(topic).await;
    let mut tpl = TopicPartitionList::new();
    for p in ends.keys() {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).expect("assigning the reader");
    let deadline = Instant::now() + timeout;
    let mut out: Vec<Record> = Vec::new();
    let mut target: Option<BTreeMap<i32, i64>> = None;
    let mut next: BTreeMap<i32, i64> = ends.keys().map(|p| (*p, 0)).collect();
    loop {
        if target.is_none() && done(&out) {
            target = Some(end_offsets(topic).await);
        }
        if let Some(t) = &target {
            if t.iter()
                .all(|(p, end)| next.get(p).copied().unwrap_or(0) >= *end)
            {
                return out;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let summary: Vec<String> = out
                .iter()
                .rev()
                .take(5)
                .map(|r| {
                    String::from_utf8_lossy(r.payload.as_deref().unwrap_or_default()).into_owned()
                })
                .collect();
            panic!(
                "reading {topic}: condition not met after {timeout:?}; {} records read (last: {summary:?})",
                out.len()
            );
        }
        match tokio::time::timeout(left.min(Duration::from_millis(250)), c.recv()).await {
            Ok(Ok(m)) => {
                let r = record_of(&m);
                next.insert(r.partition, r.offset + 1);
                out.push(r);
            }
            Ok(Err(e)) => panic!("reading {topic}: {e}"),
            // Nothing new: the reader's position may still have moved past
            // transaction markers and aborted records (a read_committed
            // reader never receives those offsets).
            Err(_) => {
                if let Ok(pos) = c.position() {
                    for e in pos.elements_for_topic(topic) {
                        if let Offset::Offset(o) = e.offset() {
                            let n = next.entry(e.partition()).or_insert(0);
                            *n = (*n).max(o);
                        }
                    }
                }
            }
        }
    }
}

/// Reads exactly `n` records of `topic` (and fails if more are there at that
/// moment).
pub async fn read_n(topic: &str, n: usize, timeout: Duration) -> Vec<Record> {
    let out = read_until(topic, timeout, |r| r.len() >= n).await;
    assert_eq!(out.len(), n, "{topic}: expected {n} records, found more");
    out
}

/// Reads `topic` up to its current log end.
pub async fn read_all(topic: &str) -> Vec<Record> {
    read_until(topic, Duration::from_secs(60), |_| true).await
}

/// The committed offsets of `group` on `topic`'s partitions (None: nothing
/// committed).
pub async fn committed(group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, Option<i64>> {
    let (group, topic) = (group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("creating a Kafka client");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(&topic, p);
        }
        // The group's coordinator may be moving or still loading (a broker
        // answers NotCoordinator / CoordinatorLoadInProgress for a while
        // after a group is created or the broker restarted): ask again.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let got = loop {
            match c.committed_offsets(tpl.clone(), Duration::from_secs(15)) {
                Ok(got) => break got,
                Err(e)
                    if std::time::Instant::now() < deadline
                        && matches!(
                            e.rdkafka_error_code(),
                            Some(
                                RDKafkaErrorCode::NotCoordinator
                                    | RDKafkaErrorCode::CoordinatorLoadInProgress
                                    | RDKafkaErrorCode::CoordinatorNotAvailable
                                    | RDKafkaErrorCode::RequestTimedOut
                                    | RDKafkaErrorCode::OperationTimedOut
                            )
                        ) =>
                {
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => panic!("committed offsets of {group} on {topic}: {e}"),
            }
        };
        got.elements_for_topic(&topic)
            .iter()
            .map(|e| {
                let o = match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                };
                (e.partition(), o)
            })
            .collect()
    })
    .await
    .unwrap()
}

/// Whether `committed` (from [`committed`]) has reached `ends` (from
/// [`end_offsets`]) on every partition that holds records.
pub fn committed_to(ends: &BTreeMap<i32, i64>, committed: &BTreeMap<i32, Option<i64>>) -> bool {
    ends.iter()
        .all(|(p, end)| *end == 0 || committed.get(p).copied().flatten() == Some(*end))
}

/// Waits until the committed offsets of `group` equal the log end of
/// `topic` on every partition; returns them.
pub async fn wait_committed_to_end(
    group: &str,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> BTreeMap<i32, i64> {
    let ends = end_offsets(topic).await;
    let deadline = Instant::now() + timeout;
    loop {
        let c = committed(group, topic, partitions).await;
        if committed_to(&ends, &c) {
            return ends;
        }
        assert!(
            Instant::now() < deadline,
            "group {group}: committed {c:?}, log end {ends:?} after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Records of `records` grouped by the string field `field` of their JSON.
pub fn by_field(records: &[Record], field: &str) -> BTreeMap<String, Vec<Value>> {
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for r in records {
        let v = r.json();
        let k = v[field].as_str().unwrap_or("<none>").to_owned();
        out.entry(k).or_default().push(v);
    }
    out
}

/// The distinct `(partition, offset)` sources named by outcome records.
pub fn sources(records: &[Record]) -> BTreeSet<(i32, i64)> {
    records
        .iter()
        .map(|r| {
            let v = r.json();
            (
                v["source"]["partition"].as_i64().unwrap() as i32,
                v["source"]["offset"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// A transaction of a producer of its own (id `t-<label>-...`), opened with
/// `offset` sent as the committed offset of partition 0 of `topic` under the
/// group `metadata`; the caller commits or aborts it (or leaves it open).
pub async fn offsets_in_a_transaction(
    label: &str,
    topic: &str,
    metadata: ConsumerGroupMetadata,
    offset: i64,
) -> FutureProducer {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("transactional.id", unique(label))
        .set("transaction.timeout.ms", "120000")
        .create()
        .expect("creating a transactional producer");
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, Offset::Offset(offset))
        .expect("offset");
    tokio::task::spawn_blocking(move || {
        let t = Duration::from_secs(30);
        producer.init_transactions(t).expect("init_transactions");
        producer.begin_transaction().expect("begin_transaction");
        producer
            .send_offsets_to_transaction(&list, &metadata, t)
            .expect("the broker takes the offsets");
        producer
    })
    .await
    .expect("transaction task")
}
