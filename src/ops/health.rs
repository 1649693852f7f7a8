//! The service's health as the loop reports it and the HTTP endpoints read
//! it (`/healthz`, `/readyz`): where the start is, partitions assigned, the
//! last progress, the events done. Shared through an `Arc`.
//!
//! Liveness means "making progress, or waiting out a dependency": a start
//! that waits for Redis or Kafka is alive (a restart would not bring them
//! back), and readiness says what it waits for.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::ledger::Ledger;

/// Where the service is between `run` and its processing loop.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Phase {
    /// Setting up (clients, the group): short, nothing to wait for yet.
    #[default]
    Starting,
    /// A dependency is unreachable at start and retried with backoff:
    /// `on` names it (`redis`, `kafka`), `what` says what is retried. No
    /// error text: /readyz is on the network, the log has the error.
    Waiting {
        on: &'static str,
        what: &'static str,
    },
    /// The processing loop runs: liveness is its progress.
    Running,
}

/// Liveness and readiness facts, written by the pipeline, read by the
/// HTTP endpoints.
#[derive(Default)]
pub struct Status {
    /// Partitions assigned now.
    pub assigned: AtomicUsize,
    /// Milliseconds since `started` of the last loop iteration that made
    /// progress (a message handled, a commit, an idle poll).
    pub last_progress_ms: AtomicU64,
    /// Events acknowledged since start.
    pub events_done: AtomicU64,
    phase: Mutex<Phase>,
    /// The Redis pool, once connected: /readyz pings it.
    ledger: OnceLock<Ledger>,
    /// Set by the wedge watchdog ([`crate::ledger::wedge`]): the pool's
    /// calls time out while Redis answers, also after a reconnection; then
    /// `/healthz` fails with this text.
    redis_wedged: Mutex<Option<String>>,
    /// What the wedge watchdog sees of Redis now, for `/readyz`.
    redis_note: Mutex<Option<String>>,
    started: OnceLock<Instant>,
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Status")
            .field("phase", &self.phase())
            .field("assigned", &self.assigned)
            .field("events_done", &self.events_done)
            .finish_non_exhaustive()
    }
}

impl Status {
    fn origin(&self) -> Instant {
        *self.started.get_or_init(Instant::now)
    }

    pub fn touch(&self) {
        let ms = self.origin().elapsed().as_millis() as u64;
        self.last_progress_ms.store(ms, Ordering::Relaxed);
    }

    /// How long ago the loop last made progress.
    pub fn since_progress(&self) -> Duration {
        let now = self.origin().elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_progress_ms.load(Ordering::Relaxed)))
    }

    pub fn phase(&self) -> Phase {
        self.phase.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_phase(&self, phase: Phase) {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = phase;
    }

    /// A dependency is unreachable at start and is being retried.
    pub fn waiting(&self, on: &'static str, what: &'static str) {
        self.set_phase(Phase::Waiting { on, what });
    }

    /// Back to setting up, after a wait ended.
    pub fn starting(&self) {
        self.set_phase(Phase::Starting);
    }

    /// The processing loop runs: from now on liveness is its progress.
    pub fn running(&self) {
        self.touch();
        self.set_phase(Phase::Running);
    }

    /// The Redis pool /readyz pings (set once, when connected).
    pub fn set_ledger(&self, ledger: Ledger) {
        let _ = self.ledger.set(ledger);
    }

    pub fn ledger(&self) -> Option<&Ledger> {
        self.ledger.get()
    }

    /// The wedge watchdog's verdict: `Some(why)` fails liveness.
    pub fn set_redis_wedged(&self, why: Option<String>) {
        *self.redis_wedged.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    pub fn redis_wedged(&self) -> Option<String> {
        self.redis_wedged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// What the wedge watchdog sees of Redis (an outage or a wedge).
    pub fn set_redis_note(&self, note: Option<String>) {
        *self.redis_note.lock().unwrap_or_else(|p| p.into_inner()) = note;
    }

    pub fn redis_note(&self) -> Option<String> {
        self.redis_note
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `/healthz`: alive, with the reason, or stalled or wedged (`Err`).
    pub fn liveness(&self, stall_timeout: Duration) -> Result<String, String> {
        if let Some(why) = self.redis_wedged() {
            return Err(why);
        }
        match self.phase() {
            Phase::Starting => Ok("ok: starting".to_owned()),
            Phase::Waiting { on, what } => Ok(format!("ok: waiting for {on} ({what})")),
            Phase::Running => {
                let since = self.since_progress();
                if since > stall_timeout {
                    Err(format!("stalled: no progress for {}s", since.as_secs()))
                } else {
                    Ok("ok".to_owned())
                }
            }
        }
    }

    /// `/readyz` before the Redis ping: why the service is not ready yet
    /// (`Err`), or the partitions it holds.
    pub fn readiness(&self) -> Result<usize, String> {
        match self.phase() {
            Phase::Starting => Err("not ready: starting".to_owned()),
            Phase::Waiting { on, what } => Err(format!("not ready: waiting for {on}: {what}")),
            Phase::Running => match self.assigned.load(Ordering::Relaxed) {
                0 => Err("not ready: no partitions assigned".to_owned()),
                n => Ok(n),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_for_a_dependency_is_alive_and_not_ready() {
        let s = Status::default();
        assert_eq!(s.liveness(Duration::ZERO), Ok("ok: starting".to_owned()));
        s.waiting("redis", "unreachable at startup, retrying");
        // However long the wait, it is not a stall.
        std::thread::sleep(Duration::from_millis(5));
        let alive = s.liveness(Duration::ZERO).expect("alive while waiting");
        assert!(alive.contains("waiting for redis"), "{alive}");
        let why = s.readiness().expect_err("not ready while waiting");
        assert!(why.contains("redis"), "{why}");
        s.starting();
        assert_eq!(s.readiness(), Err("not ready: starting".to_owned()));
    }

    #[test]
    fn a_wedged_redis_client_fails_liveness_until_it_answers_again() {
        let s = Status::default();
        s.running();
        s.set_redis_wedged(Some("wedged: calls time out".to_owned()));
        assert_eq!(
            s.liveness(Duration::from_secs(60)),
            Err("wedged: calls time out".to_owned())
        );
        s.set_redis_wedged(None);
        assert_eq!(s.liveness(Duration::from_secs(60)), Ok("ok".to_owned()));
    }

    #[test]
    fn a_running_loop_is_judged_by_its_progress() {
        let s = Status::default();
        s.running();
        assert!(s.liveness(Duration::from_secs(60)).is_ok());
        std::thread::sleep(Duration::from_millis(5));
        let stalled = s.liveness(Duration::ZERO).expect_err("no progress");
        assert!(stalled.starts_with("stalled"), "{stalled}");
        assert_eq!(
            s.readiness(),
            Err("not ready: no partitions assigned".to_owned())
        );
        s.assigned.store(3, Ordering::Relaxed);
        assert_eq!(s.readiness(), Ok(3));
    }
}
