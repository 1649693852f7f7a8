//! The end of a run: drain the lanes, end the transaction in progress and
//! the last one (or commit the watermarks), flush, leave the group, close
//! the pool. Every step is bounded, so that `deductor run` stops within
//! `pipeline.drain_timeout_secs` plus [`SHUTDOWN_BOUND`] whatever is down
//! (a broker outage, Redis down or frozen): a step that does not finish in
//! its time is abandoned and named; what it left uncommitted is redone by
//! the next owner of the partitions. Leaving the group and closing the
//! Redis pool are the two steps cut short with a warning only: they leave
//! nothing uncommitted.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::routing::Lanes;
use crate::config::{Settings, SHUTDOWN_BOUND};
use crate::kafka::commit;
use crate::kafka::consumer::GroupConsumer;
use crate::kafka::offsets::Offsets;
use crate::kafka::publisher::Publisher;
use crate::kafka::transaction::{Boundary, Transactions};
use crate::ledger::Ledger;
use crate::telemetry::EventTracer;

/// What the run holds when its loop ends.
pub(super) struct Held {
    pub(super) lanes: Lanes,
    pub(super) boundary: Option<JoinHandle<KafkaResult<Boundary>>>,
    pub(super) txn: Option<Arc<Transactions>>,
    pub(super) consumer: Arc<GroupConsumer>,
    pub(super) offsets: Offsets,
    pub(super) publisher: Publisher,
    pub(super) tracer: EventTracer,
    pub(super) ledger: Ledger,
}

/// Stops the run; returns the steps that were abandoned (each already
/// logged as an error), empty when everything finished.
pub(super) async fn wind_down(h: Held, settings: &Settings) -> Vec<&'static str> {
    let Held {
        mut lanes,
        boundary,
        txn,
        consumer,
        offsets,
        publisher,
        tracer,
        ledger,
    } = h;
    let mut abandoned = Vec::new();
    let drain = settings.drain_timeout();
    let started = Instant::now();
    // Every step after the drain ends by then, a few seconds before the
    // bound (which `deductor run`'s watchdog enforces).
    let deadline = started + drain + SHUTDOWN_BOUND - Duration::from_secs(3);
    if let Some(t) = &txn {
        // No transaction call is retried past this, nor a producer renewed.
        t.stop_by((started + drain + Duration::from_secs(4)).into_std());
    }
    tracing::info!(
        in_flight = offsets.in_flight(),
        drain_timeout_s = drain.as_secs(),
        "draining"
    );
    let mut joins = Vec::new();
    for (_, lane) in lanes.by_partition.drain() {
        lane.stop.cancel();
        drop(lane.tx);
        joins.push(lane.join);
    }
    joins.extend(lanes.retiring.drain().map(|(_, j)| j));
    // The partition queues hold the consumer: release them before it closes.
    drop(lanes);
    if tokio::time::timeout(drain, futures::future::join_all(joins))
        .await
        .is_err()
    {
        tracing::warn!(
            in_flight = offsets.in_flight(),
            "drain timeout: unfinished events stay uncommitted and are redelivered"
        );
    }
    let mut boundary_done = true;
    if let Some(b) = boundary {
        let until = started + drain + Duration::from_secs(5);
        if tokio::time::timeout_at(until, b).await.is_err() {
            boundary_done = false;
            abandon(&mut abandoned, "the transaction boundary in progress");
        }
    }
    let step = |cap: u64| (Instant::now() + Duration::from_secs(cap)).min(deadline);
    match &txn {
        // The last transaction: committed when every started event
        // finished, else aborted (the next owner redoes its events). A
        // boundary stuck in librdkafka holds the producer's lock: then it
        // is not tried.
        Some(t) if boundary_done => {
            let (t, metadata) = (
                t.clone(),
                crate::kafka::membership::fenceable_metadata(&consumer),
            );
            let limit = Duration::from_secs(3);
            let last = tokio::task::spawn_blocking(move || t.finish(metadata, limit));
            if tokio::time::timeout_at(step(4), last).await.is_err() {
                abandon(&mut abandoned, "the last transaction");
            }
        }
        Some(_) => abandon(&mut abandoned, "the last transaction"),
        None => {
            let (c, o, topic) = (
                consumer.clone(),
                offsets.clone(),
                settings.kafka.input_topic.clone(),
            );
            let last = tokio::task::spawn_blocking(move || {
                commit::watermarks(&*c, &o, &topic, CommitMode::Sync)
            });
            if tokio::time::timeout_at(step(3), last).await.is_err() {
                abandon(&mut abandoned, "the last offset commit");
            }
        }
    }
    let p = publisher.clone();
    let flush = tokio::task::spawn_blocking(move || p.flush(Duration::from_secs(2)));
    match tokio::time::timeout_at(step(3), flush).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "producer flush at shutdown"),
        Ok(_) => {}
        Err(_) => abandon(&mut abandoned, "the producer's flush"),
    }
    // The exporter's thread blocks on its last export: off the runtime.
    let export = tokio::task::spawn_blocking(move || tracer.shutdown());
    if tokio::time::timeout_at(step(2), export).await.is_err() {
        abandon(&mut abandoned, "the last span export");
    }
    // Leaving the group and closing the consumer wait on the broker.
    let close = tokio::task::spawn_blocking(move || {
        consumer.unsubscribe();
        drop(consumer);
    });
    // Not unfinished work: the offsets were committed (or their step was
    // named above), so a leave cut short only delays the group's next
    // rebalance, until the broker's session timeout. A member still joining
    // (the group waiting out a dead member) cannot leave before its join
    // ends.
    if tokio::time::timeout_at(step(3), close).await.is_err() {
        tracing::warn!(
            "shutdown: leaving the consumer group did not finish in time (a join in progress, \
             or the broker gone); the group reassigns the partitions after session.timeout.ms"
        );
    }
    // Not unfinished work either: every step that commits is behind us. A
    // pool reconnecting to a Redis that is cut off can take longer to quit
    // than its time (the chaos suite's every-fault run once met it): the
    // process exits anyway, which closes the connections.
    if tokio::time::timeout_at(step(2), ledger.quit())
        .await
        .is_err()
    {
        tracing::warn!(
            "shutdown: closing the Redis pool did not finish in time (Redis unreachable or \
             reconnecting); its connections close with the process"
        );
    }
    abandoned
}

fn abandon(list: &mut Vec<&'static str>, what: &'static str) {
    tracing::error!(
        step = what,
        "shutdown: {what} did not finish in time and was abandoned; \
         nothing is lost: what it left uncommitted is redone by the next owner"
    );
    list.push(what);
}
