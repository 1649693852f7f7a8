//! Record headers: what deductor reads from an input record (W3C trace
//! context, the allow-listed correlation headers) and what it writes on the
//! records it produces (CloudEvents binary-mode attributes on outcomes, the
//! original headers on dead letters, `traceparent` on both). Pure: built
//! apart from sending, unit-tested here.
//!
//! Trace context (<https://www.w3.org/TR/trace-context/>): an input record's
//! `traceparent` makes the event's span a child of the producer's span; the
//! event's span (a new span id, same trace id; a new trace when there is no
//! valid `traceparent`) is the parent written on the outcome or dead letter.

use rdkafka::message::{Header, Headers, OwnedHeaders};

use crate::domain::outcome::Outcome;

pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";
pub const CONTENT_TYPE: &str = "content-type";
/// Names the headers of the input record that deductor did not copy (or
/// copied cut) because they were over their cap: comma-separated, each a
/// name from `kafka.propagate_headers` or `tracestate`.
pub const DROPPED: &str = "deductor.dropped.headers";
/// On a truncated dead letter: how many of the original record's headers
/// were left out to make it fit.
pub const ORIGINAL_HEADERS_DROPPED: &str = "deductor.original.headers.dropped";

/// The most of a `tracestate` deductor copies onto what it writes. W3C
/// Trace Context asks vendors to propagate at least 512 characters and,
/// over a limit, to drop list members (those over 128 characters first,
/// then from the end), never to cut one.
pub const MAX_TRACESTATE_BYTES: usize = 512;
/// The longest value of a `kafka.propagate_headers` header that is copied
/// onto an outcome; a longer one is dropped (a cut correlation id would
/// be a wrong one).
pub const MAX_PROPAGATED_VALUE_BYTES: usize = 4 * 1024;
/// The most bytes (names and values) of propagated headers copied onto one
/// outcome; those past it are dropped.
pub const MAX_PROPAGATED_TOTAL_BYTES: usize = 16 * 1024;
/// The most bytes (names and values) of the original record's headers kept
/// on a truncated dead letter; the rest are left out and counted in
/// [`ORIGINAL_HEADERS_DROPPED`].
pub const MAX_TRUNCATED_HEADER_BYTES: usize = 64 * 1024;
/// The CloudEvents spec version of the `ce_*` headers.
pub const CE_SPECVERSION: &str = "1.0";

/// A parsed `traceparent`: 32 and 16 lowercase hex digits, and the flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanRef {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

impl SpanRef {
    /// Parses version 00 (and, as the spec asks, the first four fields of a
    /// later version); `None` for anything malformed or all-zero ids.
    pub fn parse(v: &str) -> Option<SpanRef> {
        let mut parts = v.trim().split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        let rest = parts.next();
        if version.len() != 2 || version == "ff" || !is_hex(version) {
            return None;
        }
        if version == "00" && rest.is_some() {
            return None;
        }
        let trace_id: [u8; 16] = hex_bytes(trace)?;
        let span_id: [u8; 8] = hex_bytes(span)?;
        let [flags]: [u8; 1] = hex_bytes(flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(SpanRef {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The `traceparent` header value (version 00).
    pub fn header(&self) -> String {
        // Written by hand: this runs for every outcome and dead letter.
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        push_hex(&mut s, &self.trace_id);
        s.push('-');
        push_hex(&mut s, &self.span_id);
        s.push('-');
        push_hex(&mut s, &[self.flags]);
        s
    }

    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    pub fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }
}

fn is_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex_bytes<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !is_hex(s) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

pub fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    push_hex(&mut s, b);
    s
}

/// Lower-case hex of `b` appended to `s`, without an allocation per byte
/// (a `format!` per byte was ~40 allocations per event: the outcome's
/// `traceparent` and the span's trace id).
fn push_hex(s: &mut String, b: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &x in b {
        s.push(char::from(DIGITS[usize::from(x >> 4)]));
        s.push(char::from(DIGITS[usize::from(x & 0x0f)]));
    }
}

/// What deductor takes from an input record's headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Incoming {
    /// The producer's span, when the record carried a valid `traceparent`.
    pub parent: Option<SpanRef>,
    pub tracestate: Option<String>,
    /// Allow-listed headers (`kafka.propagate_headers`), in record order.
    pub propagated: Vec<(String, Vec<u8>)>,
    /// Every header of the record, for the dead letter.
    pub all: Vec<(String, Option<Vec<u8>>)>,
    /// The headers over their cap, not copied whole (see [`DROPPED`]).
    pub dropped: Vec<String>,
}

impl Incoming {
    /// Reads the headers of an input record. Header names are compared
    /// case-insensitively (HTTP habit; Kafka's are case-sensitive bytes).
    ///
    /// What is copied is capped ([`MAX_TRACESTATE_BYTES`],
    /// [`MAX_PROPAGATED_VALUE_BYTES`], [`MAX_PROPAGATED_TOTAL_BYTES`]): an
    /// outcome stays far below any topic's size limit whatever the input
    /// record carried. What was cut or dropped is named in `dropped`.
    pub fn read<H: Headers>(headers: Option<&H>, allow: &[String]) -> Incoming {
        let mut inc = Incoming::default();
        let Some(headers) = headers else { return inc };
        let mut propagated_bytes = 0usize;
        for h in headers.iter() {
            let value = h.value.map(<[u8]>::to_vec);
            let text = h.value.and_then(|v| std::str::from_utf8(v).ok());
            if h.key.eq_ignore_ascii_case(TRACEPARENT) {
                inc.parent = text.and_then(SpanRef::parse);
            } else if h.key.eq_ignore_ascii_case(TRACESTATE) {
                inc.tracestate = text.and_then(|t| {
                    if t.trim().len() > MAX_TRACESTATE_BYTES {
                        inc.note(TRACESTATE);
                    }
                    cap_tracestate(t)
                });
            } else if let Some(v) = &value {
                if let Some(name) = allow.iter().find(|a| a.eq_ignore_ascii_case(h.key)) {
                    let size = h.key.len() + v.len();
                    if v.len() > MAX_PROPAGATED_VALUE_BYTES
                        || propagated_bytes + size > MAX_PROPAGATED_TOTAL_BYTES
                    {
                        inc.note(name);
                    } else {
                        propagated_bytes += size;
                        inc.propagated.push((h.key.to_owned(), v.clone()));
                    }
                }
            }
            inc.all.push((h.key.to_owned(), value));
        }
        inc
    }

    fn note(&mut self, name: &str) {
        if !self.dropped.iter().any(|d| d == name) {
            self.dropped.push(name.to_owned());
        }
    }

    /// The same without the optional copies (`tracestate` and the
    /// propagated headers), each named in `dropped`: for an outcome the
    /// outcome topic refused as too large even so.
    pub fn bare(&self) -> Incoming {
        let mut bare = Incoming {
            parent: self.parent,
            all: Vec::new(),
            dropped: self.dropped.clone(),
            ..Incoming::default()
        };
        if self.tracestate.is_some() {
            bare.note(TRACESTATE);
        }
        for (k, _) in &self.propagated {
            bare.note(k);
        }
        bare
    }
}

/// A `tracestate` cut to [`MAX_TRACESTATE_BYTES`] the W3C way: list
/// members over 128 bytes go first, then members from the end; `None` when
/// nothing is left.
pub fn cap_tracestate(t: &str) -> Option<String> {
    let t = t.trim();
    if t.len() <= MAX_TRACESTATE_BYTES {
        return (!t.is_empty()).then(|| t.to_owned());
    }
    let mut kept: Vec<&str> = t
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty() && m.len() <= 128)
        .collect();
    let joined = |k: &[&str]| k.iter().map(|m| m.len()).sum::<usize>() + k.len().saturating_sub(1);
    while joined(&kept) > MAX_TRACESTATE_BYTES {
        kept.pop();
    }
    (!kept.is_empty()).then(|| kept.join(","))
}

/// The span of one event: a child of the producer's span when there was
/// one. Its ids are what deductor writes as `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventSpan {
    pub span: SpanRef,
    pub parent: Option<SpanRef>,
}

impl EventSpan {
    /// `trace_id` and `span_id` are fresh random ids for a new trace and for
    /// this span; the parent's trace id wins when there is a parent.
    pub fn new(parent: Option<SpanRef>, trace_id: [u8; 16], span_id: [u8; 8]) -> EventSpan {
        let span = match parent {
            Some(p) => SpanRef {
                trace_id: p.trace_id,
                span_id,
                flags: p.flags,
            },
            None => SpanRef {
                trace_id,
                span_id,
                flags: 0x01,
            },
        };
        EventSpan { span, parent }
    }
}

fn push(h: OwnedHeaders, key: &str, value: &[u8]) -> OwnedHeaders {
    h.insert(Header {
        key,
        value: Some(value),
    })
}

/// The trace context and the allow-listed headers of the input record.
fn common(mut h: OwnedHeaders, span: &EventSpan, inc: &Incoming) -> OwnedHeaders {
    h = push(h, TRACEPARENT, span.span.header().as_bytes());
    if let Some(state) = &inc.tracestate {
        h = push(h, TRACESTATE, state.as_bytes());
    }
    for (k, v) in &inc.propagated {
        h = push(h, k, v);
    }
    if !inc.dropped.is_empty() {
        h = push(h, DROPPED, inc.dropped.join(",").as_bytes());
    }
    h
}

/// The headers of an outcome: `content-type`, the CloudEvents binary-mode
/// attributes (`ce_id` = outcome_id, `ce_type` = the outcome type,
/// `ce_subject` = order_id, `ce_time` = processed_at), `traceparent` (and
/// `tracestate`), then the allow-listed headers of the input record.
pub fn outcome(o: &Outcome, ce_source: &str, span: &EventSpan, inc: &Incoming) -> OwnedHeaders {
    let mut h = OwnedHeaders::new_with_capacity(8 + inc.propagated.len());
    h = push(h, CONTENT_TYPE, b"application/json");
    h = push(h, "ce_specversion", CE_SPECVERSION.as_bytes());
    h = push(h, "ce_id", o.outcome_id.as_bytes());
    h = push(h, "ce_type", o.kind.as_str().as_bytes());
    h = push(h, "ce_source", ce_source.as_bytes());
    h = push(h, "ce_subject", o.order_id.as_bytes());
    h = push(h, "ce_time", o.processed_at.as_bytes());
    common(h, span, inc)
}

/// The bytes (names and values) of the original record's headers that a
/// dead letter copies.
pub fn original_bytes(inc: &Incoming) -> usize {
    inc.all
        .iter()
        .filter(|(k, _)| !is_trace_context(k))
        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
        .sum()
}

fn is_trace_context(k: &str) -> bool {
    k.eq_ignore_ascii_case(TRACEPARENT) || k.eq_ignore_ascii_case(TRACESTATE)
}

/// The original record's headers first (less its trace context, which the
/// event's span replaces), then `traceparent` (and the capped
/// `tracestate`, with [`DROPPED`] when it was cut); the caller adds the
/// `deductor.*` headers after these. With `keep`, the original headers are
/// kept in order only while they fit in `keep` bytes (names and values);
/// the second value is how many were left out.
pub fn dead_letter(span: &EventSpan, inc: &Incoming, keep: Option<usize>) -> (OwnedHeaders, usize) {
    let mut h = OwnedHeaders::new_with_capacity(inc.all.len() + 12);
    let (mut used, mut left_out) = (0usize, 0usize);
    for (k, v) in &inc.all {
        if is_trace_context(k) {
            continue;
        }
        if let Some(limit) = keep {
            let size = k.len() + v.as_ref().map_or(0, Vec::len);
            if used + size > limit {
                left_out += 1;
                continue;
            }
            used += size;
        }
        h = h.insert(Header {
            key: k.as_str(),
            value: v.as_deref(),
        });
    }
    h = push(h, TRACEPARENT, span.span.header().as_bytes());
    if let Some(state) = &inc.tracestate {
        h = push(h, TRACESTATE, state.as_bytes());
    }
    if inc.dropped.iter().any(|d| d == TRACESTATE) {
        h = push(h, DROPPED, TRACESTATE.as_bytes());
    }
    (h, left_out)
}

/// The CloudEvents `ce_source` of this consumer group's outcomes.
pub fn ce_source(group_id: &str) -> String {
    format!("/deductor/{group_id}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::outcome::OutcomeType;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn get(h: &OwnedHeaders, key: &str) -> Vec<String> {
        h.iter()
            .filter(|x| x.key == key)
            .map(|x| String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned())
            .collect()
    }

    #[test]
    fn hex_is_two_lower_case_digits_per_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let want: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&all), want);
        assert_eq!(hex(&[]), "");
        let s = SpanRef {
            trace_id: [0xab; 16],
            span_id: [0x01; 8],
            flags: 0x0f,
        };
        assert_eq!(
            s.header(),
            format!("00-{}-{}-0f", "ab".repeat(16), "01".repeat(8))
        );
    }

    #[test]
    fn traceparent_round_trips_and_refuses_malformed_values() {
        let s = SpanRef::parse(TP).unwrap();
        assert_eq!(s.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(s.span_id_hex(), "00f067aa0ba902b7");
        assert_eq!(s.flags, 1);
        assert_eq!(s.header(), TP);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",
        ] {
            assert_eq!(SpanRef::parse(bad), None, "{bad}");
        }
        // A later version may carry more fields.
        assert!(SpanRef::parse(&format!("01{}-extra", &TP[2..])).is_some());
    }

    #[test]
    fn the_event_span_continues_the_producers_trace() {
        let parent = SpanRef::parse(TP).unwrap();
        let span = EventSpan::new(Some(parent), [7; 16], [9; 8]);
        assert_eq!(span.span.trace_id, parent.trace_id);
        assert_eq!(span.span.span_id, [9; 8]);
        let fresh = EventSpan::new(None, [7; 16], [9; 8]);
        assert_eq!(fresh.span.trace_id, [7; 16]);
        assert_eq!(fresh.span.flags, 1);
    }

    #[test]
    fn incoming_reads_trace_context_and_allow_listed_headers() {
        let h = OwnedHeaders::new()
            .insert(Header {
                key: "TraceParent",
                value: Some(TP.as_bytes()),
            })
            .insert(Header {
                key: "tracestate",
                value: Some(b"k=v".as_slice()),
            })
            .insert(Header {
                key: "x-correlation-id",
                value: Some(b"corr-1".as_slice()),
            })
            .insert(Header {
                key: "x-other",
                value: Some(b"no".as_slice()),
            });
        let inc = Incoming::read(Some(&h), &["X-Correlation-Id".to_owned()]);
        assert_eq!(inc.parent, SpanRef::parse(TP));
        assert_eq!(inc.tracestate.as_deref(), Some("k=v"));
        assert_eq!(
            inc.propagated,
            vec![("x-correlation-id".to_owned(), b"corr-1".to_vec())]
        );
        assert_eq!(inc.all.len(), 4);
        assert_eq!(
            Incoming::read::<OwnedHeaders>(None, &[]),
            Incoming::default()
        );
    }

    /// An accepted outcome of order o-1, event e-1.
    fn accepted() -> Outcome {
        Outcome {
            kind: OutcomeType::DeductAccepted,
            order_id: "o-1".into(),
            outcome_id: "e-1:DeductAccepted".into(),
            reason: None,
            processed_at: "2026-11-30T10:00:00.000Z".into(),
            payload: b"{}".to_vec(),
        }
    }

    #[test]
    fn outcome_headers_carry_cloudevents_and_the_trace() {
        let o = accepted();
        let inc = Incoming {
            parent: SpanRef::parse(TP),
            tracestate: Some("k=v".into()),
            propagated: vec![("x-correlation-id".into(), b"c".to_vec())],
            all: vec![],
            dropped: vec![],
        };
        let span = EventSpan::new(inc.parent, [1; 16], [2; 8]);
        let h = outcome(&o, &ce_source("g"), &span, &inc);
        assert_eq!(get(&h, "content-type"), ["application/json"]);
        assert_eq!(get(&h, "ce_specversion"), ["1.0"]);
        assert_eq!(get(&h, "ce_id"), ["e-1:DeductAccepted"]);
        assert_eq!(get(&h, "ce_type"), ["DeductAccepted"]);
        assert_eq!(get(&h, "ce_source"), ["/deductor/g"]);
        assert_eq!(get(&h, "ce_subject"), ["o-1"]);
        assert_eq!(get(&h, "ce_time"), ["2026-11-30T10:00:00.000Z"]);
        assert_eq!(
            get(&h, "traceparent"),
            ["00-4bf92f3577b34da6a3ce929d0e0e4736-0202020202020202-01"]
        );
        assert_eq!(get(&h, "tracestate"), ["k=v"]);
        assert_eq!(get(&h, "x-correlation-id"), ["c"]);
    }

    #[test]
    fn dead_letters_keep_the_original_headers_and_replace_the_trace() {
        let inc = Incoming {
            parent: SpanRef::parse(TP),
            tracestate: None,
            propagated: vec![],
            all: vec![
                ("traceparent".into(), Some(TP.as_bytes().to_vec())),
                ("x-any".into(), Some(b"1".to_vec())),
                ("x-null".into(), None),
            ],
            dropped: vec![],
        };
        let span = EventSpan::new(inc.parent, [1; 16], [3; 8]);
        let (h, left_out) = dead_letter(&span, &inc, None);
        assert_eq!(left_out, 0);
        assert_eq!(get(&h, "x-any"), ["1"]);
        assert_eq!(h.iter().filter(|x| x.key == "x-null").count(), 1);
        assert_eq!(
            get(&h, "traceparent"),
            ["00-4bf92f3577b34da6a3ce929d0e0e4736-0303030303030303-01"]
        );
    }

    #[test]
    fn tracestate_is_capped_by_whole_members() {
        assert_eq!(cap_tracestate(" k=v ").as_deref(), Some("k=v"));
        assert_eq!(cap_tracestate(""), None);
        // One member of 1 MB: nothing is left.
        assert_eq!(cap_tracestate(&"a".repeat(1 << 20)), None);
        // Long members go first, then members from the end.
        let long = format!("big={}", "x".repeat(200));
        let small: Vec<String> = (0..60).map(|i| format!("k{i:02}=v")).collect();
        let t = format!("{},{long},{}", small[..30].join(","), small[30..].join(","));
        let capped = cap_tracestate(&t).unwrap();
        assert!(capped.len() <= MAX_TRACESTATE_BYTES, "{}", capped.len());
        assert!(!capped.contains("big="));
        assert!(capped.starts_with("k00=v,k01=v"));
        assert!(
            capped.split(',').all(|m| m.len() == 5),
            "whole members: {capped}"
        );
    }

    #[test]
    fn oversized_copies_are_dropped_and_named() {
        let big = "c".repeat(MAX_PROPAGATED_VALUE_BYTES + 1);
        let ok = "d".repeat(MAX_PROPAGATED_VALUE_BYTES);
        let state = "s".repeat(1 << 20);
        let mut h = OwnedHeaders::new()
            .insert(Header {
                key: "tracestate",
                value: Some(state.as_bytes()),
            })
            .insert(Header {
                key: "X-Corr",
                value: Some(big.as_bytes()),
            });
        for _ in 0..5 {
            h = h.insert(Header {
                key: "x-tenant",
                value: Some(ok.as_bytes()),
            });
        }
        let allow = ["x-corr".to_owned(), "x-tenant".to_owned()];
        let inc = Incoming::read(Some(&h), &allow);
        assert_eq!(inc.tracestate, None);
        // Three of 4 KiB fit the 16 KiB total with their names; not four.
        assert_eq!(inc.propagated.len(), 3);
        assert_eq!(inc.dropped, ["tracestate", "x-corr", "x-tenant"]);
        let o = accepted();
        let span = EventSpan::new(None, [1; 16], [2; 8]);
        let out = outcome(&o, "s", &span, &inc);
        assert_eq!(get(&out, DROPPED), ["tracestate,x-corr,x-tenant"]);
        let bytes: usize = out
            .iter()
            .map(|x| x.key.len() + x.value.map_or(0, <[u8]>::len))
            .sum();
        assert!(bytes < MAX_PROPAGATED_TOTAL_BYTES + 2 * 1024, "{bytes}");
        let bare = outcome(&o, "s", &span, &inc.bare());
        assert!(get(&bare, "x-tenant").is_empty());
        assert_eq!(get(&bare, DROPPED), ["tracestate,x-corr,x-tenant"]);

        // A truncated dead letter keeps the original headers that fit.
        // (get keeps every value of a repeated name)
        let (dl, left_out) = dead_letter(&span, &inc, Some(2 * (ok.len() + 8)));
        assert_eq!(left_out, 4, "four of the five x-tenant");
        assert_eq!(get(&dl, "x-tenant").len(), 1);
        assert_eq!(get(&dl, "X-Corr").len(), 1);
        assert_eq!(get(&dl, DROPPED), ["tracestate"]);
        assert_eq!(original_bytes(&inc), big.len() + 6 + 5 * (ok.len() + 8));
    }
}
