//! A wedged client (issue 25, item 3): the pool's calls keep timing out
//! while Redis answers a fresh connection. An outage (nodes unreachable) is
//! waited out, as always; a wedge is not an outage, and waiting does not
//! end it: a connection whose replies fell out of step, or a client task
//! stuck, stays so.
//!
//! Every script call's result is noted ([`Wedge::observe`]): a timeout
//! starts (or continues) a streak, any answer from Redis ends it. The
//! watchdog ([`watch`], run by the pipeline) looks once a second. When the
//! streak is older than [`suspect_after`], it opens a connection of its own
//! and sends `PING`:
//! - no answer: an outage; readiness says so and nothing else is done;
//! - an answer: a wedge. The pool reconnects every connection (fred's
//!   `force_reconnection`, which also re-reads a Cluster's slot map), once
//!   per streak. If the calls still time out [`LIVENESS_BOUND`] after that
//!   (or `http.stall_timeout_secs`, if shorter: the same "no progress"
//!   bound) while a fresh connection answers, `/healthz` fails so that Kubernetes
//!   restarts the pod (the in-flight events are redelivered; the scripts'
//!   idempotency absorbs them).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::{Builder, ClientLike};
use tokio_util::sync::CancellationToken;

use super::{ErrorClass, Ledger, LedgerError};
use crate::config::RedisSettings;
use crate::ops::health::Status;

/// How long the calls may keep failing after the pool was reconnected,
/// with the nodes answering, before liveness fails (at most; see
/// [`liveness_bound`]).
pub const LIVENESS_BOUND: Duration = Duration::from_secs(60);

/// [`LIVENESS_BOUND`], or the stall timeout of `/healthz` when shorter.
pub fn liveness_bound(stall_timeout: Duration) -> Duration {
    LIVENESS_BOUND
        .min(stall_timeout)
        .max(Duration::from_secs(1))
}

/// The streak of timeouts after which the watchdog probes: three command
/// timeouts, at least 5 s (one slow script is not a wedge).
pub fn suspect_after(command_timeout: Duration) -> Duration {
    (command_timeout * 3).max(Duration::from_secs(5))
}

/// The calls' recent results, shared by the ledger's clones.
#[derive(Debug)]
pub struct Wedge {
    origin: Instant,
    /// Milliseconds since `origin` (+1) of the first timeout since the last
    /// answer; 0: none.
    streak_from: AtomicU64,
    /// Milliseconds since `origin` (+1) of the pool's reconnection in this
    /// streak; 0: none yet.
    rebuilt_at: AtomicU64,
}

impl Default for Wedge {
    fn default() -> Self {
        Wedge {
            origin: Instant::now(),
            streak_from: AtomicU64::new(0),
            rebuilt_at: AtomicU64::new(0),
        }
    }
}

impl Wedge {
    fn now(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64 + 1
    }

    fn since(&self, mark: u64) -> Option<Duration> {
        (mark != 0).then(|| Duration::from_millis(self.now().saturating_sub(mark)))
    }

    /// Notes one call's result: a timeout starts or continues the streak;
    /// anything Redis answered (an error reply too) ends it. A failed
    /// connection says nothing either way.
    pub fn observe<T>(&self, result: &Result<T, LedgerError>) {
        match result {
            Ok(_) => self.answered(),
            Err(e) => match e.class() {
                ErrorClass::Timeout => {
                    let _ = self.streak_from.compare_exchange(
                        0,
                        self.now(),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                }
                ErrorClass::Connection => {}
                _ => self.answered(),
            },
        }
    }

    fn answered(&self) {
        self.streak_from.store(0, Ordering::Relaxed);
        self.rebuilt_at.store(0, Ordering::Relaxed);
    }

    /// How long the calls have been timing out with no answer between.
    pub fn timing_out_for(&self) -> Option<Duration> {
        self.since(self.streak_from.load(Ordering::Relaxed))
    }

    /// How long ago the pool was reconnected in this streak.
    pub fn rebuilt_for(&self) -> Option<Duration> {
        self.since(self.rebuilt_at.load(Ordering::Relaxed))
    }

    fn mark_rebuilt(&self) {
        self.rebuilt_at.store(self.now(), Ordering::Relaxed);
    }
}

/// What the watchdog concludes from one look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The calls answer (or time out for less than the suspicion bound).
    Fine,
    /// They time out and a fresh connection gets no answer either.
    Unreachable,
    /// They time out while a fresh connection answers: reconnect the pool.
    Reconnect,
    /// Reconnected, still wedged, within the bound: wait.
    Reconnected,
    /// Reconnected and still wedged past the liveness bound: fail liveness.
    Wedged,
}

/// The decision, from the streak, the reconnection and the probe's answer
/// (`probe` is only called when the streak is long enough).
pub async fn decide<F, Fut>(w: &Wedge, suspect: Duration, bound: Duration, probe: F) -> Verdict
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    match w.timing_out_for() {
        Some(streak) if streak >= suspect => {}
        _ => return Verdict::Fine,
    }
    if !probe().await {
        return Verdict::Unreachable;
    }
    match w.rebuilt_for() {
        None => Verdict::Reconnect,
        Some(d) if d >= bound => Verdict::Wedged,
        Some(_) => Verdict::Reconnected,
    }
}

/// Whether Redis answers `PING` on a connection of its own (a one-client
/// pool built from `settings`, closed after).
pub async fn fresh_ping(settings: &RedisSettings) -> bool {
    let Ok(config) = super::fred_config(settings) else {
        return false;
    };
    let bound = Duration::from_millis(settings.connect_timeout_ms.max(1)) * 2
        + Duration::from_millis(settings.command_timeout_ms.max(1));
    let Ok(client) = Builder::from_config(config)
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_millis(settings.connect_timeout_ms.max(1));
            c.max_command_attempts = 1;
        })
        .with_performance_config(|p| {
            p.default_command_timeout = Duration::from_millis(settings.command_timeout_ms.max(1));
        })
        .build()
    else {
        return false;
    };
    let answered = tokio::time::timeout(bound, async {
        client.init().await.is_ok() && client.ping::<String>(None).await.is_ok()
    })
    .await
    .unwrap_or(false);
    let _ = tokio::time::timeout(Duration::from_secs(1), client.quit()).await;
    answered
}

/// The watchdog: looks once a second until `shutdown`, acting on
/// [`decide`]'s verdict and saying it in `status`.
pub async fn watch(
    ledger: Ledger,
    settings: RedisSettings,
    stall_timeout: Duration,
    status: Arc<Status>,
    shutdown: CancellationToken,
) {
    let suspect = suspect_after(Duration::from_millis(settings.command_timeout_ms.max(1)));
    let bound = liveness_bound(stall_timeout);
    let w = ledger.wedge();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let verdict = decide(&w, suspect, bound, || fresh_ping(&settings)).await;
        let streak = w.timing_out_for().unwrap_or_default().as_secs();
        match verdict {
            Verdict::Fine => status.set_redis_wedged(None),
            Verdict::Unreachable => {
                status.set_redis_wedged(None);
                status.set_redis_note(Some(format!(
                    "unreachable: calls time out for {streak}s and a new connection gets no answer"
                )));
                continue;
            }
            Verdict::Reconnect => {
                tracing::warn!(
                    timing_out_for_s = streak,
                    "redis calls keep timing out while a new connection answers PING: reconnecting the pool"
                );
                crate::metrics::redis_pool_reconnected();
                w.mark_rebuilt();
                if tokio::time::timeout(Duration::from_secs(10), ledger.reconnect())
                    .await
                    .is_err()
                {
                    tracing::warn!("reconnecting the redis pool did not finish within 10 s");
                }
            }
            Verdict::Reconnected => {}
            Verdict::Wedged => {
                let why = format!(
                    "wedged: redis calls time out for {streak}s while a new connection answers, \
                     also {}s after the pool was reconnected",
                    w.rebuilt_for().unwrap_or_default().as_secs()
                );
                if status.redis_wedged().is_none() {
                    tracing::error!(
                        timing_out_for_s = streak,
                        "{why}; /healthz fails so that the pod is restarted"
                    );
                }
                status.set_redis_wedged(Some(why));
            }
        }
        status.set_redis_note(match verdict {
            Verdict::Fine => None,
            _ => Some(format!(
                "calls time out for {streak}s while a new connection answers (a wedged client)"
            )),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout() -> LedgerError {
        LedgerError::connect_timeout(Duration::from_millis(1))
    }

    #[test]
    fn a_timeout_starts_a_streak_and_any_answer_ends_it() {
        let w = Wedge::default();
        assert_eq!(w.timing_out_for(), None);
        w.observe::<()>(&Err(timeout()));
        assert!(w.timing_out_for().is_some());
        w.mark_rebuilt();
        w.observe(&Ok(()));
        assert_eq!(w.timing_out_for(), None);
        assert_eq!(w.rebuilt_for(), None);
    }

    #[tokio::test]
    async fn the_verdicts() {
        let w = Wedge::default();
        // No streak: fine, and the probe is not even tried.
        let v = decide(&w, Duration::ZERO, LIVENESS_BOUND, || async {
            panic!("probed")
        })
        .await;
        assert_eq!(v, Verdict::Fine);
        w.observe::<()>(&Err(timeout()));
        // A streak shorter than the suspicion bound: fine.
        let v = decide(&w, Duration::from_secs(60), LIVENESS_BOUND, || async {
            true
        })
        .await;
        assert_eq!(v, Verdict::Fine);
        // Long enough, nobody answers: an outage, waited out.
        assert_eq!(
            decide(&w, Duration::ZERO, LIVENESS_BOUND, || async { false }).await,
            Verdict::Unreachable
        );
        // A fresh connection answers: reconnect, then wait, then fail.
        assert_eq!(
            decide(&w, Duration::ZERO, LIVENESS_BOUND, || async { true }).await,
            Verdict::Reconnect
        );
        w.mark_rebuilt();
        assert_eq!(
            decide(&w, Duration::ZERO, LIVENESS_BOUND, || async { true }).await,
            Verdict::Reconnected
        );
        w.rebuilt_at.store(1, Ordering::Relaxed);
        let origin_back = Wedge {
            origin: Instant::now() - LIVENESS_BOUND - Duration::from_secs(1),
            streak_from: AtomicU64::new(1),
            rebuilt_at: AtomicU64::new(1),
        };
        assert_eq!(
            decide(&origin_back, Duration::ZERO, LIVENESS_BOUND, || async {
                true
            })
            .await,
            Verdict::Wedged
        );
        // ...unless nobody answers: then it is an outage again.
        assert_eq!(
            decide(&origin_back, Duration::ZERO, LIVENESS_BOUND, || async {
                false
            })
            .await,
            Verdict::Unreachable
        );
    }
}
