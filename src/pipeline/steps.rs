//! The order of the steps for one event: parse, decide and apply in Redis,
//! publish the outcome or dead letter, record it. Retries wait out outages;
//! a revoke or shutdown cancels the wait (the event is redelivered).

use rdkafka::message::{Message, OwnedMessage};
use tokio_util::sync::CancellationToken;

use crate::domain::event::{Event, InvalidEvent};
use crate::domain::outcome::{self, Outcome, Source};
use crate::kafka::publisher::{DeadLetter, Publisher, Trace};
use crate::ledger::Ledger;
use crate::metrics;
use crate::retry::{retry, RetryError, RetryPolicy};
use crate::telemetry::{EventTracer, Sample, Sampler};

/// Logs a per-event warning unless its kind is over its budget this second
/// (see [`Sampler`]); with the count of those left out before it.
macro_rules! sampled_warn {
    ($sampler:expr, $kind:expr, $($rest:tt)+) => {
        if let Sample::Log { suppressed } = $sampler.check($kind, std::time::Instant::now()) {
            tracing::warn!(suppressed_before = suppressed, $($rest)+);
        }
    };
}

/// Why an event did not complete.
pub(super) enum Failure {
    /// Shutdown or revoke while it waited to retry: it stays uncommitted and
    /// is redelivered.
    Cancelled,
    /// The service cannot go on.
    Fatal(anyhow::Error),
}

/// Everything one event needs, shared by the lanes.
pub(super) struct Processor {
    pub(super) ledger: Ledger,
    pub(super) publisher: Publisher,
    pub(super) policy: RetryPolicy,
    pub(super) topic: String,
    pub(super) tracer: EventTracer,
    /// `kafka.propagate_headers`.
    pub(super) propagate: Vec<String>,
    /// Per-event warnings, sampled per kind.
    pub(super) warnings: Sampler,
}

impl Processor {
    pub(super) async fn handle(
        &self,
        msg: &OwnedMessage,
        parsed: &Result<Event, InvalidEvent>,
        trace: Trace<'_>,
        stop: &CancellationToken,
    ) -> Result<(), Failure> {
        let source = Source {
            topic: self.topic.clone(),
            partition: msg.partition(),
            offset: msg.offset(),
        };
        let outcome = match parsed {
            Err(invalid) => {
                let kind = invalid.kind.as_str();
                sampled_warn!(self.warnings, kind, kind, reason = %invalid.detail, "invalid event: dead-lettered");
                let dl = DeadLetter {
                    key: msg.key(),
                    payload: msg.payload(),
                    error: invalid,
                    source: &source,
                    timestamp_ms: msg.timestamp().to_millis(),
                    trace,
                };
                let sent = std::time::Instant::now();
                self.kafka(stop, || self.publisher.send_dead_letter(&dl))
                    .await?;
                metrics::stage("publish", sent.elapsed().as_secs_f64());
                metrics::dead_letter(invalid.kind.as_str());
                match outcome::invalid(invalid, &source, &now()) {
                    Some(o) => o,
                    None => {
                        metrics::event("invalid", "dead_letter");
                        metrics::end_to_end(msg.timestamp().to_millis());
                        return Ok(());
                    }
                }
            }
            Ok(Event::Placed(e)) => {
                let called = std::time::Instant::now();
                let d = self.redis(stop, || self.ledger.place(e)).await?;
                metrics::stage("redis", called.elapsed().as_secs_f64());
                outcome::placed(e, &d, &source, &now())
            }
            Ok(Event::Refunded(e)) => {
                let called = std::time::Instant::now();
                let d = self.redis(stop, || self.ledger.refund(e)).await?;
                metrics::stage("redis", called.elapsed().as_secs_f64());
                outcome::refunded(e, &d, &source, &now())
            }
        };
        let sent = std::time::Instant::now();
        self.kafka(stop, || self.publisher.send_outcome(&outcome, &trace))
            .await?;
        metrics::stage("publish", sent.elapsed().as_secs_f64());
        metrics::end_to_end(msg.timestamp().to_millis());
        record(parsed, &outcome);
        Ok(())
    }

    pub(super) async fn redis<T, F, Fut>(
        &self,
        stop: &CancellationToken,
        op: F,
    ) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, crate::ledger::LedgerError>>,
    {
        retry(
            &self.policy,
            stop,
            |e: &crate::ledger::LedgerError| e.disposition(),
            |e, delay| {
                metrics::retry("redis");
                sampled_warn!(self.warnings, "redis_retry", kind = "redis_retry", error = %e, class = %e.class(), retry_in_ms = delay.as_millis() as u64, "redis step failed; retrying");
            },
            op,
        )
        .await
        .map_err(|e| match e {
            RetryError::Cancelled(_) => Failure::Cancelled,
            RetryError::Permanent(e) => Failure::Fatal(anyhow::Error::new(e).context("redis")),
        })
    }

    pub(super) async fn kafka<F, Fut>(&self, stop: &CancellationToken, op: F) -> Result<(), Failure>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), crate::kafka::publisher::PublishError>>,
    {
        retry(
            &self.policy,
            stop,
            |e: &crate::kafka::publisher::PublishError| e.disposition(),
            |e, delay| {
                metrics::retry("kafka");
                sampled_warn!(self.warnings, "kafka_retry", kind = "kafka_retry", error = %e, retry_in_ms = delay.as_millis() as u64, "kafka produce failed; retrying");
            },
            op,
        )
        .await
        .map_err(|e| match e {
            RetryError::Cancelled(_) => Failure::Cancelled,
            // exactly_once: its transaction was aborted; redone after the rewind.
            RetryError::Permanent(e) if e.stale => Failure::Cancelled,
            RetryError::Permanent(e) => Failure::Fatal(anyhow::Error::new(e)),
        })
    }
}

pub(super) fn record(parsed: &Result<Event, InvalidEvent>, o: &Outcome) {
    let event_type = match parsed {
        Ok(e) => e.event_type().as_str(),
        Err(_) => "invalid",
    };
    let label = match o.reason {
        Some(r) => r.as_str(),
        None => o.kind.as_str(),
    };
    metrics::event(event_type, label);
}

pub(super) fn now() -> String {
    outcome::timestamp(chrono::Utc::now())
}
