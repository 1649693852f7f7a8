//! `domain::event::parse` on arbitrary bytes: it never panics, and it never
//! accepts what CONTRACT.md section 1 forbids. Every accepted event is checked
//! against an oracle written apart from the parser: the value is at most
//! 64 KiB of UTF-8 holding one JSON object; no field the contract names
//! appears twice (at the top or in a line); `type` is one of the two; the
//! ids are 1-64 of `A-Z a-z 0-9 _ . -`; `occurred_at` is RFC 3339 and equals
//! the parsed time; 1-32 lines, each an object with a distinct promotion id;
//! amounts are plain JSON integers within their limits, absent meaning 0 on
//! a placement and "everything" on a refund.

#![no_main]

use std::collections::HashSet;
use std::fmt;

use deductor::domain::event::{parse, Event, InvalidKind};
use libfuzzer_sys::fuzz_target;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

const TOP: [&str; 6] = [
    "type",
    "event_id",
    "order_id",
    "customer_id",
    "occurred_at",
    "lines",
];
const LINE: [&str; 3] = ["promotion_id", "budget", "stock"];

/// A JSON object's entries in document order, duplicates kept.
struct Entries<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Entries<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Entries<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Entries<'a>, M::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, &'de RawValue>()? {
                    out.push((k, v));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// Lines as a sequence of objects.
struct Lines<'a>(Vec<Entries<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for Lines<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Lines<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut s: S) -> Result<Lines<'a>, S::Error> {
                let mut out = Vec::new();
                while let Some(e) = s.next_element::<Entries<'de>>()? {
                    out.push(e);
                }
                Ok(Lines(out))
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }
}

fn only_once<'a>(entries: &'a Entries<'a>, known: &[&str]) -> Vec<(&'a str, &'a RawValue)> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (k, v) in &entries.0 {
        if known.contains(&k.as_str()) {
            assert!(seen.insert(k.as_str()), "accepted a duplicate key {k:?}");
            out.push((k.as_str(), *v));
        }
    }
    out
}

fn get<'a>(fields: &[(&str, &'a RawValue)], name: &str) -> Option<&'a RawValue> {
    fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

fn id_ok(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

fn string(raw: &RawValue) -> String {
    match serde_json::from_str::<Value>(raw.get()) {
        Ok(Value::String(s)) => s,
        other => panic!("accepted a non-string where a string is required: {other:?}"),
    }
}

/// `None` when absent; panics unless a plain integer <= max.
fn amount(raw: Option<&RawValue>, max: u64) -> Option<u64> {
    let raw = raw?;
    let text = raw.get();
    assert!(
        text.bytes().all(|b| b.is_ascii_digit()) && (text == "0" || !text.starts_with('0')),
        "accepted the amount {text}"
    );
    let n: u64 = text.parse().expect("digits");
    assert!(n <= max, "accepted {n} above {max}");
    Some(n)
}

fn check(data: &[u8], event: &Event) {
    assert!(data.len() <= 64 * 1024, "accepted {} bytes", data.len());
    let text = std::str::from_utf8(data).expect("accepted invalid UTF-8");
    // The oracle's own parse may hit serde_json's depth limit on a deep
    // unknown field the parser rightly skipped; nothing to compare then.
    let Ok(top) = serde_json::from_str::<Entries>(text) else {
        assert!(text.trim_start().starts_with('{'), "accepted a non-object");
        return;
    };
    let fields = only_once(&top, &TOP);
    let h = event.header();
    let kind = string(get(&fields, "type").expect("type"));
    match (kind.as_str(), event) {
        ("OrderPlaced", Event::Placed(_)) | ("OrderRefunded", Event::Refunded(_)) => {}
        _ => panic!("accepted type {kind:?} as {event:?}"),
    }
    for (name, id) in [
        ("event_id", &h.event_id),
        ("order_id", &h.order_id),
        ("customer_id", &h.customer_id),
    ] {
        let s = string(get(&fields, name).expect("id present"));
        assert!(id_ok(&s), "accepted {name} {s:?}");
        assert_eq!(s, id.as_str());
    }
    let at = string(get(&fields, "occurred_at").expect("occurred_at"));
    let t = chrono::DateTime::parse_from_rfc3339(&at).expect("accepted a non-RFC 3339 time");
    assert_eq!(t.timestamp(), h.occurred_at);

    let lines_raw = get(&fields, "lines").expect("lines");
    let Ok(lines) = serde_json::from_str::<Lines>(lines_raw.get()) else {
        panic!(
            "accepted lines that are not an array of objects: {}",
            lines_raw.get()
        );
    };
    let n = lines.0.len();
    assert!((1..=32).contains(&n), "accepted {n} lines");
    let mut promos = HashSet::new();
    for (i, line) in lines.0.iter().enumerate() {
        let lf = only_once(line, &LINE);
        let p = string(get(&lf, "promotion_id").expect("promotion_id"));
        assert!(id_ok(&p), "accepted promotion_id {p:?}");
        assert!(promos.insert(p.clone()), "accepted promotion {p} twice");
        let budget = amount(get(&lf, "budget"), 1_000_000_000_000);
        let stock = amount(get(&lf, "stock"), 1_000_000);
        match event {
            Event::Placed(e) => {
                let l = &e.lines[i];
                assert_eq!(l.promotion_id.as_str(), p);
                assert_eq!(
                    (l.budget, l.stock),
                    (budget.unwrap_or(0), stock.unwrap_or(0))
                );
            }
            Event::Refunded(e) => {
                let l = &e.lines[i];
                assert_eq!(l.promotion_id.as_str(), p);
                assert_eq!((l.budget, l.stock), (budget, stock));
            }
        }
    }
    let parsed_lines = match event {
        Event::Placed(e) => e.lines.len(),
        Event::Refunded(e) => e.lines.len(),
    };
    assert_eq!(parsed_lines, n);
}

fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(event) => check(data, &event),
        Err(e) => {
            assert!(!e.detail.is_empty());
            if e.kind == InvalidKind::TooLarge {
                assert!(data.len() > 64 * 1024);
            }
            // What is salvaged for the invalid_event outcome is valid ids only.
            for id in [
                &e.salvage.order_id,
                &e.salvage.event_id,
                &e.salvage.customer_id,
            ]
            .into_iter()
            .flatten()
            {
                assert!(id_ok(id.as_str()));
            }
        }
    }
});
