//! The consumer group: configuration, rebalance callbacks, statistics.
//!
//! Rebalance callbacks run inside `recv()` on the pipeline's task. On a
//! revoke they commit the watermarks of the revoked partitions synchronously
//! ([`commit::revoked`]: never past an unacknowledged event, G5), forget
//! them, and queue a note for the pipeline, which retires those partitions'
//! lanes before it handles the next message.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// The prefetch budget and the partition count it was shared among.
    prefetch: PrefetchBudget,
    /// The prefetch warnings already given: over the budget; more
    /// partitions held than the budget was shared among.
    warned_over: AtomicBool,
    warned_grown: AtomicBool,
    /// The latest statistics of the partitions held, for the pipeline's
    /// fetch turns (`pipeline::fetch_turns`); taken with [`Context::take_queues`].
    queues: Mutex<Option<BTreeMap<i32, QueueSample>>>,
}

/// One held partition's librdkafka queue in a statistics report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSample {
    /// Bytes in its queue (`fetchq_size`).
    pub queued: u64,
    /// More records on the broker than fetched (`hi_offset` beyond
    /// `next_offset`); `None` while either is not known.
    pub behind: Option<bool>,
}

/// `kafka.prefetch_budget_kib` and the partitions it was shared among.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrefetchBudget {
    pub budget_kib: u64,
    /// The input topic's partition count at start; `None` when unknown.
    pub partitions: Option<usize>,
}

/// The smallest `kafka.prefetch_budget_kib` accepted.
pub const MIN_PREFETCH_BUDGET_KIB: u64 = 64;
/// Today's per-partition bounds, the most one partition gets: 1 MiB
/// queued (`queued.max.messages.kbytes`) and one fetch of 256 KiB
/// (`max.partition.fetch.bytes`) on top.
const MAX_QUEUED_KIB: u64 = 1024;
const MAX_FETCH_KIB: u64 = 256;
/// The least one partition gets, whatever the budget.
const MIN_QUEUED_KIB: u64 = 16;
const MIN_FETCH_KIB: u64 = 4;

/// One partition's share of the prefetch budget, as librdkafka's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchShare {
    /// `queued.max.messages.kbytes`: a partition's fetch is skipped while
    /// this much waits in its queue.
    pub queued_kib: u64,
    /// `max.partition.fetch.bytes` in KiB: what one fetch may add to it.
    pub fetch_kib: u64,
}

/// Shares `budget_kib` among `partitions` (the input topic's partition
/// count: the most one pod can be assigned). A partition's worst case is
/// its queue bound plus one fetch, so each gets four fifths of its share
/// as queue and one fifth as fetch, within today's bounds (1 MiB + 256 KiB,
/// which a budget of 16 MiB still gives up to 12 partitions). Unknown
/// partitions (the topic does not exist yet) get today's bounds.
///
/// One floor stays outside any budget: a broker returns a partition's first
/// record batch whole even when it is larger than the fetch size (KIP-74),
/// so a partition holds at least one of its producers' batches. One fetch
/// request over all partitions (`fetch.max.bytes`) is left to librdkafka,
/// which keeps it within `queued.max.messages.kbytes` and at least
/// `message.max.bytes`.
pub fn prefetch_share(budget_kib: u64, partitions: Option<usize>) -> PrefetchShare {
    let Some(n) = partitions.filter(|&n| n > 0) else {
        return PrefetchShare {
            queued_kib: MAX_QUEUED_KIB,
            fetch_kib: MAX_FETCH_KIB,
        };
    };
    let per = budget_kib / n as u64;
    PrefetchShare {
        queued_kib: (per * 4 / 5).clamp(MIN_QUEUED_KIB, MAX_QUEUED_KIB),
        fetch_kib: (per / 5).clamp(MIN_FETCH_KIB, MAX_FETCH_KIB),
    }
}

impl Context {
    pub fn new(
        topic: &str,
        offsets: Offsets,
        txn: Option<Arc<Transactions>>,
        prefetch: PrefetchBudget,
    ) -> Context {
        Context {
            prefetch,
            warned_over: AtomicBool::new(false),
            warned_grown: AtomicBool::new(false),
            queues: Mutex::new(None),
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

    /// The latest statistics report of the held partitions' queues, once.
    pub fn take_queues(&self) -> Option<BTreeMap<i32, QueueSample>> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner()).take()
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

    /// Warns once when the prefetch exceeds its budget: a partition holds
    /// at least one of its producers' record batches, whatever its share.
    fn over_budget(&self, queued: u64) {
        let budget = self.prefetch.budget_kib.saturating_mul(1024);
        if queued > budget && !self.warned_over.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                queued,
                budget,
                "the prefetch is over kafka.prefetch_budget_kib: a partition holds at least one record \
                 batch of its producers, whatever its share (lower the producers' batch.size, or raise \
                 the budget and the pod's memory limit)"
            );
        }
    }

    /// Warns once when more partitions are held than the budget was shared
    /// among (partitions added to the topic since the start).
    fn more_than_sized(&self, held: usize) {
        let Some(sized) = self.prefetch.partitions else {
            return;
        };
        if held > sized && !self.warned_grown.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                held,
                sized,
                "more partitions are held than kafka.prefetch_budget_kib was shared among at start \
                 (the topic grew): the prefetch can exceed the budget until the service restarts"
            );
        }
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
            let mut queued: u64 = 0;
            let mut samples = BTreeMap::new();
            for (id, p) in &topic.partitions {
                if assigned.contains(id) {
                    if p.consumer_lag >= 0 {
                        metrics::consumer_lag(*id, p.consumer_lag);
                    }
                    queued = queued.saturating_add(p.fetchq_size);
                    let behind = (p.hi_offset >= 0 && p.next_offset >= 0)
                        .then_some(p.hi_offset > p.next_offset);
                    samples.insert(
                        *id,
                        QueueSample {
                            queued: p.fetchq_size,
                            behind,
                        },
                    );
                }
            }
            drop(assigned);
            metrics::prefetch_bytes(queued);
            self.over_budget(queued);
            *self.queues.lock().unwrap_or_else(|p| p.into_inner()) = Some(samples);
            self.noted.notify_one();
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
                let held = {
                    let mut assigned = self.assigned();
                    assigned.extend(parts.iter().copied());
                    assigned.len()
                };
                self.more_than_sized(held);
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
pub fn consumer_config(k: &KafkaSettings, partitions: Option<usize>) -> ClientConfig {
    let mut c = ClientConfig::new();
    // The pipeline reads each partition from its own queue, where these
    // bounds apply per partition, whatever the lag: a fetch is skipped while
    // 1,000 messages or the partition's share of kafka.prefetch_budget_kib
    // are queued, and one fetch brings at most a fifth of that share (at
    // most 1 MiB and 256 KiB). (queued.min.messages defaults to 100,000 per
    // partition: a backlog of 200,000 events was prefetched whole, 250 MiB
    // of RSS; with a fixed 1 MiB per partition, 200 partitions held 242 MB.)
    //
    // Fetches: the broker answers when 64 KiB are ready or after 10 ms. With
    // librdkafka's defaults (1 byte, 500 ms) a steady stream of a few
    // thousand events/s became thousands of tiny fetches a second, whose
    // cost on the broker queued every client: in the benchmark's latency run
    // at 6,000 events/s the broker's CPU share fell from 0.53 to 0.42 of a
    // core and the event-to-outcome p50 from ~400 ms to ~20 ms. At most 10 ms
    // is added to an event that arrives alone.
    let share = prefetch_share(k.prefetch_budget_kib, partitions);
    c.set("queued.min.messages", "1000")
        .set("queued.max.messages.kbytes", share.queued_kib.to_string())
        .set(
            "max.partition.fetch.bytes",
            (share.fetch_kib * 1024).to_string(),
        )
        .set("fetch.min.bytes", "65536")
        .set("fetch.wait.max.ms", "10")
        .set("statistics.interval.ms", "1000");
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

/// The group consumer, its prefetch shared among `partitions` (the input
/// topic's partition count; `None` when unknown).
pub fn create(
    k: &KafkaSettings,
    offsets: Offsets,
    txn: Option<Arc<Transactions>>,
    partitions: Option<usize>,
) -> KafkaResult<GroupConsumer> {
    let prefetch = PrefetchBudget {
        budget_kib: k.prefetch_budget_kib,
        partitions,
    };
    consumer_config(k, partitions).create_with_context(Context::new(
        &k.input_topic,
        offsets,
        txn,
        prefetch,
    ))
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
        let c = consumer_config(&k, None);
        assert_eq!(c.get("enable.auto.commit"), Some("false"));
        assert_eq!(c.get("session.timeout.ms"), Some("7000"));
        assert_eq!(c.get("group.id"), Some("deductor"));
    }

    fn worst_case_kib(s: PrefetchShare, n: usize) -> u64 {
        (s.queued_kib + s.fetch_kib) * n as u64
    }

    #[test]
    fn the_budget_bounds_the_prefetch_over_every_partition_count() {
        for budget in [MIN_PREFETCH_BUDGET_KIB, 1024, 16_384, 65_536, 1_048_576] {
            for n in [1usize, 2, 6, 12, 13, 64, 200, 1000] {
                let s = prefetch_share(budget, Some(n));
                assert!(s.queued_kib <= MAX_QUEUED_KIB && s.fetch_kib <= MAX_FETCH_KIB);
                assert!(s.queued_kib >= MIN_QUEUED_KIB && s.fetch_kib >= MIN_FETCH_KIB);
                let floor = (MIN_QUEUED_KIB + MIN_FETCH_KIB) * n as u64;
                assert!(
                    worst_case_kib(s, n) <= budget.max(floor),
                    "budget {budget} KiB, {n} partitions: {s:?}"
                );
            }
        }
    }

    #[test]
    fn few_partitions_keep_todays_bounds_and_many_share_the_budget() {
        let s = prefetch_share(16_384, Some(12));
        assert_eq!((s.queued_kib, s.fetch_kib), (1024, 256));
        let s = prefetch_share(16_384, Some(200));
        assert_eq!((s.queued_kib, s.fetch_kib), (64, 16));
        assert_eq!(prefetch_share(16_384, None).queued_kib, MAX_QUEUED_KIB);
        let mut k = crate::config::Settings::load_from_env(None, &[], Vec::new())
            .unwrap()
            .kafka;
        let c = consumer_config(&k, Some(200));
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("64"));
        assert_eq!(c.get("max.partition.fetch.bytes"), Some("16384"));
        // A pass-through property is the operator's choice and wins.
        k.consumer
            .insert("queued.max.messages.kbytes".into(), "4096".into());
        let c = consumer_config(&k, Some(200));
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("4096"));
    }
}
