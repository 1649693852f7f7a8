//! Exponential backoff around retryable errors, stopping on shutdown.
//!
//! The only user of the `backoff` crate (flagged unmaintained,
//! RUSTSEC-2025-0012): swap the schedule here and nowhere else.

use std::future::Future;
use std::time::Duration;

use backoff::backoff::Backoff;
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

impl RetryPolicy {
    fn schedule(&self) -> backoff::ExponentialBackoff {
        backoff::ExponentialBackoff {
            current_interval: self.initial,
            initial_interval: self.initial,
            randomization_factor: 0.2,
            multiplier: self.multiplier,
            max_interval: self.max,
            max_elapsed_time: None,
            ..backoff::ExponentialBackoff::default()
        }
    }
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
        // max_elapsed_time is None, so the schedule never ends.
        let delay = schedule.next_backoff().unwrap_or(policy.max);
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
