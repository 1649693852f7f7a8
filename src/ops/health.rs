//! The service's health as the loop reports it and the HTTP endpoints read
//! it (`/healthz`, `/readyz`): partitions assigned, the last progress, the
//! events done. Shared through an `Arc`; every field is atomic.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Liveness and readiness facts, written by the pipeline, read by the
/// HTTP endpoints.
#[derive(Debug, Default)]
pub struct Status {
    /// Partitions assigned now.
    pub assigned: AtomicUsize,
    /// Milliseconds since `started` of the last loop iteration that made
    /// progress (a message handled, a commit, an idle poll).
    pub last_progress_ms: AtomicU64,
    /// Events acknowledged since start.
    pub events_done: AtomicU64,
    started: std::sync::OnceLock<Instant>,
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
}
