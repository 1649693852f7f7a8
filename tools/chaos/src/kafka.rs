//! The chaos run's Kafka side: fresh topics, paced production that rides out
//! broker restarts, reading a whole topic back, and the group's committed
//! offsets against the log end.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use crate::workload::Record;

/// Progress of the production, shared with the orchestrator.
#[derive(Debug, Default)]
pub struct Production {
    pub acked: AtomicUsize,
    pub failed: AtomicUsize,
    pub done: AtomicBool,
    /// Bursts started so far (faults wait for the next one, to hit the
    /// consumers while they have events in flight).
    pub bursts: AtomicUsize,
}

/// Produces `records` in order, in bursts of `burst` records spread evenly
/// over `over` (so the consumers have a backlog at many moments a fault can
/// hit), with an idempotent `acks=all` producer whose records wait up to 10
/// minutes for a broker (a broker restart delays them, never loses or
/// reorders them).
pub async fn produce(
    brokers: &str,
    topic: &str,
    records: &[Record],
    over: Duration,
    burst: usize,
    progress: Arc<Production>,
) -> anyhow::Result<()> {
    let burst = burst.max(1);
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "600000")
        .set("message.max.bytes", "1048576")
        .create()
        .context("producer")?;
    let start = Instant::now();
    let total = records.len().max(1);
    let mut pending = FuturesUnordered::new();
    for (i, r) in records.iter().enumerate() {
        // The burst of record i is due at its first record's share of the way.
        let due = over.mul_f64((i - i % burst) as f64 / total as f64);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            if wait > Duration::from_millis(2) {
                tokio::time::sleep(wait).await;
            }
        }
        if i % burst == 0 {
            progress.bursts.fetch_add(1, Ordering::Relaxed);
        }
        let mut rec: FutureRecord<'_, str, [u8]> = FutureRecord::to(topic).payload(&r.payload);
        if let Some(k) = &r.key {
            rec = rec.key(k.as_str());
        }
        // send_result enqueues now, so records keep their order; the ack is
        // awaited later. A full local queue (a long broker outage) waits.
        let delivery = loop {
            match producer.send_result(rec) {
                Ok(d) => break d,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    rec = back;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err((e, _)) => bail!("producing record {i}: {e}"),
            }
        };
        let p = progress.clone();
        pending.push(async move {
            match delivery.await {
                Ok(Ok(_)) => p.acked.fetch_add(1, Ordering::Relaxed),
                Ok(Err((e, _))) => {
                    eprintln!("chaos: produce failed: {e}");
                    p.failed.fetch_add(1, Ordering::Relaxed)
                }
                Err(_) => p.failed.fetch_add(1, Ordering::Relaxed),
            };
        });
        while pending.len() > 8192 {
            pending.next().await;
        }
        while let Some(Some(())) = futures::FutureExt::now_or_never(pending.next()) {}
    }
    while pending.next().await.is_some() {}
    progress.done.store(true, Ordering::Relaxed);
    if progress.failed.load(Ordering::Relaxed) > 0 {
        bail!(
            "{} records could not be produced",
            progress.failed.load(Ordering::Relaxed)
        );
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
}

fn client(brokers: &str) -> anyhow::Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "deductor-chaos-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.message.max.bytes", "2097152")
        .create()
        .context("reader client")
}

fn partitions(c: &BaseConsumer, topic: &str) -> anyhow::Result<Vec<i32>> {
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let t = md
        .topics()
        .first()
        .with_context(|| format!("no metadata for {topic}"))?;
    Ok(t.partitions().iter().map(|p| p.id()).collect())
}

/// The log end (high watermark) of every partition of `topic`.
pub fn log_ends(brokers: &str, topic: &str) -> anyhow::Result<BTreeMap<i32, i64>> {
    let c = client(brokers)?;
    let mut out = BTreeMap::new();
    for p in partitions(&c, topic)? {
        let (_, high) = c.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        out.insert(p, high);
    }
    Ok(out)
}

/// The offsets `group` committed on `topic` (-1 where none).
pub fn committed(brokers: &str, group: &str, topic: &str) -> anyhow::Result<BTreeMap<i32, i64>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .context("offsets client")?;
    let mut tpl = TopicPartitionList::new();
    let parts = partitions(&c, topic)?;
    for p in &parts {
        tpl.add_partition(topic, *p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(parts
        .iter()
        .map(|p| {
            let o = match got.find_partition(topic, *p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => -1,
            };
            (*p, o)
        })
        .collect())
}

/// Every record of `topic` up to its current log end.
pub fn read_all(brokers: &str, topic: &str) -> anyhow::Result<Vec<Read>> {
    let c = client(brokers)?;
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
    let deadline = Instant::now() + Duration::from_secs(600);
    while !left.is_empty() {
        if Instant::now() > deadline {
            bail!("reading {topic}: still missing {left:?} after 10 minutes");
        }
        let Some(m) = c.poll(Duration::from_millis(500)) else {
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
        });
        if left.get(&p).is_some_and(|&end| o + 1 >= end) {
            left.remove(&p);
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok(out)
}
