//! exactly_once: the backstop for a transaction boundary stuck inside
//! librdkafka while the processing loop is blocked too.
//!
//! A hung transaction call is abandoned and the producer renewed by the
//! boundary itself (`kafka::transaction`); the last resort, for a boundary
//! whose renewal does not come through either, is the loop's exit after
//! `2 x transaction.timeout.ms + 30 s` (1, so that a new instance takes
//! over). But a rebalance callback runs inside the loop's
//! `consumer.recv()`, and its abort of the open transaction waits for the
//! stuck boundary (for a bounded time now; before, without end: found by
//! the 3-broker chaos mode, a transaction coordinator SIGKILLed, one
//! instance stuck, its group in PreparingRebalance for minutes, issue 23),
//! blocking the loop's timer meanwhile. This watchdog is an OS thread of its own: when a boundary has been
//! running for the loop's bound plus [`GRACE`], it logs and exits the
//! process with 1. Nothing is lost: offsets are committed only in
//! transactions, the open one is aborted by the broker or the next owner.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long after the loop's own bound the watchdog acts.
pub const GRACE: Duration = Duration::from_secs(15);

const IDLE: u64 = 0;
const STOPPED: u64 = u64::MAX;

/// When the running boundary started (ms since `origin`, +1), shared with
/// the watchdog thread.
#[derive(Clone)]
pub struct BoundaryWatch {
    origin: Instant,
    started: Arc<AtomicU64>,
}

impl BoundaryWatch {
    /// Starts the watchdog thread: it exits the process when a boundary has
    /// run longer than `bound` + [`GRACE`].
    pub fn start(bound: Duration) -> BoundaryWatch {
        let w = BoundaryWatch {
            origin: Instant::now(),
            started: Arc::new(AtomicU64::new(IDLE)),
        };
        let limit = bound + GRACE;
        let watched = w.clone();
        let spawned = std::thread::Builder::new()
            .name("txn-boundary-watch".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_secs(1));
                let started = watched.started.load(Ordering::Relaxed);
                if started == STOPPED {
                    return;
                }
                if overdue(started, watched.now(), limit) {
                    let secs = (watched.now() - started) / 1000;
                    tracing::error!(
                        running_s = secs,
                        "the kafka transaction boundary has not returned for {secs} s and the \
                         processing loop is blocked too: exiting 1 so that a new instance takes \
                         over (its open transaction is abandoned; its events are redone)"
                    );
                    eprintln!(
                        "deductor: the kafka transaction boundary has not returned for {secs} s \
                         and the processing loop is blocked: exiting"
                    );
                    std::process::exit(1);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the transaction boundary watchdog");
        }
        w
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64 + 1
    }

    /// A boundary starts.
    pub fn begin(&self) {
        self.started.store(self.now(), Ordering::Relaxed);
    }

    /// The boundary returned.
    pub fn end(&self) {
        let _ = self
            .started
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                (s != STOPPED).then_some(IDLE)
            });
    }

    /// The loop has ended: the shutdown's own bound takes over.
    pub fn stop(&self) {
        self.started.store(STOPPED, Ordering::Relaxed);
    }
}

/// Whether a boundary that started at `started` (0: none running) has run
/// longer than `limit` at `now` (both ms on the watch's clock).
pub fn overdue(started: u64, now: u64, limit: Duration) -> bool {
    started != IDLE && started != STOPPED && now.saturating_sub(started) > limit.as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_running_boundary_past_its_limit_is_overdue() {
        let limit = Duration::from_secs(150);
        assert!(!overdue(IDLE, 10_000_000, limit), "no boundary");
        assert!(!overdue(STOPPED, 10_000_000, limit), "the loop ended");
        assert!(!overdue(1_000, 1_000 + 150_000, limit), "at the limit");
        assert!(overdue(1_000, 1_000 + 150_001, limit), "past it");
    }

    #[test]
    fn begin_end_and_stop() {
        let w = BoundaryWatch {
            origin: Instant::now(),
            started: Arc::new(AtomicU64::new(IDLE)),
        };
        w.begin();
        assert_ne!(w.started.load(Ordering::Relaxed), IDLE);
        w.end();
        assert_eq!(w.started.load(Ordering::Relaxed), IDLE);
        w.stop();
        w.end();
        assert_eq!(
            w.started.load(Ordering::Relaxed),
            STOPPED,
            "end after stop keeps it stopped"
        );
    }
}
