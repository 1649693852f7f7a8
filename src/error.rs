//! Error classification shared by every layer, and the exit codes (which
//! `exit.rs` maps errors to and `deductor check` reports with).
//!
//! Each layer has its own `thiserror` enum; each enum says what should happen
//! to the event it failed on, so the pipeline decides with one `match`.

/// What the pipeline does with an event whose processing failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Transient (connection, timeout, busy, loading): back off and retry
    /// the same event; nothing is committed meanwhile.
    Retry,
    /// The event cannot succeed (e.g. corrupt stored data): reject it with
    /// an outcome and move on.
    Reject,
    /// The service cannot work as configured (bad config, auth): stop.
    Fatal,
}

/// Exit code: a check failed, a breach was found, or the command was
/// refused or failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit code: a usage or configuration error.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: a dependency (Kafka or Redis) could not be reached.
pub const EXIT_UNREACHABLE: u8 = 3;
