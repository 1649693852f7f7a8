//! `deductor dlq list | show | replay`: the dead-letter topic for operators.
//!
//! Records are read with a consumer that is assigned partitions and never
//! commits, so reading changes no group's position. Filters: the
//! `deductor.error.kind` header, a partition, an offset range (inclusive,
//! per partition) and a time range (record timestamps).
//!
//! Replay (redrive) sends each record back to the configured input topic,
//! and only there: the original key and the producer's headers are kept
//! (deductor's own `deductor.*` ones are dropped), and `deductor.redrive.*`
//! headers say where it came from and when. Each record is first run
//! through the service's own parser (`domain::event::parse`): a record that
//! is still invalid is skipped (it would only be dead-lettered again)
//! unless asked for, and `--dry-run` stops there. Each dead letter sent is
//! noted in Redis (`promo:redriven:...`), so a second replay skips it
//! unless `--again`.

use std::time::Duration;

use crate::domain::event::{self, Event, InvalidEvent};

mod read;
mod replay;

pub use read::read;
pub use replay::{replay, Options, ReplayError, Replayed, Verdict};

/// The header naming why a record was dead-lettered (CONTRACT.md section 4).
pub const KIND_HEADER: &str = "deductor.error.kind";
/// Set on a dead letter cut to its first 64 KiB (the whole record is still
/// in the input topic, at its `deductor.source.*` position).
pub const TRUNCATED_HEADER: &str = "deductor.truncated";
/// Provenance headers a redrive adds.
pub const REDRIVE_TOPIC: &str = "deductor.redrive.topic";
pub const REDRIVE_PARTITION: &str = "deductor.redrive.partition";
pub const REDRIVE_OFFSET: &str = "deductor.redrive.offset";
pub const REDRIVE_TIME: &str = "deductor.redrive.time";
/// The prefix of the headers deductor writes; a replay drops them.
pub const DEDUCTOR_HEADERS: &str = "deductor.";

/// How long a read waits for a record before it gives up on a partition
/// that should have more (e.g. behind an open transaction).
const IDLE: Duration = Duration::from_secs(10);

/// Which dead letters a command works on. Every bound is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub kind: Option<String>,
    pub partition: Option<i32>,
    /// Inclusive offsets, applied in each partition.
    pub from_offset: Option<i64>,
    pub to_offset: Option<i64>,
    /// Inclusive record timestamps, in ms.
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    /// At most this many records (the first ones by partition and offset).
    pub limit: Option<usize>,
}

impl Filter {
    /// True when no bound is given: the whole topic.
    pub fn is_empty(&self) -> bool {
        let Filter {
            kind,
            partition,
            from_offset,
            to_offset,
            since_ms,
            until_ms,
            limit,
        } = self;
        kind.is_none()
            && partition.is_none()
            && from_offset.is_none()
            && to_offset.is_none()
            && since_ms.is_none()
            && until_ms.is_none()
            && limit.is_none()
    }

    /// The record-level bounds (the partition and offset bounds are applied
    /// when reading).
    pub fn matches(&self, r: &DeadLetter) -> bool {
        let kind_ok = self
            .kind
            .as_deref()
            .is_none_or(|k| r.header(KIND_HEADER) == Some(k));
        let time_ok = match (r.timestamp_ms, self.since_ms, self.until_ms) {
            (_, None, None) => true,
            (None, _, _) => false,
            (Some(t), since, until) => since.is_none_or(|s| t >= s) && until.is_none_or(|u| t <= u),
        };
        let offset_ok = self.from_offset.is_none_or(|f| r.offset >= f)
            && self.to_offset.is_none_or(|t| r.offset <= t);
        kind_ok && time_ok && offset_ok
    }
}

/// One dead-letter record as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub partition: i32,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// In the record's order; a header may repeat or have no value.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl DeadLetter {
    /// The first value of header `name`, as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// A dead letter cut for its size: never redriven (the event would be
    /// the cut bytes); the whole record is at its source position.
    pub fn truncated(&self) -> bool {
        self.header(TRUNCATED_HEADER) == Some("true")
    }

    /// Why a truncated dead letter is not sent, naming where the whole record is.
    fn truncated_reason(&self) -> String {
        format!(
            "truncated dead letter: redrive the whole record from {} {}@{}",
            self.header("deductor.source.topic")
                .unwrap_or("the input topic"),
            self.header("deductor.source.partition").unwrap_or("?"),
            self.header("deductor.source.offset").unwrap_or("?"),
        )
    }

    /// Runs the payload through the service's parser.
    pub fn parse(&self) -> Result<Event, InvalidEvent> {
        event::parse(self.payload.as_deref().unwrap_or_default())
    }

    fn when(&self) -> String {
        self.timestamp_ms
            .and_then(chrono::DateTime::from_timestamp_millis)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_else(|| "-".to_owned())
    }

    /// One line for `dlq list`.
    pub fn line(&self) -> String {
        format!(
            "{}@{}  {}  kind {}  key {}  {}{}",
            self.partition,
            self.offset,
            self.when(),
            self.header(KIND_HEADER).unwrap_or("-"),
            self.key.as_deref().map(lossy).unwrap_or_else(|| "-".into()),
            if self.truncated() { "(truncated) " } else { "" },
            self.header("deductor.error").unwrap_or(""),
        )
    }

    /// Every detail, for `dlq show`, with what the parser says now.
    pub fn words(&self) -> String {
        let mut s = format!(
            "dead letter {}@{} at {}\n  key: {}\n",
            self.partition,
            self.offset,
            self.when(),
            self.key
                .as_deref()
                .map(lossy)
                .unwrap_or_else(|| "(none)".into())
        );
        for (k, v) in &self.headers {
            let v = v
                .as_deref()
                .map(lossy)
                .unwrap_or_else(|| "(no value)".into());
            s.push_str(&format!("  header {k}: {v}\n"));
        }
        match self.parse() {
            Ok(e) => s.push_str(&format!(
                "  parses now: {} {} of order {}\n",
                e.event_type().as_str(),
                e.header().event_id,
                e.header().order_id
            )),
            Err(e) => s.push_str(&format!("  still invalid: {e}\n")),
        }
        let payload = self
            .payload
            .as_deref()
            .map(lossy)
            .unwrap_or_else(|| "(none)".into());
        s.push_str(&format!("  payload: {payload}\n"));
        s
    }

    pub fn to_json(&self) -> serde_json::Value {
        let headers: serde_json::Map<String, serde_json::Value> = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.as_deref().map(lossy).into()))
            .collect();
        let parsed = match self.parse() {
            Ok(_) => serde_json::json!({"valid": true}),
            Err(e) => {
                serde_json::json!({"valid": false, "kind": e.kind.as_str(), "detail": e.detail})
            }
        };
        serde_json::json!({
            "partition": self.partition,
            "offset": self.offset,
            "timestamp_ms": self.timestamp_ms,
            "key": self.key.as_deref().map(lossy),
            "kind": self.header(KIND_HEADER),
            "error": self.header("deductor.error"),
            "headers": headers,
            "payload": self.payload.as_deref().map(lossy),
            "truncated": self.truncated(),
            "parse": parsed,
        })
    }

    /// The headers of the redriven record: the producer's own, in order,
    /// then the provenance (`deductor.redrive.*`: where it was read, and
    /// when). Every `deductor.*` header is left out (the dead letter's
    /// reasons and source, an earlier redrive's provenance): they describe
    /// an earlier trip, and kept they would pile up, one more set each time
    /// the record is dead-lettered again (issue 23). The dead letter the
    /// provenance names still holds them.
    pub fn redrive_headers(&self, dlq_topic: &str, now: &str) -> Vec<(String, Option<Vec<u8>>)> {
        let mut h: Vec<_> = self
            .headers
            .iter()
            .filter(|(k, _)| !k.starts_with(DEDUCTOR_HEADERS))
            .cloned()
            .collect();
        for (k, v) in [
            (REDRIVE_TOPIC, dlq_topic.to_owned()),
            (REDRIVE_PARTITION, self.partition.to_string()),
            (REDRIVE_OFFSET, self.offset.to_string()),
            (REDRIVE_TIME, now.to_owned()),
        ] {
            h.push((k.to_owned(), Some(v.into_bytes())));
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(kind: &str, offset: i64, ts: i64, payload: &str) -> DeadLetter {
        DeadLetter {
            partition: 0,
            offset,
            timestamp_ms: Some(ts),
            key: Some(b"o-1".to_vec()),
            payload: Some(payload.as_bytes().to_vec()),
            headers: vec![
                (KIND_HEADER.to_owned(), Some(kind.as_bytes().to_vec())),
                ("x-trace".to_owned(), None),
            ],
        }
    }

    #[test]
    fn filters_on_kind_offsets_and_time() {
        let r = letter("not_json", 5, 1_000, "x");
        assert!(Filter::default().matches(&r));
        assert!(Filter::default().is_empty());
        let f = |f: Filter| f.matches(&r);
        assert!(f(Filter {
            kind: Some("not_json".into()),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            kind: Some("invalid_id".into()),
            ..Filter::default()
        }));
        assert!(f(Filter {
            from_offset: Some(5),
            to_offset: Some(5),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            from_offset: Some(6),
            ..Filter::default()
        }));
        assert!(f(Filter {
            since_ms: Some(1_000),
            until_ms: Some(1_000),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            until_ms: Some(999),
            ..Filter::default()
        }));
        let no_ts = DeadLetter {
            timestamp_ms: None,
            ..r.clone()
        };
        assert!(!Filter {
            since_ms: Some(0),
            ..Filter::default()
        }
        .matches(&no_ts));
    }

    #[test]
    fn redrive_keeps_headers_and_adds_provenance() {
        let mut r = letter("missing_field", 7, 1_000, "{}");
        r.headers
            .push((REDRIVE_OFFSET.to_owned(), Some(b"3".to_vec())));
        r.headers.push(("x-after".to_owned(), Some(b"a".to_vec())));
        let h = r.redrive_headers("orders.dlq", "2026-11-30T12:00:00.000Z");
        assert_eq!(
            &h[..2],
            &[r.headers[1].clone(), r.headers[3].clone()],
            "the producer's headers first, unchanged, no deductor.* one"
        );
        assert_eq!(h.len(), 6, "{h:?}");
        let get = |k: &str| {
            h.iter()
                .find(|(n, _)| n == k)
                .and_then(|(_, v)| v.clone())
                .map(|v| String::from_utf8(v).unwrap())
        };
        assert_eq!(get(REDRIVE_TOPIC).as_deref(), Some("orders.dlq"));
        assert_eq!(get(REDRIVE_PARTITION).as_deref(), Some("0"));
        assert_eq!(get(REDRIVE_OFFSET).as_deref(), Some("7"));
        assert_eq!(
            get(REDRIVE_TIME).as_deref(),
            Some("2026-11-30T12:00:00.000Z")
        );
    }

    #[test]
    fn the_real_parser_judges_each_record() {
        let bad = letter("not_json", 1, 0, "not json");
        assert!(bad.parse().is_err());
        assert_eq!(bad.to_json()["parse"]["valid"], false);
        let good = letter(
            "missing_field",
            2,
            0,
            r#"{"type":"OrderPlaced","event_id":"e","order_id":"o","customer_id":"c","occurred_at":"2026-11-29T10:00:00Z","lines":[{"promotion_id":"p"}]}"#,
        );
        assert!(good.parse().is_ok(), "{:?}", good.parse());
        assert!(good
            .words()
            .contains("parses now: OrderPlaced e of order o"));
        let mut cut = bad.clone();
        cut.headers
            .push((TRUNCATED_HEADER.to_owned(), Some(b"true".to_vec())));
        cut.headers
            .push(("deductor.source.offset".to_owned(), Some(b"41".to_vec())));
        assert!(cut.truncated() && !bad.truncated());
        assert!(cut.line().contains("(truncated)"), "{}", cut.line());
        assert!(
            cut.truncated_reason().ends_with("?@41"),
            "{}",
            cut.truncated_reason()
        );
    }
}
