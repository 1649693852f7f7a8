//! Error classification shared by every layer.
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
