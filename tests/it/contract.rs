//! The published contract (`contract/`) against the code, with a JSON Schema
//! validator the project did not write (the `jsonschema` crate):
//!
//! - every event fixture (the fuzz corpus, the contract's samples, the
//!   hostile inputs of tests/it/service/hostile_input.rs and the rule cases of
//!   src/domain/event/, and field-by-field mutations of the contract's
//!   examples) goes through both `domain::event::parse` and the event
//!   schemas, and the two must agree, except for the documented gaps of
//!   [`Gap`] (rules JSON Schema cannot express);
//! - the outcomes `domain::outcome` builds, for every decision and reason,
//!   validate against their schemas, and so do the invalid_event outcomes
//!   of every invalid fixture;
//! - the schemas are valid 2020-12 and carry the contract's version.
//!
//! scripts/check-contract checks the same files with check-jsonschema
//! (PyPI) and the AsyncAPI document with the official AsyncAPI schema.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::common::contract;
use deductor::domain::decision::{
    AcceptedLine, PlaceDecision, Reason, RefundDecision, RefundLineResult, Remaining,
};
use deductor::domain::event::{parse, Event, Id, InvalidEvent, InvalidKind, MAX_EVENT_BYTES};
use deductor::domain::outcome::{self, Source};
use serde_json::{json, Value};

/// The contract's version: every schema's `x-contract-version` and the
/// AsyncAPI document's `info.version`.
const CONTRACT_VERSION: &str = "1.0.0";

/// A rule of docs/contract.md section 1 that the parser enforces and JSON
/// Schema cannot express. These are the only disagreements allowed; each
/// is named in the event schemas' `description`, and each must be met by
/// at least one fixture (so the list stays true).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Gap {
    /// The value is at most 64 KiB: a schema sees a parsed document, not
    /// its bytes.
    Size,
    /// A named field given twice: a JSON reader keeps one of two equal
    /// keys, the parser refuses the event.
    DuplicateKey,
    /// No `promotion_id` twice: `uniqueItems` compares whole lines.
    DuplicatePromotion,
    /// JSON Schema calls `1.0`, `1e3` and `-0` integers; the parser admits
    /// only plain integer literals.
    NumberSpelling,
    /// A document nested deeper than serde_json's 128 levels inside an
    /// unknown field: the parser skips it unread, a validator cannot read
    /// the document at all.
    Depth,
}

impl Gap {
    /// The gap that explains a disagreement, if any.
    fn explain(
        bytes: &[u8],
        parsed: &Result<Event, InvalidEvent>,
        doc: &Option<Value>,
    ) -> Option<Gap> {
        match (parsed, doc) {
            // The parser refused what the schemas accept.
            (Err(e), Some(_)) => match e.kind {
                InvalidKind::TooLarge if bytes.len() > MAX_EVENT_BYTES => Some(Gap::Size),
                InvalidKind::Shape if e.detail.contains("duplicate field") => {
                    Some(Gap::DuplicateKey)
                }
                InvalidKind::DuplicatePromotion => Some(Gap::DuplicatePromotion),
                InvalidKind::InvalidAmount
                    if e.detail.contains("not an integer") || e.detail.contains("is negative") =>
                {
                    Some(Gap::NumberSpelling)
                }
                _ => None,
            },
            // The parser accepted what no validator can read.
            (Ok(_), None) => serde_json::from_slice::<Value>(bytes)
                .err()
                .filter(|e| e.to_string().contains("recursion limit"))
                .map(|_| Gap::Depth),
            _ => None,
        }
    }
}

/// The schemas' verdict: valid against `order-placed` or `order-refunded`.
/// A value that is not a JSON document is invalid for any schema.
fn schema_accepts(doc: &Option<Value>) -> bool {
    doc.as_ref().is_some_and(|d| {
        contract::validator("order-placed").is_valid(d)
            || contract::validator("order-refunded").is_valid(d)
    })
}

fn show(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.chars().count() > 160 {
        format!(
            "{}… ({} bytes)",
            s.chars().take(160).collect::<String>(),
            b.len()
        )
    } else {
        s.into_owned()
    }
}

// ------------------------------------------------------------ fixtures ---

fn placed_base() -> Value {
    json!({"type": "OrderPlaced", "event_id": "e-1001", "order_id": "o-77",
           "customer_id": "c-9", "occurred_at": "2026-11-29T10:00:00Z",
           "lines": [{"promotion_id": "flash-42", "budget": 1500, "stock": 1},
                     {"promotion_id": "full-200-30", "budget": 3000}]})
}

fn refunded_base() -> Value {
    json!({"type": "OrderRefunded", "event_id": "e-1002", "order_id": "o-77",
           "customer_id": "c-9", "occurred_at": "2026-11-30T08:00:00Z",
           "lines": [{"promotion_id": "flash-42"},
                     {"promotion_id": "full-200-30", "budget": 1000}]})
}

/// `doc` with the JSON text `raw` at `path` (`None`: the field removed).
fn with_raw(doc: &Value, path: &[&str], raw: Option<&str>) -> Vec<u8> {
    let mut v = doc.clone();
    let mut cur = &mut v;
    for p in &path[..path.len() - 1] {
        cur = match p.parse::<usize>() {
            Ok(n) => &mut cur[n],
            Err(_) => &mut cur[*p],
        };
    }
    let last = path[path.len() - 1];
    match (raw, last.parse::<usize>()) {
        (None, Ok(n)) => {
            cur.as_array_mut().map(|a| a.remove(n));
        }
        (None, Err(_)) => {
            cur.as_object_mut().map(|o| o.remove(last));
        }
        (Some(_), Ok(n)) => cur[n] = json!("<placeholder>"),
        (Some(_), Err(_)) => cur[last] = json!("<placeholder>"),
    }
    let text = serde_json::to_string(&v).unwrap();
    match raw {
        Some(raw) => text.replace("\"<placeholder>\"", raw),
        None => text,
    }
    .into_bytes()
}

fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// Ids: valid at the edges, and every forging or look-alike id of
/// tests/it/service/hostile_input.rs.
fn ids() -> Vec<String> {
    let mut v: Vec<String> = [
        "a",
        "A-Z_a.z-09",
        "e-1001",
        "",
        "o:1",
        "{p}",
        "p}",
        "{",
        "a b",
        "a\tb",
        "a\nb",
        "a\rb",
        "o-1\n",
        "\no-1",
        " o-1",
        "promo:{flash}:used:c1",
        "flash}:order:{o",
        "o\u{ff1a}1",
        "o\u{200b}1",
        "o\u{0}1",
        "\u{f6}",
        "*",
        "o?1",
        "[a]",
        "a\\b",
        "a/b",
        "a%3A",
        "٣",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("a".repeat(64));
    v.push("a".repeat(65));
    v.push("é".repeat(32));
    v
}

/// `occurred_at` values: RFC 3339 with its allowed variants, the calendar's
/// edges (month lengths, leap years), and near misses.
fn timestamps() -> Vec<String> {
    let mut v: Vec<String> = [
        "2026-11-29T10:00:00Z",
        "2026-11-29t10:00:00z",
        "2026-11-29 10:00:00Z",
        "2026-11-29T10:00:00.999999999+14:00",
        "2026-11-29T10:00:00.1234567891234Z",
        "2026-11-29T10:00:00.Z",
        "2026-11-29T10:00:00,5Z",
        "0000-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "2016-12-31T23:59:60Z",
        "2026-11-29T10:00:60Z",
        "2026-11-29T10:00:61Z",
        "2026-11-29T10:60:00Z",
        "2026-11-29T24:00:00Z",
        "2026-11-29T23:59:59-00:00",
        "2026-11-29T23:59:59+23:59",
        "2026-11-29T23:59:59+24:00",
        "2026-11-29T23:59:59+01:60",
        "2026-11-29T23:59:59+0100",
        "2026-11-29T23:59:59+01",
        "2026-11-29T10:00:00",
        "2026-11-29T10:00Z",
        "2026-11-29",
        "2026-11-29T10:00:00Z ",
        " 2026-11-29T10:00:00Z",
        "2026-11-29T10:00:00ZZ",
        "2026-11-29T10:00:00Z\n",
        "2026-11-29_10:00:00Z",
        "+12026-11-29T10:00:00Z",
        "12026-11-29T10:00:00Z",
        "26-11-29T10:00:00Z",
        "2026-1-29T10:00:00Z",
        "2026-11-29T1:00:00Z",
        "2026-00-10T10:00:00Z",
        "2026-13-01T00:00:00Z",
        "2026-11-00T00:00:00Z",
        "yesterday",
        "1700000000",
        "",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Every month's last day and the day after, in a common and a leap year.
    for year in ["2026", "2024"] {
        for (month, days) in [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
            .iter()
            .enumerate()
        {
            for day in [28, 29, 30, 31, 32] {
                if day + 1 >= *days {
                    v.push(format!("{year}-{:02}-{day:02}T12:00:00Z", month + 1));
                }
            }
        }
    }
    // February 29th: leap years by 4, 100, 400.
    for year in [
        "0000", "0004", "0100", "0400", "1600", "1700", "1900", "1996", "2000", "2023", "2024",
        "2100", "2400", "9996", "9999",
    ] {
        v.push(format!("{year}-02-29T00:00:00Z"));
    }
    v
}

/// Amount texts, from tests/it/service/hostile_input.rs.
const AMOUNTS: &[&str] = &[
    "0",
    "1",
    "1500",
    "1000000",
    "1000001",
    "1000000000000",
    "1000000000001",
    "9007199254740993",
    "18446744073709551615",
    "18446744073709551616",
    "1e3",
    "1E3",
    "1e0",
    "1.0",
    "1500.0",
    "15.5",
    "1.5e300",
    "-1",
    "-0",
    "-0.0",
    "\"10\"",
    "\" 5 \"",
    "true",
    "null",
    "[1]",
    "{}",
    "0x10",
    "010",
    "+1",
    "NaN",
    "Infinity",
    "-Infinity",
    ".5",
];

/// Values of any type for a field.
const ANY: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "77",
    "-1",
    "1.5",
    "\"\"",
    "\"x\"",
    "[]",
    "[1]",
    "{}",
    "{\"promotion_id\":\"p\"}",
    "\"OrderPlaced\"",
    "\"OrderRefunded\"",
    "\"orderplaced\"",
    "\"OrderCancelled\"",
    "[\"OrderPlaced\"]",
];

/// The rule cases of src/domain/event/tests.rs and of
/// tests/it/service/hostile_input.rs, and mutations of every field of both examples.
fn generated() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |name: String, b: Vec<u8>| out.push((name, b));
    for base in [placed_base(), refunded_base()] {
        let t = base["type"].as_str().unwrap().to_owned();
        add(format!("{t} example"), serde_json::to_vec(&base).unwrap());
        for field in [
            "type",
            "event_id",
            "order_id",
            "customer_id",
            "occurred_at",
            "lines",
        ] {
            add(
                format!("{t} without {field}"),
                with_raw(&base, &[field], None),
            );
            for raw in ANY {
                add(
                    format!("{t} {field}={raw}"),
                    with_raw(&base, &[field], Some(raw)),
                );
            }
        }
        for field in ["event_id", "order_id", "customer_id"] {
            for id in ids() {
                add(
                    format!("{t} {field}={id:?}"),
                    with_raw(&base, &[field], Some(&quoted(&id))),
                );
            }
        }
        for id in ids() {
            add(
                format!("{t} promotion_id={id:?}"),
                with_raw(&base, &["lines", "0", "promotion_id"], Some(&quoted(&id))),
            );
        }
        // Escaped forms of forbidden and allowed characters.
        for raw in [
            r#""o\u003a1""#,
            r#""\u007bp\u007d""#,
            r#""o\u00201""#,
            r#""\u0041""#,
            r#""e\ud800""#,
        ] {
            add(
                format!("{t} order_id={raw}"),
                with_raw(&base, &["order_id"], Some(raw)),
            );
        }
        for ts in timestamps() {
            add(
                format!("{t} occurred_at={ts:?}"),
                with_raw(&base, &["occurred_at"], Some(&quoted(&ts))),
            );
        }
        for field in ["budget", "stock"] {
            add(
                format!("{t} line without {field}"),
                with_raw(&base, &["lines", "0", field], None),
            );
            for raw in AMOUNTS.iter().chain(ANY) {
                add(
                    format!("{t} {field}={raw}"),
                    with_raw(&base, &["lines", "0", field], Some(raw)),
                );
            }
        }
        add(
            format!("{t} line without promotion_id"),
            with_raw(&base, &["lines", "0", "promotion_id"], None),
        );
        for raw in ANY {
            add(
                format!("{t} lines[0]={raw}"),
                with_raw(&base, &["lines", "0"], Some(raw)),
            );
            add(
                format!("{t} promotion_id={raw}"),
                with_raw(&base, &["lines", "0", "promotion_id"], Some(raw)),
            );
        }
        let lines = |n: usize| {
            serde_json::to_string(
                &(0..n)
                    .map(|i| json!({"promotion_id": format!("p{i}")}))
                    .collect::<Vec<_>>(),
            )
            .unwrap()
        };
        for n in [1, 31, 32, 33, 64] {
            add(
                format!("{t} {n} lines"),
                with_raw(&base, &["lines"], Some(&lines(n))),
            );
        }
        add(
            format!("{t} duplicate promotion"),
            with_raw(&base, &["lines", "1", "promotion_id"], Some("\"flash-42\"")),
        );
        add(
            format!("{t} promotion ids differing in case"),
            with_raw(&base, &["lines", "1", "promotion_id"], Some("\"FLASH-42\"")),
        );
        add(
            format!("{t} unknown fields"),
            with_raw(&base, &["x"], Some(r#"{"y":[1,2,{"z":null}]}"#)),
        );
        add(
            format!("{t} unknown line field"),
            with_raw(&base, &["lines", "0", "note"], Some("\"n\"")),
        );
        // Duplicate keys: each named field again, and an unknown one twice.
        let text = String::from_utf8(serde_json::to_vec(&base).unwrap()).unwrap();
        for key in [
            "type",
            "event_id",
            "order_id",
            "customer_id",
            "occurred_at",
            "lines",
            "x",
        ] {
            let value = serde_json::to_string(base.get(key).unwrap_or(&json!(1))).unwrap();
            add(
                format!("{t} {key} twice"),
                format!("{},\"{key}\":{value}}}", &text[..text.len() - 1]).into_bytes(),
            );
        }
        for key in ["promotion_id", "budget", "stock", "x"] {
            let first = text.find("\"flash-42\"").unwrap() + "\"flash-42\"".len();
            let b = format!(
                "{},\"{key}\":\"flash-42\"{}",
                &text[..first],
                &text[first..]
            );
            let b = b.replacen(
                &format!(",\"{key}\":\"flash-42\""),
                &format!(
                    ",\"{key}\":{}",
                    if key == "promotion_id" {
                        "\"flash-42\""
                    } else {
                        "1"
                    }
                ),
                1,
            );
            add(format!("{t} line {key} twice"), b.into_bytes());
        }
        // Size: exactly at the limit, one byte over, far over.
        let mut v = base.clone();
        v["pad"] = json!("");
        let n = serde_json::to_vec(&v).unwrap().len();
        for pad in [
            MAX_EVENT_BYTES - n,
            MAX_EVENT_BYTES - n + 1,
            2 * MAX_EVENT_BYTES,
        ] {
            v["pad"] = json!("x".repeat(pad));
            add(
                format!("{t} padded by {pad}"),
                serde_json::to_vec(&v).unwrap(),
            );
        }
        // Depth: deep unknown fields (the parser skips them), deep lines.
        let arrays = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        let objects = |n: usize| format!("{}1{}", "{\"\":".repeat(n), "}".repeat(n));
        for depth in [100, 127, 200, 5000] {
            add(
                format!("{t} junk {depth} arrays deep"),
                with_raw(&base, &["junk"], Some(&arrays(depth))),
            );
            add(
                format!("{t} junk {depth} objects deep"),
                with_raw(&base, &["junk"], Some(&objects(depth))),
            );
            add(
                format!("{t} line {depth} arrays deep"),
                with_raw(&base, &["lines", "0", "junk"], Some(&arrays(depth))),
            );
        }
        // Not UTF-8, a byte order mark, whitespace around.
        let good = serde_json::to_vec(&base).unwrap();
        for seq in [
            &b"\xff"[..],
            b"\xc0\x80",
            b"\xed\xa0\x80",
            b"\xf4\x90\x80\x80",
            b"\xe2\x82",
            b"\x80",
        ] {
            let mut b = good.clone();
            b.splice(10..10, seq.iter().copied());
            add(format!("{t} with invalid UTF-8 {seq:?}"), b);
        }
        add(
            format!("{t} with a BOM"),
            [b"\xef\xbb\xbf".as_slice(), &good].concat(),
        );
        add(
            format!("{t} with whitespace"),
            [b" \n\t".as_slice(), &good, b"\r\n"].concat(),
        );
        add(
            format!("{t} followed by junk"),
            [good.as_slice(), b"x"].concat(),
        );
        add(format!("{t} twice"), [good.as_slice(), &good].concat());
    }
    for (name, doc) in [
        ("empty", ""),
        ("not json", "{nope"),
        ("null", "null"),
        ("true", "true"),
        ("number", "1"),
        ("string", "\"OrderPlaced\""),
        ("empty array", "[]"),
        ("array of object", "[{}]"),
        ("empty object", "{}"),
        (
            "positional array",
            r#"["OrderPlaced","e1","o1","c1","2026-11-29T10:00:00Z",[{"promotion_id":"p"}]]"#,
        ),
        (
            "minimal",
            r#"{"type":"OrderPlaced","event_id":"e","order_id":"o","customer_id":"c","occurred_at":"2026-11-29T10:00:00Z","lines":[{"promotion_id":"p"}]}"#,
        ),
    ] {
        add(name.to_owned(), doc.as_bytes().to_vec());
    }
    out
}

/// Files: the fuzz corpus and the contract's event samples.
fn files() -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in [
        "fuzz/seeds/parse_event",
        "fuzz/corpus/parse_event",
        "contract/examples/valid",
        "contract/examples/invalid",
    ] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if dir.starts_with("contract") && !name.starts_with("order-") {
                continue;
            }
            out.push((format!("{dir}/{name}"), std::fs::read(&p).unwrap()));
        }
    }
    out
}

// --------------------------------------------------------------- tests ---

#[test]
fn the_schemas_are_valid_json_schema_2020_12_and_versioned() {
    for stem in contract::SCHEMAS {
        let schema = contract::load(stem);
        assert_eq!(
            schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
            "{stem}"
        );
        if let Err(e) = jsonschema::meta::validate(&schema) {
            panic!("contract/{stem}.schema.json breaks the 2020-12 metaschema: {e}");
        }
        assert_eq!(schema["x-contract-version"], CONTRACT_VERSION, "{stem}");
        // Build it (panics with the reason when a keyword is malformed).
        contract::validator(stem);
    }
    let asyncapi = std::fs::read_to_string(contract::dir().join("asyncapi.yaml")).unwrap();
    assert!(
        asyncapi.contains(&format!(
            "\ninfo:\n  title: deductor\n  version: {CONTRACT_VERSION}\n"
        )),
        "asyncapi.yaml's info.version is the contract's version"
    );
    // Every schema file is referenced from the AsyncAPI document.
    for stem in contract::SCHEMAS {
        assert!(
            asyncapi.contains(&format!("$ref: ./{stem}.schema.json")),
            "asyncapi.yaml does not reference {stem}.schema.json"
        );
    }
}

#[test]
fn every_fixture_gets_the_same_verdict_from_the_parser_and_the_schemas() {
    let fixtures: Vec<(String, Vec<u8>)> = files().into_iter().chain(generated()).collect();
    assert!(fixtures.len() > 1000, "only {} fixtures", fixtures.len());
    let mut gaps_met: BTreeMap<Gap, usize> = BTreeMap::new();
    let mut disagreements = Vec::new();
    let (mut valid, mut invalid) = (0, 0);
    for (name, bytes) in &fixtures {
        let parsed = parse(bytes);
        let doc: Option<Value> = serde_json::from_slice(bytes).ok();
        let schema_ok = schema_accepts(&doc);
        if let Ok(event) = &parsed {
            valid += 1;
            // Valid for the schema of its own type, not just either.
            if let Some(d) = &doc {
                let stem = match event {
                    Event::Placed(_) => "order-placed",
                    Event::Refunded(_) => "order-refunded",
                };
                let errs = contract::errors(stem, d);
                if !errs.is_empty() && Gap::explain(bytes, &parsed, &doc).is_none() {
                    disagreements.push(format!(
                        "{name}: parsed as {stem}, but: {errs:?}\n    {}",
                        show(bytes)
                    ));
                    continue;
                }
            }
        } else {
            invalid += 1;
        }
        if parsed.is_ok() == schema_ok {
            continue;
        }
        match Gap::explain(bytes, &parsed, &doc) {
            Some(gap) => *gaps_met.entry(gap).or_default() += 1,
            None => disagreements.push(format!(
                "{name}: parser {}, schemas {}\n    {}",
                match &parsed {
                    Ok(_) => "accepts".to_owned(),
                    Err(e) => format!("refuses ({e})"),
                },
                if schema_ok { "accept" } else { "refuse" },
                show(bytes)
            )),
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} of {} fixtures disagree (outside the documented gaps):\n  {}",
        disagreements.len(),
        fixtures.len(),
        disagreements.join("\n  ")
    );
    let all = [
        Gap::Size,
        Gap::DuplicateKey,
        Gap::DuplicatePromotion,
        Gap::NumberSpelling,
        Gap::Depth,
    ];
    let unmet: Vec<_> = all.iter().filter(|g| !gaps_met.contains_key(g)).collect();
    assert!(
        unmet.is_empty(),
        "documented gaps no fixture meets: {unmet:?} (met: {gaps_met:?})"
    );
    eprintln!(
        "{} fixtures: {valid} valid, {invalid} invalid; gaps met: {gaps_met:?}",
        fixtures.len()
    );
}

/// The samples of contract/examples are what their folder says, for the
/// `jsonschema` crate too (scripts/check-contract checks them with
/// check-jsonschema).
#[test]
fn the_contract_samples_are_valid_or_invalid_as_filed() {
    for (folder, want) in [("valid", true), ("invalid", false)] {
        let dir = contract::dir().join("examples").join(folder);
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let stem = if name.starts_with("dead-letter") {
                "dead-letter-headers"
            } else {
                contract::stem_of_type(doc["type"].as_str().unwrap_or_default())
                    .unwrap_or("order-placed")
            };
            let errs = contract::errors(stem, &doc);
            assert_eq!(
                errs.is_empty(),
                want,
                "{folder}/{name} against {stem}: {errs:?}"
            );
            n += 1;
        }
        assert!(n > 0, "no samples in {}", dir.display());
    }
}

fn id(s: &str) -> Id {
    Id::parse(s).unwrap()
}

fn src() -> Source {
    Source {
        topic: "orders".into(),
        partition: 3,
        offset: 1207,
    }
}

const REMAININGS: [Remaining; 4] = [
    Remaining {
        budget: None,
        stock: None,
    },
    Remaining {
        budget: Some(0),
        stock: Some(0),
    },
    Remaining {
        budget: Some(98_500),
        stock: None,
    },
    Remaining {
        budget: Some(999_999_999_999_999),
        stock: Some(999_999_999_999_999),
    },
];

const PLACE_REASONS: [Reason; 7] = [
    Reason::BudgetExceeded,
    Reason::StockInsufficient,
    Reason::UserLimitReached,
    Reason::PromotionNotFound,
    Reason::PromotionInactive,
    Reason::OrderReverted,
    Reason::CorruptPromotion,
];

const REFUND_REASONS: [Reason; 4] = [
    Reason::NoDeduction,
    Reason::AlreadyReverted,
    Reason::ExceedsDeducted,
    Reason::CorruptPromotion,
];

/// Every kind of outcome the code builds, for every reason it can carry.
#[test]
fn the_outcomes_the_code_builds_match_their_schemas() {
    let Ok(Event::Placed(placed)) = parse(&serde_json::to_vec(&placed_base()).unwrap()) else {
        panic!("placed example")
    };
    let Ok(Event::Refunded(refunded)) = parse(&serde_json::to_vec(&refunded_base()).unwrap())
    else {
        panic!("refunded example")
    };
    let at = outcome::timestamp(chrono::Utc::now());
    let mut built = Vec::new();
    for duplicate in [false, true] {
        for r in REMAININGS {
            let lines = placed
                .lines
                .iter()
                .map(|l| AcceptedLine {
                    promotion_id: l.promotion_id.clone(),
                    budget: l.budget,
                    stock: l.stock,
                    remaining: r,
                })
                .collect();
            built.push(outcome::placed(
                &placed,
                &PlaceDecision::Accepted { duplicate, lines },
                &src(),
                &at,
            ));
        }
        for reason in PLACE_REASONS {
            let d = PlaceDecision::Rejected {
                duplicate,
                reason,
                promotion_id: id("full-200-30"),
            };
            built.push(outcome::placed(&placed, &d, &src(), &at));
        }
        // Refunds: every mix of applied and rejected lines.
        let statuses: Vec<Result<(), Reason>> = std::iter::once(Ok(()))
            .chain(REFUND_REASONS.iter().map(|r| Err(*r)))
            .collect();
        for first in &statuses {
            for second in &statuses {
                for r in REMAININGS {
                    let line = |p: &str, status: Result<(), Reason>| RefundLineResult {
                        promotion_id: id(p),
                        status,
                        duplicate,
                        budget: if status.is_ok() { 1500 } else { 0 },
                        stock: if status.is_ok() { 1 } else { 0 },
                        remaining: r,
                    };
                    let d = RefundDecision {
                        lines: vec![line("flash-42", *first), line("full-200-30", *second)],
                    };
                    built.push(outcome::refunded(&refunded, &d, &src(), &at));
                }
            }
        }
    }
    // invalid_event rejections of every invalid fixture that names an order.
    for (_, bytes) in files().into_iter().chain(generated()) {
        if let Err(e) = parse(&bytes) {
            built.extend(outcome::invalid(&e, &src(), &at));
        }
    }
    let mut types = BTreeSet::new();
    let mut invalid_events = 0;
    for o in &built {
        let v = o.json();
        contract::assert_outcome(&v);
        types.insert(v["type"].as_str().unwrap().to_owned());
        invalid_events += usize::from(v["reason"] == "invalid_event");
    }
    assert_eq!(types.len(), 4, "{types:?}");
    assert!(
        invalid_events > 100,
        "only {invalid_events} invalid_event outcomes"
    );

    // And the schemas can fail: each of these breaks a rule.
    let accepted = built
        .iter()
        .find(|o| o.json()["type"] == "DeductAccepted")
        .unwrap()
        .json();
    let rejected = built
        .iter()
        .find(|o| o.json()["type"] == "DeductRejected")
        .unwrap()
        .json();
    let broken = [
        {
            let mut v = accepted.clone();
            v.as_object_mut().unwrap().remove("source");
            v
        },
        {
            let mut v = accepted.clone();
            v["lines"][0]["remaining"]["budget"] = json!(-1);
            v
        },
        {
            let mut v = accepted.clone();
            v["processed_at"] = json!("2026-11-29T10:00:00Z");
            v
        },
        {
            let mut v = rejected.clone();
            v["reason"] = json!("no_deduction");
            v
        },
        {
            let mut v = rejected.clone();
            v["outcome_id"] = json!("e-1001:DeductAccepted");
            v
        },
    ];
    for v in broken {
        assert!(
            !contract::outcome_errors(&v).is_empty(),
            "accepted a broken outcome: {v}"
        );
    }
}

/// The dead-letter header set names exactly the `deductor.*` headers the
/// publisher writes (read from its source: the names are string literals
/// there), and the trace context headers.
#[test]
fn the_dead_letter_header_set_names_what_the_publisher_writes() {
    let schema = contract::load("dead-letter-headers");
    let documented: BTreeSet<String> = schema["properties"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with("deductor."))
        .cloned()
        .collect();
    // The trace context the dead letter carries (src/kafka/headers.rs).
    for h in [
        deductor::kafka::headers::TRACEPARENT,
        deductor::kafka::headers::TRACESTATE,
    ] {
        assert!(
            schema["properties"].get(h).is_some(),
            "contract/dead-letter-headers.schema.json does not document {h}"
        );
    }
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kafka/publisher.rs"),
    )
    .unwrap();
    let mut written: BTreeSet<String> = source
        .match_indices("header(\"deductor.")
        .map(|(i, m)| {
            let rest = &source[i + m.len() - "deductor.".len()..];
            rest[..rest.find('"').unwrap()].to_owned()
        })
        .collect();
    // And the names src/kafka/headers.rs defines for them.
    let names =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kafka/headers.rs"))
            .unwrap();
    written.extend(names.match_indices("&str = \"deductor.").map(|(i, m)| {
        let rest = &names[i + m.len() - "deductor.".len()..];
        rest[..rest.find('"').unwrap()].to_owned()
    }));
    assert_eq!(
        documented, written,
        "contract/dead-letter-headers.schema.json vs src/kafka/publisher.rs"
    );
    let kinds: BTreeSet<&str> = schema["properties"]["deductor.error.kind"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    // Every InvalidKind the parser reports is in the enum (the fixtures
    // above meet all of them).
    let mut seen = BTreeSet::new();
    for (_, bytes) in files().into_iter().chain(generated()) {
        if let Err(e) = parse(&bytes) {
            seen.insert(e.kind.as_str());
        }
    }
    assert_eq!(seen.len(), 11, "fixtures meet every invalid kind: {seen:?}");
    assert!(
        seen.is_subset(&kinds),
        "kinds missing from the schema: {:?}",
        seen.difference(&kinds)
    );
}
