//! Hostile input: what a broken or malicious producer can put on the order
//! topic. Oversized values, deep nesting, invalid UTF-8, duplicate JSON keys,
//! numbers in every disguise, and ids that try to forge another key or hash
//! slot, through `domain::event::parse`; then a few of them end to end
//! through Kafka and the running service, which must dead-letter each one
//! unchanged and write nothing to Redis.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::kafka::{self, Raw};
use crate::common::{redis, service};
use deductor::admin::PromoSpec;
use deductor::domain::event::{parse, Event, InvalidKind, MAX_EVENT_BYTES};
use deductor::domain::keys::Keys;
use proptest::prelude::*;
use serde_json::{json, Value};

fn base() -> Value {
    json!({"type": "OrderPlaced", "event_id": "e-1", "order_id": "o-1",
           "customer_id": "c-1", "occurred_at": "2026-11-29T10:00:00Z",
           "lines": [{"promotion_id": "flash-42", "budget": 1500, "stock": 1},
                     {"promotion_id": "full-200-30", "budget": 3000}]})
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// `Ok(())` for a valid event, else the kind.
fn verdict(b: &[u8]) -> Result<(), InvalidKind> {
    parse(b).map(drop).map_err(|e| e.kind)
}

fn show(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    s.chars().take(200).collect()
}

/// `base()` with a raw JSON text replacing `"<placeholder>"`.
fn with_raw(path: &[&str], raw: &str) -> Vec<u8> {
    let mut v = base();
    let mut cur = &mut v;
    for p in &path[..path.len() - 1] {
        cur = match p.parse::<usize>() {
            Ok(n) => &mut cur[n],
            Err(_) => &mut cur[*p],
        };
    }
    let last = path[path.len() - 1];
    match last.parse::<usize>() {
        Ok(n) => cur[n] = json!("<placeholder>"),
        Err(_) => cur[last] = json!("<placeholder>"),
    }
    String::from_utf8(bytes(&v))
        .unwrap()
        .replace("\"<placeholder>\"", raw)
        .into_bytes()
}

#[test]
fn the_size_limit_is_exact_and_cheap() {
    // Pad an unknown field so the document is exactly the limit.
    let mut v = base();
    v["pad"] = json!("");
    let n = bytes(&v).len();
    v["pad"] = json!("x".repeat(MAX_EVENT_BYTES - n));
    let at_limit = bytes(&v);
    assert_eq!(at_limit.len(), MAX_EVENT_BYTES);
    assert_eq!(verdict(&at_limit), Ok(()));
    v["pad"] = json!("x".repeat(MAX_EVENT_BYTES - n + 1));
    assert_eq!(verdict(&bytes(&v)), Err(InvalidKind::TooLarge));

    // 16 MiB of garbage is refused on its length, before any parsing.
    let huge = vec![b'['; 16 << 20];
    let started = std::time::Instant::now();
    assert_eq!(verdict(&huge), Err(InvalidKind::TooLarge));
    assert!(started.elapsed() < Duration::from_millis(200));
    // An oversized event still names its order, for the invalid_event outcome.
    let e = parse(&bytes(&v)).unwrap_err();
    assert_eq!(e.salvage.order_id.unwrap().as_str(), "o-1");
}

/// The 64 KiB cap bounds how deep a document can nest; parsing the deepest
/// ones must fit well within a tokio worker's 2 MiB stack (the service parses
/// on its workers). Nested objects in ignored fields cost stack in
/// proportion to their depth (about 200 KiB at the cap in release builds,
/// more in debug), so this runs on a 1 MiB thread.
#[test]
fn deep_nesting_never_overflows_the_stack() {
    std::thread::Builder::new()
        .stack_size(1024 * 1024)
        .spawn(|| {
            let room = MAX_EVENT_BYTES - 300;
            let arrays = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
            let objects = |n: usize| format!("{}1{}", "{\"\":".repeat(n), "}".repeat(n));
            let (deep_array, deep_object) = (arrays(room / 2), objects(room / 5));
            // As the whole document, as the lines, as a line, as an amount.
            assert_eq!(verdict(deep_array.as_bytes()), Err(InvalidKind::NotJson));
            // (an object of one unknown key "": no type)
            assert_eq!(
                verdict(deep_object.as_bytes()),
                Err(InvalidKind::MissingField)
            );
            assert_eq!(
                verdict(&with_raw(&["lines"], &deep_array)),
                Err(InvalidKind::NotJson)
            );
            assert_eq!(
                verdict(&with_raw(&["lines", "0"], &deep_object)),
                Err(InvalidKind::NotJson)
            );
            assert!(verdict(&with_raw(&["lines", "0", "budget"], &deep_array)).is_err());
            // In an unknown field of the event it is ignored like any
            // unknown field; inside a line, the lines' own parse (serde_json's
            // 128-level limit) refuses it as not JSON.
            assert_eq!(verdict(&with_raw(&["junk"], &deep_array)), Ok(()));
            assert_eq!(verdict(&with_raw(&["junk"], &deep_object)), Ok(()));
            assert_eq!(
                verdict(&with_raw(&["lines", "0", "junk"], &deep_object)),
                Err(InvalidKind::NotJson)
            );
            // Never closed.
            assert!(verdict("[".repeat(room).as_bytes()).is_err());
            assert!(verdict("{\"\":".repeat(room / 4).as_bytes()).is_err());
            assert!(verdict(&with_raw(&["junk"], &"{\"a\":".repeat(room / 5))).is_err());
        })
        .unwrap()
        .join()
        .expect("parsing overflowed a 1 MiB stack");
}

#[test]
fn invalid_utf8_anywhere_is_refused() {
    let good = bytes(&base());
    let bad_sequences: [&[u8]; 6] = [
        b"\xff",
        b"\xc0\x80",         // overlong NUL
        b"\xed\xa0\x80",     // a UTF-16 surrogate encoded as UTF-8
        b"\xf4\x90\x80\x80", // above U+10FFFF
        b"\xe2\x82",         // truncated
        b"\x80",             // lone continuation byte
    ];
    // Inside the event id, a key, the whitespace, the end.
    let text = String::from_utf8(good.clone()).unwrap();
    let places = [
        text.find("e-1").unwrap() + 1,
        text.find("order_id").unwrap() + 2,
        text.find(',').unwrap() + 1,
        good.len() - 1,
    ];
    for seq in bad_sequences {
        for &at in &places {
            let mut b = good.clone();
            b.splice(at..at, seq.iter().copied());
            assert_eq!(verdict(&b), Err(InvalidKind::NotUtf8), "{}", show(&b));
            assert_eq!(parse(&b).unwrap_err().salvage, Default::default());
        }
    }
    // Escapes that are not characters, a byte order mark, NUL escapes.
    for (what, b) in [
        ("lone surrogate", with_raw(&["event_id"], r#""e\ud800""#)),
        ("BOM", [b"\xef\xbb\xbf".as_slice(), &good].concat()),
    ] {
        assert_eq!(verdict(&b), Err(InvalidKind::NotJson), "{what}");
    }
    let nul = with_raw(&["order_id"], r#""o\u0000""#);
    assert_eq!(verdict(&nul), Err(InvalidKind::InvalidId));
}

#[test]
fn duplicate_keys_are_refused_not_collapsed() {
    let text = String::from_utf8(bytes(&base())).unwrap();
    for key in [
        "type",
        "event_id",
        "order_id",
        "customer_id",
        "occurred_at",
        "lines",
    ] {
        // The key again at the end, with a value that would be valid alone.
        let extra = match key {
            "type" => r#""OrderRefunded""#.to_owned(),
            "lines" => r#"[{"promotion_id":"other"}]"#.to_owned(),
            "occurred_at" => r#""2026-11-30T10:00:00Z""#.to_owned(),
            _ => r#""x-2""#.to_owned(),
        };
        let b = format!("{},\"{key}\":{extra}}}", &text[..text.len() - 1]);
        assert_eq!(verdict(b.as_bytes()), Err(InvalidKind::Shape), "{key}: {b}");
    }
    for key in ["promotion_id", "budget", "stock"] {
        let b = text.replacen("\"stock\":1}", &format!("\"stock\":1,\"{key}\":2}}"), 1);
        assert_eq!(
            verdict(b.as_bytes()),
            Err(InvalidKind::Shape),
            "line {key}: {b}"
        );
    }
    // An unknown key twice is still just unknown.
    let b = format!("{},\"x\":1,\"x\":2}}", &text[..text.len() - 1]);
    assert_eq!(verdict(b.as_bytes()), Ok(()));
}

/// Ids that would forge another key or hash slot, or that only look safe.
const FORGING_IDS: &[&str] = &[
    "",
    "o:1",
    "{p}",
    "p}",
    "{",
    "a b",
    "a\tb",
    "a\nb",
    "a\rb",
    "promo:{flash}:used:c1",
    "flash}:order:{o",
    "o\u{ff1a}1", // fullwidth colon
    "o\u{200b}1", // zero-width space
    "o\u{0}1",    // NUL
    "\u{f6}",     // a non-ASCII letter
    "*",
    "o?1",
    "[a]",
    "a\\b",
    "a/b",
    "a%3A",
];

#[test]
fn ids_that_forge_keys_or_slots_are_refused() {
    let long = "a".repeat(65);
    let ids: Vec<&str> = FORGING_IDS.iter().copied().chain([long.as_str()]).collect();
    for field in [
        &["event_id"][..],
        &["order_id"],
        &["customer_id"],
        &["lines", "0", "promotion_id"],
    ] {
        for id in &ids {
            let mut v = base();
            match field {
                [f] => v[*f] = json!(id),
                [_, i, f] => v["lines"][i.parse::<usize>().unwrap()][*f] = json!(id),
                _ => unreachable!(),
            }
            assert_eq!(
                verdict(&bytes(&v)),
                Err(InvalidKind::InvalidId),
                "{field:?} = {id:?}"
            );
        }
    }
    // The escaped forms decode to the same characters and are refused too.
    for raw in [r#""o\u003a1""#, r#""\u007bp\u007d""#, r#""o\u00201""#] {
        assert_eq!(
            verdict(&with_raw(&["order_id"], raw)),
            Err(InvalidKind::InvalidId),
            "{raw}"
        );
    }
}

#[test]
fn amounts_admit_only_plain_integers_in_range() {
    use InvalidKind::*;
    let cases: &[(&str, Result<(), InvalidKind>)] = &[
        ("0", Ok(())),
        ("1000000000000", Ok(())),
        ("1000000000001", Err(InvalidAmount)),
        ("9007199254740993", Err(InvalidAmount)),
        ("18446744073709551616", Err(InvalidAmount)),
        ("1e3", Err(InvalidAmount)),
        ("1E3", Err(InvalidAmount)),
        ("1.0", Err(InvalidAmount)),
        ("1.5e300", Err(InvalidAmount)),
        ("-1", Err(InvalidAmount)),
        ("-0", Err(InvalidAmount)),
        ("\"10\"", Err(InvalidAmount)),
        ("\" 5 \"", Err(InvalidAmount)),
        ("true", Err(InvalidAmount)),
        ("null", Err(InvalidAmount)),
        ("[1]", Err(InvalidAmount)),
        ("{}", Err(InvalidAmount)),
        ("0x10", Err(NotJson)),
        ("010", Err(NotJson)),
        ("+1", Err(NotJson)),
        ("NaN", Err(NotJson)),
        ("Infinity", Err(NotJson)),
        ("-Infinity", Err(NotJson)),
        (".5", Err(NotJson)),
    ];
    for (raw, want) in cases {
        let got = verdict(&with_raw(&["lines", "0", "budget"], raw));
        assert_eq!(&got, want, "budget {raw}");
    }
    assert_eq!(
        verdict(&with_raw(&["lines", "0", "stock"], "1000000")),
        Ok(())
    );
    assert_eq!(
        verdict(&with_raw(&["lines", "0", "stock"], "1000001")),
        Err(InvalidKind::InvalidAmount)
    );
}

#[test]
fn only_a_json_object_is_an_event() {
    let positional =
        br#"["OrderPlaced","e1","o1","c1","2026-11-29T10:00:00Z",[{"promotion_id":"p"}]]"#;
    assert_eq!(verdict(positional), Err(InvalidKind::Shape));
    for doc in [
        "null",
        "true",
        "1",
        "\"OrderPlaced\"",
        "[]",
        "[{}]",
        " \n[1]",
    ] {
        assert!(verdict(doc.as_bytes()).is_err(), "{doc}");
    }
    for (raw, want) in [
        (r#"["OrderPlaced"]"#, InvalidKind::Shape),
        (r#"null"#, InvalidKind::InvalidId),
    ] {
        let field = if want == InvalidKind::Shape {
            "type"
        } else {
            "event_id"
        };
        assert_eq!(
            verdict(&with_raw(&[field], raw)),
            Err(want),
            "{field}: {raw}"
        );
    }
    assert_eq!(
        verdict(&with_raw(&["lines"], "\"p\"")),
        Err(InvalidKind::InvalidLines)
    );
    // `lines: null` reads as absent.
    assert_eq!(
        verdict(&with_raw(&["lines"], "null")),
        Err(InvalidKind::MissingField)
    );
    assert_eq!(
        verdict(&with_raw(&["lines", "0"], "null")),
        Err(InvalidKind::InvalidLines)
    );
}

#[test]
fn timestamps_are_rfc3339_and_fit_the_scripts() {
    for ok in [
        "2026-11-29T10:00:00Z",
        "2026-11-29t10:00:00z",
        "2026-11-29T10:00:00.999999999+14:00",
        "0000-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "2016-12-31T23:59:60Z",
        // RFC 3339 5.6 lets applications use a space for the T.
        "2026-11-29 10:00:00Z",
    ] {
        let e = parse(&with_raw(&["occurred_at"], &format!("\"{ok}\"")))
            .unwrap_or_else(|e| panic!("{ok}: {e}"));
        // deduct.lua takes occurred_at as a signed integer of at most 15 digits.
        let t = e.header().occurred_at;
        assert!(t.unsigned_abs() < 10u64.pow(15), "{ok} -> {t}");
    }
    for bad in [
        "2026-11-29T10:00:00",
        "2026-13-01T00:00:00Z",
        "2026-11-29T10:00:00+24:00",
        "+12026-11-29T10:00:00Z",
        "1700000000",
        "",
    ] {
        assert_eq!(
            verdict(&with_raw(&["occurred_at"], &format!("\"{bad}\""))),
            Err(InvalidKind::InvalidTimestamp),
            "{bad}"
        );
    }
}

/// The hash tag of a Redis key: what the cluster hashes.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

fn id_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9_.-]{1,64}",
        "[A-Za-z0-9_.:{} -]{0,70}",
        proptest::sample::select(FORGING_IDS).prop_map(str::to_owned),
        "\\PC{0,20}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000)
    ))]

    /// Whatever the ids, an accepted event builds only its own keys: one
    /// hash tag, the promotion id, and exactly the contract's segments.
    #[test]
    fn accepted_events_only_build_their_own_keys(
        e in id_strategy(), o in id_strategy(), c in id_strategy(), p in id_strategy(),
    ) {
        let mut v = base();
        v["event_id"] = json!(e);
        v["order_id"] = json!(o);
        v["customer_id"] = json!(c);
        v["lines"][0]["promotion_id"] = json!(p);
        if let Ok(Event::Placed(ev)) = parse(&bytes(&v)) {
            let keys = Keys::new("promo");
            let h = &ev.header;
            for line in &ev.lines {
                let k = keys.deduct_line(&line.promotion_id, &h.order_id, &h.customer_id, &h.event_id);
                for (key, segments) in [(&k.promotion, 2), (&k.used, 4), (&k.record, 4), (&k.memo, 4)] {
                    prop_assert_eq!(key.matches('{').count(), 1, "{}", key);
                    prop_assert_eq!(key.matches('}').count(), 1, "{}", key);
                    prop_assert_eq!(hash_tag(key), Some(line.promotion_id.as_str()));
                    prop_assert_eq!(key.split(':').count(), segments, "{}", key);
                }
            }
        }
    }

    /// Random byte edits of a valid event: parse never panics, and what it
    /// accepts satisfies every rule (ids, line count, amounts).
    #[test]
    fn mutated_events_never_panic_and_never_smuggle(
        edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
    ) {
        let mut b = bytes(&base());
        for (at, byte, op) in edits {
            let i = at.index(b.len() + 1);
            match op {
                0 => b.insert(i, byte),
                1 if i < b.len() => { b.remove(i); }
                _ if i < b.len() => b[i] = byte,
                _ => {}
            }
        }
        if let Ok(ev) = parse(&b) {
            let h = ev.header();
            for id in [&h.event_id, &h.order_id, &h.customer_id] {
                prop_assert!(id.as_str().bytes().all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(&c)));
            }
            if let Event::Placed(p) = &ev {
                prop_assert!((1..=32).contains(&p.lines.len()));
                let ids: BTreeSet<_> = p.lines.iter().map(|l| l.promotion_id.clone()).collect();
                prop_assert_eq!(ids.len(), p.lines.len());
                for l in &p.lines {
                    prop_assert!(l.budget <= 1_000_000_000_000 && l.stock <= 1_000_000);
                }
            }
            let first = b.iter().find(|c| !c.is_ascii_whitespace());
            prop_assert_eq!(first, Some(&b'{'), "only an object is an event");
        }
    }
}

/// Expected dead-letter kind, Kafka key, value.
type Case = (&'static str, Option<Vec<u8>>, Option<Vec<u8>>);

/// A few hostile records end to end: each is dead-lettered byte for byte
/// with the right kind, the partition moves on, and Redis is not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_records_are_dead_lettered_end_to_end() {
    let f = service::Fixture::new("hostile", 2).await;
    let store = redis::TestRedis::of_fixture(&f).await;
    let ledger = store.ledger.clone();
    let spec = PromoSpec {
        stock: Some(10),
        ..PromoSpec::default()
    };
    f.promo(&ledger, "flash-42", spec).await;
    let before = store.dump().await;

    let mut oversized = base();
    oversized["pad"] = json!("x".repeat(MAX_EVENT_BYTES));
    let mut forged = base();
    forged["order_id"] = json!("o-1:{flash-42}:used:c-1");
    let mut forged_line = base();
    forged_line["lines"][0]["promotion_id"] = json!("flash-42}:order:{x");
    let text = String::from_utf8(bytes(&base())).unwrap();
    let cases: Vec<Case> = vec![
        ("wrong_shape", Some(b"o-1".to_vec()), Some(br#"["OrderPlaced","e-9","o-1","c-1","2026-11-29T10:00:00Z",[{"promotion_id":"flash-42","stock":1}]]"#.to_vec())),
        ("invalid_id", Some(b"o-1:{flash-42}".to_vec()), Some(bytes(&forged))),
        ("invalid_id", Some(b"o-1".to_vec()), Some(bytes(&forged_line))),
        ("too_large", Some(b"o-1".to_vec()), Some(bytes(&oversized))),
        ("not_utf8", Some(b"\xff\xfe".to_vec()), Some([&text.as_bytes()[..20], b"\xff", &text.as_bytes()[20..]].concat())),
        ("not_json", None, Some(format!("{}{}", "[".repeat(5_000), "]".repeat(5_000)).into_bytes())),
        ("wrong_shape", Some(b"o-1".to_vec()), Some(format!("{},\"type\":\"OrderRefunded\"}}", &text[..text.len() - 1]).into_bytes())),
        ("not_json", Some(b"o-1".to_vec()), None), // a tombstone: no value at all
    ];
    let raws: Vec<Raw> = cases
        .iter()
        .map(|(_, k, v)| Raw {
            key: k.clone(),
            payload: v.clone(),
            partition: Some(0),
            ..Raw::default()
        })
        .collect();
    kafka::produce_raw(&f.topics.input, &raws).await;

    let svc = service::start(f.settings(&[]));
    let dead = kafka::read_until(&f.topics.dlq, Duration::from_secs(60), |r| {
        r.len() >= cases.len()
    })
    .await;
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 2, Duration::from_secs(30))
        .await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");

    assert_eq!(
        dead.len(),
        cases.len(),
        "one dead letter per hostile record"
    );
    for (i, (kind, key, payload)) in cases.iter().enumerate() {
        let d = dead
            .iter()
            .find(|d| d.headers.get("deductor.source.offset") == Some(&i.to_string()))
            .unwrap_or_else(|| panic!("no dead letter for record {i} ({kind})"));
        assert_eq!(
            d.headers.get("deductor.error.kind").map(String::as_str),
            Some(*kind),
            "record {i}"
        );
        assert_eq!(&d.key, key, "record {i}: key kept");
        assert_eq!(
            d.payload.as_deref().unwrap_or_default(),
            payload.as_deref().unwrap_or_default(),
            "record {i}: bytes unchanged"
        );
    }
    store
        .assert_unchanged(&before, "hostile records wrote to Redis")
        .await;
    f.cleanup().await;
}

mod logs;
mod size_limit;
