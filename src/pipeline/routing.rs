//! Partition routing: each partition's own librdkafka queue, the pulls
//! that feed a lane only when it has room, the stash for partitions read
//! from the main queue, and the rebalance notes that start and stop lanes.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use futures::stream::FuturesUnordered;
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaResult;
use rdkafka::message::OwnedMessage;
use rdkafka::TopicPartitionList;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::fetch_turns::{FetchTurns, Plan};
use super::lane::{LaneHandle, Spawner};
use crate::error::Disposition;
use crate::kafka::consumer::{self as group, Assignment, GroupConsumer};
use crate::metrics;
use crate::ops::health::Status;

pub(super) type PartitionQueue = StreamPartitionQueue<group::Context>;

/// Gives every partition of `topic` its own librdkafka queue (before the
/// first poll of the main queue). A lane then pulls its partition only
/// when it has room: a full lane holds back its own partition and nothing
/// else, with no pause/resume, which drops librdkafka's prefetch on every
/// cycle (at full lag that was a refetch per lane-full of events, and
/// partitions stalled). The prefetch stays bounded per partition
/// (`queued.max.messages.kbytes`). Partitions added later, or a topic that
/// does not exist yet, go through the main queue and the stash instead.
pub(super) fn split_queues(
    consumer: &Arc<GroupConsumer>,
    topic: &str,
) -> HashMap<i32, Arc<PartitionQueue>> {
    let metadata = match consumer.fetch_metadata(Some(topic), Duration::from_secs(10)) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, topic, "no metadata: partitions are read through the main queue");
            return HashMap::new();
        }
    };
    metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions())
        .filter_map(|p| {
            let q = consumer.split_partition_queue(topic, p.id())?;
            Some((p.id(), Arc::new(q)))
        })
        .collect()
}

/// The input topic's partition count, for sharing the prefetch budget
/// among them before the group consumer is created (its bounds are fixed
/// then). Read by a short-lived client of the consumer's configuration
/// that joins no group; `None` (today's per-partition bounds, with a
/// warning) when the topic does not exist yet or the metadata cannot be
/// read.
pub(super) async fn partition_count(k: &crate::config::KafkaSettings) -> Option<usize> {
    let (mut config, topic) = (group::consumer_config(k, None), k.input_topic.clone());
    config.set("statistics.interval.ms", "0");
    let read = tokio::task::spawn_blocking(move || -> KafkaResult<usize> {
        let probe: rdkafka::consumer::BaseConsumer<Quiet> = config.create_with_context(Quiet)?;
        let metadata = probe.fetch_metadata(Some(&topic), Duration::from_secs(5))?;
        Ok(metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .map(|t| t.partitions().len())
            .sum())
    })
    .await;
    match read {
        Ok(Ok(n)) if n > 0 => Some(n),
        Ok(Ok(_)) => {
            tracing::warn!(topic = %k.input_topic, "the input topic has no partitions yet: each partition gets \
                1 MiB of prefetch, outside kafka.prefetch_budget_kib, until the service restarts");
            None
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, topic = %k.input_topic, "no metadata for the prefetch budget: each \
                partition gets 1 MiB of prefetch, outside kafka.prefetch_budget_kib");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "the metadata read for the prefetch budget failed");
            None
        }
    }
}

/// The metadata probe's context: its failures (a broker down, a refused
/// handshake: dozens a second) are the group consumer's to report, with
/// its rate limits; the probe reports only its result.
struct Quiet;

impl rdkafka::client::ClientContext for Quiet {
    fn log(&self, _: rdkafka::config::RDKafkaLogLevel, _: &str, _: &str) {}
    fn error(&self, _: rdkafka::error::KafkaError, _: &str) {}
}

impl rdkafka::consumer::ConsumerContext for Quiet {}

/// A message taken from a partition's own queue, with room for it already
/// reserved in the lane `lane`; `None` when that lane stopped first.
pub(super) struct Pulled {
    pub(super) partition: i32,
    pub(super) lane: u64,
    pub(super) taken: Option<(mpsc::OwnedPermit<OwnedMessage>, KafkaResult<OwnedMessage>)>,
}

/// Waits for room in the lane, then for the partition's next message. Only
/// the main loop hands pulled messages over (after applying rebalance
/// notes), and at most one pull per partition is armed, so messages reach
/// the lane in offset order.
pub(super) fn pull(
    partition: i32,
    lane: &LaneHandle,
    queue: Arc<PartitionQueue>,
) -> BoxFuture<'static, Pulled> {
    let (id, tx, stop) = (lane.id, lane.tx.clone(), lane.stop.clone());
    async move {
        let permit = tokio::select! {
            biased;
            _ = stop.cancelled() => None,
            permit = tx.reserve_owned() => permit.ok(),
        };
        let taken = match permit {
            None => None,
            Some(permit) => tokio::select! {
                biased;
                _ = stop.cancelled() => None,
                m = queue.recv() => Some((permit, m.map(|m| m.detach()))),
            },
        };
        Pulled {
            partition,
            lane: id,
            taken,
        }
    }
    .boxed()
}

/// The main loop's lanes, their partition queues and the armed pulls.
pub(super) struct Lanes {
    pub(super) by_partition: HashMap<i32, LaneHandle>,
    /// Revoked lanes still finishing their in-flight events.
    pub(super) retiring: HashMap<i32, JoinHandle<()>>,
    pub(super) queues: HashMap<i32, Arc<PartitionQueue>>,
    /// Which of the partitions with their own queue fetch now, within
    /// `kafka.prefetch_budget_kib`.
    pub(super) turns: FetchTurns,
    pub(super) pulls: FuturesUnordered<BoxFuture<'static, Pulled>>,
    pub(super) spawner: Spawner,
}

impl Lanes {
    /// The lane of `p`, started if there is none; a partition with its own
    /// queue gets its pull armed.
    pub(super) fn get_or_spawn(&mut self, p: i32) -> &mut LaneHandle {
        let lane = match self.by_partition.entry(p) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(self.spawner.spawn(p, self.retiring.remove(&p)))
            }
        };
        if !lane.pulling {
            if let Some(q) = self.queues.get(&p) {
                lane.pulling = true;
                self.pulls.push(pull(p, lane, q.clone()));
            }
        }
        lane
    }

    /// Retires the lanes of revoked partitions and starts the lanes of
    /// assigned ones, before the next message is handled.
    pub(super) fn apply_notes(&mut self, consumer: &GroupConsumer, topic: &str, status: &Status) {
        for note in consumer.context().take_notes() {
            match note {
                Assignment::Revoked(parts) => {
                    self.turns.revoked(&parts);
                    for p in parts {
                        if let Some(lane) = self.by_partition.remove(&p) {
                            // Also resolves the lane's pull without taking
                            // a message.
                            lane.stop.cancel();
                            self.retiring.insert(p, lane.join);
                        }
                    }
                    status.assigned.store(0, Ordering::Relaxed);
                    metrics::assigned(0);
                }
                Assignment::Assigned(parts) => {
                    // A partition paused by a full lane before a revoke must not
                    // come back paused: its new lane starts empty.
                    let mut list = TopicPartitionList::new();
                    for p in &parts {
                        list.add_partition(topic, *p);
                    }
                    if let Err(e) = consumer.resume(&list) {
                        tracing::debug!(error = %e, "resume on assign");
                    }
                    for p in &parts {
                        if self.queues.contains_key(p) {
                            self.get_or_spawn(*p);
                        }
                    }
                    // Partitions read through the main queue are paused
                    // and resumed by their lanes' stash instead.
                    let own: Vec<i32> = parts
                        .iter()
                        .copied()
                        .filter(|p| self.queues.contains_key(p))
                        .collect();
                    let plan = self.turns.assigned(&own);
                    apply_turns(consumer, topic, &plan, self.turns.paused());
                    status.assigned.store(parts.len(), Ordering::Relaxed);
                    metrics::assigned(parts.len());
                }
            }
        }
        self.retiring.retain(|_, j| !j.is_finished());
        if let Some(mut samples) = consumer.context().take_queues() {
            samples.retain(|p, _| self.queues.contains_key(p));
            let plan = self.turns.observe(&samples);
            apply_turns(consumer, topic, &plan, self.turns.paused());
        }
    }

    /// Hands a pulled message to its lane and arms the next pull. A message
    /// pulled for a lane that has since been replaced goes to the current
    /// lane (its stash keeps the order). It is the first message of the new
    /// assignment, at the committed offset, never one fetched before the
    /// revoke: the take and this hand-over have no await between them, so
    /// it was taken after the revoke callback, whose unassign bumps the
    /// partition's version barrier before it returns, and librdkafka drops
    /// every message fetched before when it is popped
    /// (tests/it/service/handover.rs). Except in `exactly_once` mode: the
    /// new lane starts from the committed offset, at or before it, and
    /// must not see it twice. For a revoked partition it is dropped,
    /// uncommitted, and redelivered to the next owner.
    pub(super) fn hand_over(
        &mut self,
        consumer: &GroupConsumer,
        topic: &str,
        pulled: Pulled,
    ) -> KafkaResult<()> {
        let Pulled {
            partition: p,
            lane: id,
            taken,
        } = pulled;
        let Some(lane) = self.by_partition.get_mut(&p) else {
            return Ok(());
        };
        let current = lane.id == id;
        if current {
            lane.pulling = false;
        }
        let Some((permit, msg)) = taken else {
            return Ok(());
        };
        let result = match msg {
            Ok(m) if current && lane.stash.is_empty() => {
                permit.send(m);
                Ok(())
            }
            Ok(_) if !current && self.spawner.txn.is_some() => {
                drop(permit);
                Ok(())
            }
            Ok(m) => {
                drop(permit);
                dispatch(consumer, topic, p, lane, m);
                Ok(())
            }
            Err(e) => Err(e),
        };
        if current {
            self.get_or_spawn(p);
        }
        result
    }
}

/// Pauses and resumes partitions for their fetch turns. A pause drops the
/// partition's queue; librdkafka fetches again from the position the
/// pipeline took up to.
fn apply_turns(consumer: &GroupConsumer, topic: &str, plan: &Plan, paused: usize) {
    if plan.is_empty() {
        return;
    }
    if !plan.pause.is_empty() {
        if let Err(e) = consumer.pause(&partition_list(topic, &plan.pause)) {
            tracing::warn!(error = %e, partitions = ?plan.pause, "pause for the prefetch budget failed");
        }
    }
    if !plan.resume.is_empty() {
        if let Err(e) = consumer.resume(&partition_list(topic, &plan.resume)) {
            tracing::warn!(error = %e, partitions = ?plan.resume, "resume for the prefetch budget failed");
        }
    }
    metrics::fetch_turns(plan.pause.len(), plan.dropped, paused);
    tracing::debug!(paused = ?plan.pause, resumed = ?plan.resume, dropped = plan.dropped, waiting = paused,
        "fetch turns within kafka.prefetch_budget_kib");
}

/// A consumer error: logged and counted; `Some` when the service cannot go on.
/// A refused TLS handshake is retried by librdkafka by itself: logged at
/// most every 10 s, and fatal once refusals persist (`refusals`).
pub(super) fn consumer_error(
    e: rdkafka::error::KafkaError,
    refusals: &mut crate::kafka::refusal::Refusals,
) -> Option<anyhow::Error> {
    metrics::kafka_error(&e);
    if crate::kafka::refused(&e) && crate::kafka::publisher::classify(&e) != Disposition::Fatal {
        let code = e
            .rdkafka_error_code()
            .unwrap_or(rdkafka::types::RDKafkaErrorCode::SSL);
        let v = refusals.refused(tokio::time::Instant::now(), code);
        if v.persistent {
            return Some(refused_for_good(e));
        }
        if let Some(times) = v.log {
            tracing::warn!(error = %e, times, "kafka consumer refused; librdkafka retries, the service stops if it persists");
        }
        return None;
    }
    if crate::kafka::unreachable(&e) && crate::kafka::publisher::classify(&e) != Disposition::Fatal
    {
        // Right after a refusal, the connection failures that follow are
        // that refusal repeated (librdkafka reports it once).
        let v = refusals.continued(tokio::time::Instant::now());
        if v.persistent {
            let refusal = rdkafka::error::KafkaError::MessageConsumption(refusals.code());
            return Some(refused_for_good(refusal));
        }
        if let Some(times) = v.log {
            tracing::warn!(error = %e, times, "kafka consumer error; librdkafka reconnects by itself");
        }
        return None;
    }
    match crate::kafka::publisher::classify(&e) {
        Disposition::Fatal => Some(anyhow::Error::new(e).context("kafka consumer")),
        _ => {
            if let Some(times) = refusals.quiet(tokio::time::Instant::now()) {
                tracing::warn!(error = %e, times, "kafka consumer error; librdkafka reconnects by itself");
            }
            None
        }
    }
}

/// The error `run` stops with once refusals persisted.
fn refused_for_good(refusal: rdkafka::error::KafkaError) -> anyhow::Error {
    anyhow::Error::new(refusal).context(format!(
        "kafka consumer: the brokers kept refusing the connection for {}s",
        crate::kafka::refusal::REFUSAL_BOUND.as_secs()
    ))
}

pub(super) fn partition_list(topic: &str, parts: &[i32]) -> TopicPartitionList {
    let mut l = TopicPartitionList::new();
    for p in parts {
        l.add_partition(topic, *p);
    }
    l
}

/// Hands a message to its lane; when the lane is full the message is kept
/// and the partition paused, so the loop keeps polling (rebalances, other
/// partitions) while memory stays bounded.
pub(super) fn dispatch(
    consumer: &GroupConsumer,
    topic: &str,
    p: i32,
    lane: &mut LaneHandle,
    m: OwnedMessage,
) {
    if !lane.stash.is_empty() {
        lane.stash.push_back(m);
        return;
    }
    match lane.tx.try_send(m) {
        Ok(()) => {}
        Err(mpsc::error::TrySendError::Full(m)) => {
            lane.stash.push_back(m);
            if let Err(e) = consumer.pause(&partition_list(topic, &[p])) {
                tracing::warn!(error = %e, partition = p, "pause failed");
            }
        }
        Err(mpsc::error::TrySendError::Closed(_)) => {
            // The lane stopped (fatal or shutdown); the message stays
            // uncommitted and is redelivered.
        }
    }
}

/// Hands the stash on; once it is empty the partition is resumed, unless it
/// waits for its fetch turn (`turn_paused`), which resumes it in turn.
pub(super) fn flush_stash(
    consumer: &GroupConsumer,
    topic: &str,
    p: i32,
    lane: &mut LaneHandle,
    turn_paused: bool,
) {
    if lane.stash.is_empty() {
        return;
    }
    while let Some(m) = lane.stash.pop_front() {
        match lane.tx.try_send(m) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(m)) => {
                lane.stash.push_front(m);
                return;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                lane.stash.clear();
                return;
            }
        }
    }
    if turn_paused {
        return;
    }
    if let Err(e) = consumer.resume(&partition_list(topic, &[p])) {
        tracing::warn!(error = %e, partition = p, "resume failed");
    }
}
