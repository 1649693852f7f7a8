//! The consumer group: configuration, rebalance callbacks, statistics.
//!
//! Rebalance callbacks run inside `recv()` on the pipeline's task. On a
//! revoke they commit the watermarks of the revoked partitions synchronously
//! ([`commit::revoked`]: never past an unacknowledged event, G5), forget
//! them, and queue a note for the pipeline, which retires those partitions'
//! lanes before it handles the next message.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::statistics::Statistics;
use rdkafka::TopicPartitionList;

use super::commit;
use super::offsets::Offsets;
use super::transaction::Transactions;
use crate::config::KafkaSettings;
use crate::metrics;

/// What a rebalance did, for the pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assignment {
    Assigned(Vec<i32>),
    Revoked(Vec<i32>),
}

pub struct Context {
    topic: String,
    offsets: Offsets,
    notes: Mutex<Vec<Assignment>>,
    /// Partitions of the input topic this member holds. librdkafka keeps
    /// reporting a revoked partition in its statistics with the lag it had
    /// when it was revoked (its end offset is no longer fetched): only these
    /// are exported.
    assigned: Mutex<BTreeSet<i32>>,
    /// Woken with every note: with per-partition queues the main queue
    /// yields no messages, so a note is the only reason to look.
    noted: tokio::sync::Notify,
    /// `exactly_once`: a revoke aborts the open transaction instead of
    /// committing (an abort that fails has the producer replaced).
    txn: Option<Arc<Transactions>>,
    /// Rate limits of the client's error and log lines.
    noise: Mutex<crate::kafka::refusal::Refusals>,
    log_throttle: crate::kafka::refusal::LogThrottle,
}

impl Context {
    pub fn new(topic: &str, offsets: Offsets, txn: Option<Arc<Transactions>>) -> Context {
        Context {
            topic: topic.to_owned(),
            txn,
            offsets,
            notes: Mutex::new(Vec::new()),
            assigned: Mutex::new(BTreeSet::new()),
            noted: tokio::sync::Notify::new(),
            noise: Mutex::default(),
            log_throttle: Default::default(),
        }
    }

    /// Rebalance notes since the last call, oldest first.
    pub fn take_notes(&self) -> Vec<Assignment> {
        std::mem::take(&mut *self.notes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Resolves once a note was added since the last time it resolved.
    pub async fn noted(&self) {
        self.noted.notified().await
    }

    fn note(&self, a: Assignment) {
        self.notes.lock().unwrap_or_else(|p| p.into_inner()).push(a);
        self.noted.notify_one();
    }

    fn assigned(&self) -> std::sync::MutexGuard<'_, BTreeSet<i32>> {
        self.assigned.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn partitions(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements_for_topic(&self.topic)
            .iter()
            .map(|e| e.partition())
            .collect()
    }
}

impl ClientContext for Context {
    fn stats(&self, stats: Statistics) {
        if let Some(topic) = stats.topics.get(&self.topic) {
            let assigned = self.assigned();
            for (id, p) in &topic.partitions {
                if assigned.contains(id) && p.consumer_lag >= 0 {
                    metrics::consumer_lag(*id, p.consumer_lag);
                }
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        metrics::kafka_error(&error);
        // librdkafka reports every failed reconnect (dozens a second while
        // a broker refuses the handshake): one line per 10 s.
        let times = self
            .noise
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .quiet(tokio::time::Instant::now());
        if let Some(times) = times {
            tracing::warn!(error = %error, reason, times, "kafka client error");
        }
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.log_throttle.log(level, fac, log_message);
    }
}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let parts = self.partitions(tpl);
                let lost = consumer.assignment_lost();
                let commits = match &self.txn {
                    // Eager assignors revoke every partition: the open
                    // transaction is aborted and all resume from the
                    // committed offsets.
                    Some(txn) => {
                        txn.abort_on_revoke(&parts);
                        Vec::new()
                    }
                    None => commit::revoked(consumer, &self.offsets, &self.topic, &parts, lost),
                };
                {
                    let mut assigned = self.assigned();
                    for p in &parts {
                        self.offsets.close(*p);
                        assigned.remove(p);
                        // Another member reports it from now on; a stale
                        // value here would hold the group lag up.
                        metrics::consumer_lag_revoked(*p);
                    }
                }
                metrics::rebalance();
                tracing::info!(partitions = ?parts, lost, committed = ?commits, "partitions revoked");
                self.note(Assignment::Revoked(parts));
            }
            Rebalance::Assign(tpl) => {
                let parts = self.partitions(tpl);
                self.assigned().extend(parts.iter().copied());
                tracing::info!(partitions = ?parts, "partitions assigned");
                self.note(Assignment::Assigned(parts));
            }
            Rebalance::Error(e) => {
                metrics::kafka_error(e);
                tracing::warn!(error = %e, "rebalance error");
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(e) = result {
            commit::failed(&self.offsets, &self.topic, offsets, &e);
        }
    }
}

/// Builds the librdkafka consumer configuration: the user's pass-through
/// first, then the settings the guarantees depend on.
pub fn consumer_config(k: &KafkaSettings) -> ClientConfig {
    let mut c = ClientConfig::new();
    // The pipeline reads each partition from its own queue, where these
    // bounds apply per partition, whatever the lag: a fetch is skipped while
    // 1,000 messages or 1 MiB of payload are queued, and one fetch brings at
    // most 256 KiB. (queued.min.messages defaults to 100,000 per partition:
    // a backlog of 200,000 events was prefetched whole, 250 MiB of RSS.)
    //
    // Fetches: the broker answers when 64 KiB are ready or after 10 ms. With
    // librdkafka's defaults (1 byte, 500 ms) a steady stream of a few
    // thousand events/s became thousands of tiny fetches a second, whose
    // cost on the broker queued every client: in the benchmark's latency run
    // at 6,000 events/s the broker's CPU share fell from 0.53 to 0.42 of a
    // core and the event-to-outcome p50 from ~400 ms to ~20 ms. At most 10 ms
    // is added to an event that arrives alone.
    c.set("queued.min.messages", "1000")
        .set("queued.max.messages.kbytes", "1024")
        .set("max.partition.fetch.bytes", "262144")
        .set("fetch.min.bytes", "65536")
        .set("fetch.wait.max.ms", "10")
        .set("statistics.interval.ms", "5000");
    for (key, value) in &k.consumer {
        c.set(key, value);
    }
    c.set("bootstrap.servers", &k.brokers)
        .set("group.id", &k.group_id)
        // Offsets are committed by the pipeline only: watermarks, on a timer,
        // on revoke and at shutdown (exactly_once: in the transactions).
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false");
    if !k.group_instance_id.is_empty() {
        c.set("group.instance.id", &k.group_instance_id);
    }
    c
}

pub type GroupConsumer = StreamConsumer<Context>;

pub fn create(
    k: &KafkaSettings,
    offsets: Offsets,
    txn: Option<Arc<Transactions>>,
) -> KafkaResult<GroupConsumer> {
    consumer_config(k).create_with_context(Context::new(&k.input_topic, offsets, txn))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_commit_cannot_be_turned_on() {
        let mut k = crate::config::Settings::load_from_env(None, &[], Vec::new())
            .unwrap()
            .kafka;
        k.consumer
            .insert("enable.auto.commit".into(), "true".into());
        k.consumer
            .insert("session.timeout.ms".into(), "7000".into());
        let c = consumer_config(&k);
        assert_eq!(c.get("enable.auto.commit"), Some("false"));
        assert_eq!(c.get("session.timeout.ms"), Some("7000"));
        assert_eq!(c.get("group.id"), Some("deductor"));
    }
}
