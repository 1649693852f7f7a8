//! A refusal that persists: librdkafka retries a failed TLS handshake by
//! itself, forever, and reports each attempt. One failure may be a broker
//! restarting with a new certificate; failures that keep coming for
//! [`REFUSAL_BOUND`] are a configuration to fix, and `run` stops with exit
//! code 2. Meanwhile the warnings are rate-limited.

use std::time::Duration;

use tokio::time::Instant;

/// How long refused TLS handshakes may keep coming before `run` stops.
pub const REFUSAL_BOUND: Duration = Duration::from_secs(30);
/// At most one warning line per this long.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The refusals seen so far by one client.
#[derive(Debug, Default)]
pub struct Refusals {
    /// The first refusal of the current run of refusals.
    first: Option<Instant>,
    /// The latest refusal.
    last: Option<Instant>,
    logged: Option<Instant>,
    unlogged: u64,
    /// The code of the latest refusal: what a persistent run is reported as.
    code: Option<rdkafka::types::RDKafkaErrorCode>,
}

/// What to do about one refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Refusals came without a gap of [`REFUSAL_BOUND`] for that long: stop.
    pub persistent: bool,
    /// Log it, with this many refusals (itself included) since the last
    /// line; `None` = stay quiet.
    pub log: Option<u64>,
}

impl Refusals {
    /// Notes one refusal with its error `code` at `now`.
    pub fn refused(&mut self, now: Instant, code: rdkafka::types::RDKafkaErrorCode) -> Verdict {
        self.code = Some(code);
        self.note(now)
    }

    /// The code of the latest refusal (`SSL` if none was noted).
    pub fn code(&self) -> rdkafka::types::RDKafkaErrorCode {
        self.code.unwrap_or(rdkafka::types::RDKafkaErrorCode::SSL)
    }

    /// Notes one refusal at `now`.
    pub fn note(&mut self, now: Instant) -> Verdict {
        let gap = self
            .last
            .is_none_or(|l| now.duration_since(l) > REFUSAL_BOUND);
        if gap {
            self.first = Some(now);
        }
        self.last = Some(now);
        let log = self.quiet(now);
        let persistent = self
            .first
            .is_some_and(|f| now.duration_since(f) >= REFUSAL_BOUND);
        Verdict { persistent, log }
    }
}

impl Refusals {
    /// A connection failure of the same client ("all brokers down", a
    /// transport failure). Within [`REFUSAL_BOUND`] of a refusal it continues
    /// the run of refusals: librdkafka reports a handshake refused again and
    /// again for the same reason once, and then only as connection failures.
    /// With no run on it is an outage, only logged sparingly.
    pub fn continued(&mut self, now: Instant) -> Verdict {
        let running = self
            .last
            .is_some_and(|l| now.duration_since(l) <= REFUSAL_BOUND);
        if running {
            self.note(now)
        } else {
            Verdict {
                persistent: false,
                log: self.quiet(now),
            }
        }
    }

    /// Another transient error of the same client (each refused handshake
    /// comes with a transport failure and "all brokers down"): they share
    /// one line per [`LOG_EVERY`]. `Some(n)`: log it, with `n` errors since
    /// the last line.
    pub fn quiet(&mut self, now: Instant) -> Option<u64> {
        self.unlogged += 1;
        if self
            .logged
            .is_none_or(|l| now.duration_since(l) >= LOG_EVERY)
        {
            self.logged = Some(now);
            Some(std::mem::take(&mut self.unlogged))
        } else {
            None
        }
    }
}

/// librdkafka's own log lines, at most one per [`LOG_EVERY`] and level
/// group (errors and warnings; notices and info; debug), as tracing events.
#[derive(Debug, Default)]
pub struct LogThrottle(std::sync::Mutex<[Refusals; 3]>);

impl LogThrottle {
    pub fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        let group = match level {
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning => 0,
            L::Notice | L::Info => 1,
            L::Debug => 2,
        };
        let times = {
            let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
            t[group].quiet(Instant::now())
        };
        let Some(times) = times else { return };
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(target: "librdkafka", fac, times, "librdkafka: {message}")
            }
            L::Warning => tracing::warn!(target: "librdkafka", fac, times, "librdkafka: {message}"),
            L::Notice | L::Info => {
                tracing::info!(target: "librdkafka", fac, times, "librdkafka: {message}")
            }
            L::Debug => tracing::debug!(target: "librdkafka", fac, times, "librdkafka: {message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_that_keep_coming_are_persistent_and_logged_sparingly() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        let v = r.note(t0);
        assert_eq!(
            v,
            Verdict {
                persistent: false,
                log: Some(1)
            }
        );
        // 47 a second, as librdkafka reports them: one line per 10 s.
        let mut lines = 1;
        let mut stopped_at = None;
        for i in 1..(47 * 40) {
            let now = t0 + Duration::from_millis(i * 1000 / 47);
            let v = r.note(now);
            lines += u64::from(v.log.is_some());
            if v.persistent && stopped_at.is_none() {
                stopped_at = Some(now.duration_since(t0));
            }
        }
        let stopped_at = stopped_at.expect("persistent after the bound");
        assert!(stopped_at >= REFUSAL_BOUND && stopped_at < REFUSAL_BOUND + Duration::from_secs(1));
        assert!(lines <= 5, "{lines} lines in 40 s");
    }

    #[test]
    fn connection_failures_after_a_refusal_continue_it_but_alone_never_stop() {
        let t0 = Instant::now();
        // An outage alone never counts, however long.
        let mut r = Refusals::default();
        for s in 0..120 {
            assert!(!r.continued(t0 + Duration::from_secs(s)).persistent);
        }
        // One refusal, then nothing but "all brokers down": persistent
        // after the bound, as librdkafka reports the refusal only once.
        let mut r = Refusals::default();
        r.note(t0);
        let stopped = (1..60)
            .map(|s| t0 + Duration::from_secs(s))
            .find(|&now| r.continued(now).persistent)
            .map(|now| now.duration_since(t0));
        assert_eq!(stopped, Some(REFUSAL_BOUND));
        // A refusal long before an outage does not make the outage one.
        let mut r = Refusals::default();
        r.note(t0);
        let later = t0 + REFUSAL_BOUND + Duration::from_secs(1);
        for s in 0..120 {
            assert!(!r.continued(later + Duration::from_secs(s)).persistent);
        }
    }

    #[test]
    fn a_refusal_after_a_long_quiet_starts_afresh() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        r.note(t0);
        let later = t0 + REFUSAL_BOUND + Duration::from_secs(5);
        assert!(!r.note(later).persistent);
        assert!(!r.note(later + Duration::from_secs(10)).persistent);
        assert!(r.note(later + REFUSAL_BOUND).persistent);
    }
}
