//! The chaos run's Kafka side: paced production that rides out broker
//! restarts, and the group's committed offsets (fresh topics and reading a
//! topic back are `deductor_testkit::topics`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use deductor_testkit::topics;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
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

/// The offsets `group` committed on `topic` (-1 where none).
pub fn committed(brokers: &str, group: &str, topic: &str) -> anyhow::Result<BTreeMap<i32, i64>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .context("offsets client")?;
    let mut tpl = TopicPartitionList::new();
    let parts = topics::partitions(&c, topic)?;
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
