//! The topics of a run: creating fresh input, outcome and dead-letter
//! topics, and reading a topic back to its log end.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

/// One topic to create.
pub struct Topic<'a> {
    pub name: &'a str,
    pub partitions: i32,
    /// Broker append timestamps (`LogAppendTime`): a record's timestamp is
    /// when the broker wrote it.
    pub append_time: bool,
}

/// Creates the topics (an existing one is kept) and waits up to `wait`
/// until every partition has a leader.
pub async fn create(brokers: &str, topics: &[Topic<'_>], wait: Duration) -> anyhow::Result<()> {
    create_replicated(brokers, topics, wait, 1).await
}

/// [`create`] with `replication` replicas per partition; with more than one,
/// `min.insync.replicas` is one less (a write with `acks=all` then needs two
/// of three replicas, and survives one broker down).
pub async fn create_replicated(
    brokers: &str,
    topics: &[Topic<'_>],
    wait: Duration,
    replication: i32,
) -> anyhow::Result<()> {
    let min_isr = (replication - 1).max(1).to_string();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("admin client")?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            let mut n = NewTopic::new(t.name, t.partitions, TopicReplication::Fixed(replication));
            if replication > 1 {
                n = n.set("min.insync.replicas", &min_isr);
            }
            if t.append_time {
                n.set("message.timestamp.type", "LogAppendTime")
            } else {
                n
            }
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in admin.create_topics(&new, &opts).await? {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => bail!("creating topic {t}: {code}"),
        }
    }
    let deadline = Instant::now() + wait;
    for t in topics {
        loop {
            let md = admin
                .inner()
                .fetch_metadata(Some(t.name), Duration::from_secs(5))?;
            let ready = md.topics().first().is_some_and(|m| {
                m.partitions().len() == t.partitions as usize
                    && m.partitions().iter().all(|p| p.leader() >= 0)
            });
            if ready {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "topic {} has no leader for every partition after {} s",
                    t.name,
                    wait.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// One record read back.
#[derive(Debug, Clone)]
pub struct Read {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: HashMap<String, String>,
    /// The record's timestamp, ms: the broker's append time on a
    /// `LogAppendTime` topic, else the producer's.
    pub timestamp: Option<i64>,
}

/// A consumer that only reads partitions it is assigned (no group joins, no
/// commits).
fn reader(brokers: &str) -> anyhow::Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "deductor-testkit-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.message.max.bytes", "2097152")
        .create()
        .context("reader client")
}

/// The partitions of `topic`, from the broker's metadata.
pub fn partitions(c: &BaseConsumer, topic: &str) -> anyhow::Result<Vec<i32>> {
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let t = md
        .topics()
        .first()
        .with_context(|| format!("no metadata for {topic}"))?;
    Ok(t.partitions().iter().map(|p| p.id()).collect())
}

/// The log end (high watermark) of every partition of `topic`.
pub fn log_ends(brokers: &str, topic: &str) -> anyhow::Result<BTreeMap<i32, i64>> {
    let c = reader(brokers)?;
    let mut out = BTreeMap::new();
    for p in partitions(&c, topic)? {
        let (_, high) = c.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        out.insert(p, high);
    }
    Ok(out)
}

/// Every record of `topic` up to its current log end, by partition and
/// offset; fails if that is not read within `within`.
pub fn read_all(brokers: &str, topic: &str, within: Duration) -> anyhow::Result<Vec<Read>> {
    let c = reader(brokers)?;
    let ends = log_ends(brokers, topic)?;
    let mut tpl = TopicPartitionList::new();
    let mut left: HashMap<i32, i64> = HashMap::new();
    for (&p, &end) in &ends {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        if end > 0 {
            left.insert(p, end);
        }
    }
    c.assign(&tpl)?;
    let mut out = Vec::new();
    let deadline = Instant::now() + within;
    while !left.is_empty() {
        if Instant::now() > deadline {
            bail!(
                "reading {topic}: still missing {left:?} after {} s",
                within.as_secs()
            );
        }
        let Some(m) = c.poll(Duration::from_millis(500)) else {
            // A read_committed reader never gets transaction markers or
            // aborted records: its position moves past them.
            if let Ok(pos) = c.position() {
                for e in pos.elements_for_topic(topic) {
                    if let Offset::Offset(o) = e.offset() {
                        if left.get(&e.partition()).is_some_and(|&end| o >= end) {
                            left.remove(&e.partition());
                        }
                    }
                }
            }
            continue;
        };
        let m = m.with_context(|| format!("reading {topic}"))?;
        let mut headers = HashMap::new();
        if let Some(h) = m.headers() {
            for x in h.iter() {
                let v = x.value.map(|v| String::from_utf8_lossy(v).into_owned());
                headers.insert(x.key.to_owned(), v.unwrap_or_default());
            }
        }
        let (p, o) = (m.partition(), m.offset());
        out.push(Read {
            partition: p,
            offset: o,
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().unwrap_or_default().to_vec(),
            headers,
            timestamp: m.timestamp().to_millis(),
        });
        if left.get(&p).is_some_and(|&end| o + 1 >= end) {
            left.remove(&p);
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok(out)
}
