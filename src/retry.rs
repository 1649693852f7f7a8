//! Exponential backoff around retryable errors, stopping on shutdown.
//!
//! The only user of a backoff crate: `backon` (its exponential schedule)
//! replaced `backoff`, which is unmaintained (RUSTSEC-2025-0012) and pulled
//! in the unmaintained `instant` (RUSTSEC-2024-0384). Swap the schedule
//! here and nowhere else.

use std::future::Future;
use std::time::Duration;

use backon::BackoffBuilder;
use tokio_util::sync::CancellationToken;

use crate::config::RetrySettings;
use crate::error::Disposition;

/// The backoff schedule: exponential with jitter, capped, never giving up
/// by itself (a Redis or Kafka outage is waited out; shutdown ends it).
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max: Duration,
    pub multiplier: f64,
}

impl From<&RetrySettings> for RetryPolicy {
    fn from(s: &RetrySettings) -> RetryPolicy {
        RetryPolicy {
            initial: Duration::from_millis(s.initial_interval_ms),
            max: Duration::from_millis(s.max_interval_ms),
            multiplier: s.multiplier,
        }
    }
}

/// Each delay is the schedule's value times a random factor in
/// [1 - JITTER, 1 + JITTER], so that pods retrying after one outage do not
/// hit Redis or Kafka in step. (backon's own jitter only adds, up to twice
/// the delay: the spread the service always had is kept instead.)
const JITTER: f64 = 0.2;

impl RetryPolicy {
    /// The delays before each retry, without jitter: `initial`, then times
    /// `multiplier`, capped at `max`, never ending (a Redis or Kafka outage
    /// is waited out; shutdown ends it).
    fn schedule(&self) -> impl Iterator<Item = Duration> {
        backon::ExponentialBuilder::default()
            .with_min_delay(self.initial)
            .with_max_delay(self.max)
            .with_factor(self.multiplier as f32)
            .without_max_times()
            .build()
    }
}

/// `delay` scaled by a random factor in [1 - JITTER, 1 + JITTER].
fn jittered(delay: Duration) -> Duration {
    delay.mul_f64(1.0 - JITTER + 2.0 * JITTER * fastrand::f64())
}

/// Why [`retry`] returned without a success.
#[derive(Debug)]
pub enum RetryError<E> {
    /// The error is not retryable (its disposition is Reject or Fatal).
    Permanent(E),
    /// Shutdown was requested while waiting to retry; the last error.
    Cancelled(E),
}

impl<E> RetryError<E> {
    pub fn into_inner(self) -> E {
        match self {
            RetryError::Permanent(e) | RetryError::Cancelled(e) => e,
        }
    }
}

/// Runs `op` until it succeeds, retrying while `classify` says
/// [`Disposition::Retry`]. The first attempt always runs; no retry starts
/// after `stop` is cancelled. `on_retry` sees each retried error and the
/// delay before the next attempt (for logs and metrics).
pub async fn retry<T, E, F, Fut>(
    policy: &RetryPolicy,
    stop: &CancellationToken,
    classify: impl Fn(&E) -> Disposition,
    mut on_retry: impl FnMut(&E, Duration),
    mut op: F,
) -> Result<T, RetryError<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut schedule = policy.schedule();
    loop {
        let err = match op().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if classify(&err) != Disposition::Retry {
            return Err(RetryError::Permanent(err));
        }
        // Without max_times the schedule never ends.
        let delay = jittered(schedule.next().unwrap_or(policy.max));
        on_retry(&err, delay);
        tokio::select! {
            _ = stop.cancelled() => return Err(RetryError::Cancelled(err)),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[derive(Debug, PartialEq)]
    enum E {
        Transient,
        Fatal,
    }

    fn classify(e: &E) -> Disposition {
        match e {
            E::Transient => Disposition::Retry,
            E::Fatal => Disposition::Fatal,
        }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
            multiplier: 2.0,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_with_growing_capped_delays_until_success() {
        let calls = AtomicU32::new(0);
        let mut delays = Vec::new();
        let stop = CancellationToken::new();
        let started = tokio::time::Instant::now();
        let out = retry(
            &policy(),
            &stop,
            classify,
            |_, d| delays.push(d),
            || async {
                if calls.fetch_add(1, Ordering::SeqCst) < 7 {
                    Err(E::Transient)
                } else {
                    Ok(42)
                }
            },
        )
        .await;
        assert_eq!(out.unwrap(), 42);
        assert_eq!(calls.load(Ordering::SeqCst), 8);
        assert_eq!(delays.len(), 7);
        assert!(
            delays[0] >= Duration::from_millis(80) && delays[0] <= Duration::from_millis(120),
            "{delays:?}"
        );
        assert!(delays[3] > delays[0], "grows: {delays:?}");
        assert!(
            delays.iter().all(|d| *d <= Duration::from_millis(2400)),
            "capped (with jitter): {delays:?}"
        );
        // virtual time advanced by exactly the sum of the delays
        let slept: Duration = delays.iter().sum();
        assert!(
            started.elapsed() >= slept && started.elapsed() < slept + Duration::from_millis(20)
        );
    }

    #[test]
    fn schedule_grows_by_the_multiplier_to_the_cap_and_never_ends() {
        let ms: Vec<u128> = policy()
            .schedule()
            .take(1000)
            .map(|d| d.as_millis())
            .collect();
        assert_eq!(ms[..7], [100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(ms.len(), 1000, "the schedule never ends by itself");
        assert!(ms.iter().all(|&m| m <= 2000), "capped");
    }

    #[test]
    fn jitter_spreads_within_a_fifth() {
        let d = Duration::from_millis(1000);
        let samples: Vec<Duration> = (0..2000).map(|_| jittered(d)).collect();
        assert!(samples
            .iter()
            .all(|s| *s >= Duration::from_millis(800) && *s <= Duration::from_millis(1200)));
        let low = samples
            .iter()
            .filter(|s| **s < Duration::from_millis(900))
            .count();
        let high = samples
            .iter()
            .filter(|s| **s > Duration::from_millis(1100))
            .count();
        assert!(low > 100 && high > 100, "spread: {low} low, {high} high");
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_errors_are_not_retried() {
        let calls = AtomicU32::new(0);
        let stop = CancellationToken::new();
        let out: Result<(), _> = retry(
            &policy(),
            &stop,
            classify,
            |_, _| {},
            || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(E::Fatal)
            },
        )
        .await;
        assert!(matches!(out, Err(RetryError::Permanent(E::Fatal))));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_the_wait() {
        let stop = CancellationToken::new();
        let s2 = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            s2.cancel();
        });
        let out: Result<(), _> = retry(
            &policy(),
            &stop,
            classify,
            |_, _| {},
            || async { Err(E::Transient) },
        )
        .await;
        assert!(matches!(out, Err(RetryError::Cancelled(E::Transient))));
    }
}
