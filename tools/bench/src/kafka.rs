//! The bench's Kafka side: fresh topics, preloading events, pacing events at
//! a fixed rate, and reading outcomes back with their broker timestamps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use deductor_testkit::topics;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use serde::Deserialize;

use crate::workload::Generator;

pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

pub async fn delete_topics(brokers: &str, topics: &[String]) {
    let Ok(admin) = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create::<AdminClient<DefaultClientContext>>()
    else {
        return;
    };
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let _ = admin.delete_topics(&names, &AdminOptions::new()).await;
}

/// Counts failed deliveries.
#[derive(Default)]
pub struct Counting {
    failed: AtomicU64,
}

impl ClientContext for Counting {}

impl ProducerContext for Counting {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        if r.is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn producer(brokers: &str, linger_ms: &str) -> anyhow::Result<ThreadedProducer<Counting>> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", linger_ms)
        .set("queue.buffering.max.messages", "200000")
        .create_with_context(Counting::default())
        .context("bench producer")
}

/// Sends one record, waiting while the local queue is full; returns the
/// timestamp it was given.
fn send(
    p: &ThreadedProducer<Counting>,
    topic: &str,
    key: &str,
    value: &str,
) -> anyhow::Result<i64> {
    loop {
        let ts = unix_ms();
        let record = BaseRecord::to(topic).key(key).payload(value).timestamp(ts);
        match p.send(record) {
            Ok(()) => return Ok(ts),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

fn finish(p: ThreadedProducer<Counting>) -> anyhow::Result<()> {
    p.flush(Duration::from_secs(60))
        .context("flushing the bench producer")?;
    let failed = p.context().failed.load(Ordering::Relaxed);
    if failed > 0 {
        bail!("{failed} events were not acknowledged by the broker");
    }
    Ok(())
}

/// Produces `n` events of `g` as fast as the broker takes them; returns the
/// number of refunds among them.
pub fn preload(brokers: &str, topic: &str, g: &mut Generator, n: u64) -> anyhow::Result<u64> {
    let p = producer(brokers, "20")?;
    let mut refunds = 0;
    for _ in 0..n {
        let e = g.next_event();
        refunds += u64::from(e.refund);
        send(&p, topic, &e.key, &e.value)?;
    }
    finish(p)?;
    Ok(refunds)
}

/// Produces `n` events of `g` at `rate` per second (1 ms ticks); returns each
/// event's produce timestamp (ms), by sequence number.
pub fn paced(
    brokers: &str,
    topic: &str,
    g: &mut Generator,
    n: u64,
    rate: f64,
) -> anyhow::Result<Vec<i64>> {
    let p = producer(brokers, "1")?;
    let mut stamps = Vec::with_capacity(n as usize);
    let start = Instant::now();
    while (stamps.len() as u64) < n {
        let due = ((start.elapsed().as_secs_f64() * rate) as u64).min(n);
        while (stamps.len() as u64) < due {
            let e = g.next_event();
            stamps.push(send(&p, topic, &e.key, &e.value)?);
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    finish(p)?;
    Ok(stamps)
}

/// The fields of an outcome the bench looks at.
#[derive(Debug, Deserialize)]
struct OutcomeJson {
    #[serde(rename = "type")]
    kind: String,
    event_id: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    duplicate: bool,
    #[serde(default)]
    processed_at: Option<String>,
}

#[derive(Debug, Clone)]
pub struct OutcomeRec {
    pub event_id: String,
    pub kind: String,
    pub reason: Option<String>,
    pub duplicate: bool,
    /// Broker append time, ms.
    pub ts_ms: i64,
    /// deductor's clock when it built the outcome (after Redis), ms.
    pub processed_ms: Option<i64>,
    /// When the bench's reader (read_committed, librdkafka's default) got
    /// it, ms: with kafka.delivery = exactly_once, after its transaction
    /// committed. The append time for [`read_all`].
    pub seen_ms: i64,
}

fn reader(brokers: &str, topic: &str, partitions: i32) -> anyhow::Result<BaseConsumer> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "deductor-bench-reader")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .set("isolation.level", "read_committed")
        .create()
        .context("outcome reader")?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    Ok(c)
}

/// An outcome (or an input event: the fields are the same) from its JSON
/// and the record's timestamp; None if either is missing.
fn decode(payload: &[u8], ts_ms: Option<i64>) -> Option<OutcomeRec> {
    let o: OutcomeJson = serde_json::from_slice(payload).ok()?;
    Some(OutcomeRec {
        event_id: o.event_id,
        kind: o.kind,
        reason: o.reason,
        duplicate: o.duplicate,
        ts_ms: ts_ms?,
        seen_ms: ts_ms?,
        processed_ms: o
            .processed_at
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(&t).ok())
            .map(|t| t.timestamp_millis()),
    })
}

/// Reads every outcome now in `topic` (up to the log ends).
pub fn read_all(brokers: &str, topic: &str) -> anyhow::Result<Vec<OutcomeRec>> {
    Ok(topics::read_all(brokers, topic, Duration::from_secs(120))?
        .iter()
        .filter_map(|r| decode(&r.payload, r.timestamp))
        .collect())
}

/// Reads outcomes as they arrive until `want` of them have an event id
/// starting with `prefix`, or `timeout` passes.
pub fn read_live(
    brokers: &str,
    topic: &str,
    partitions: i32,
    prefix: &str,
    want: usize,
    timeout: Duration,
) -> anyhow::Result<Vec<OutcomeRec>> {
    read_live_with(brokers, topic, partitions, prefix, want, timeout, |_| {})
}

/// [`read_live`], calling `seen(n)` each time the n-th outcome arrived.
pub fn read_live_with(
    brokers: &str,
    topic: &str,
    partitions: i32,
    prefix: &str,
    want: usize,
    timeout: Duration,
    mut seen: impl FnMut(usize),
) -> anyhow::Result<Vec<OutcomeRec>> {
    let c = reader(brokers, topic, partitions)?;
    let deadline = Instant::now() + timeout;
    let mut out = Vec::with_capacity(want);
    while out.len() < want && Instant::now() < deadline {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let o = decode(m.payload().unwrap_or_default(), m.timestamp().to_millis());
                if let Some(mut o) = o.filter(|o| o.event_id.starts_with(prefix)) {
                    o.seen_ms = unix_ms();
                    out.push(o);
                    seen(out.len());
                }
            }
            Some(Err(e)) => bail!("reading {topic}: {e}"),
            None => {}
        }
    }
    Ok(out)
}
