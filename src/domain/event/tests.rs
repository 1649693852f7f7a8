//! The parser against the contract's rules, field by field.

use super::*;
use serde_json::{json, Value};

fn base() -> Value {
    json!({"type": "OrderPlaced", "event_id": "e-1001", "order_id": "o-77",
           "customer_id": "c-9", "occurred_at": "2026-11-29T10:00:00Z",
           "lines": [{"promotion_id": "flash-42", "budget": 1500, "stock": 1},
                     {"promotion_id": "full-200-30", "budget": 3000}]})
}

const ABSENT: &str = "<absent>";

fn with(path: &[&str], v: Value) -> Vec<u8> {
    let mut doc = base();
    let mut cur = &mut doc;
    for (i, p) in path.iter().enumerate() {
        if i + 1 == path.len() {
            if v == json!(ABSENT) {
                cur.as_object_mut().unwrap().remove(*p);
            } else {
                cur[*p] = v.clone();
            }
            break;
        }
        cur = match p.parse::<usize>() {
            Ok(n) => &mut cur[n],
            Err(_) => &mut cur[*p],
        };
    }
    serde_json::to_vec(&doc).unwrap()
}

fn kind_of(bytes: &[u8]) -> InvalidKind {
    match parse(bytes) {
        Ok(e) => panic!(
            "expected invalid, got {e:?} for {}",
            String::from_utf8_lossy(bytes)
        ),
        Err(e) => e.kind,
    }
}

#[test]
fn contract_examples_parse() {
    let Event::Placed(p) = parse(&serde_json::to_vec(&base()).unwrap()).unwrap() else {
        panic!("not a placement")
    };
    assert_eq!(p.header.event_id.as_str(), "e-1001");
    assert_eq!(p.header.occurred_at, 1_795_946_400);
    assert_eq!(
        p.lines[0],
        PlaceLine {
            promotion_id: Id::parse("flash-42").unwrap(),
            budget: 1500,
            stock: 1
        }
    );
    assert_eq!(p.lines[1].stock, 0, "absent stock is 0 on a placement");

    let refund = br#"{"type": "OrderRefunded", "event_id": "e-1002", "order_id": "o-77",
 "customer_id": "c-9", "occurred_at": "2026-11-30T08:00:00Z",
 "lines": [{"promotion_id": "flash-42"},
       {"promotion_id": "full-200-30", "budget": 1000}]}"#;
    let Event::Refunded(r) = parse(refund).unwrap() else {
        panic!("not a refund")
    };
    assert_eq!(r.lines[0].budget, None, "absent is everything outstanding");
    assert_eq!(r.lines[1].budget, Some(1000));
    assert_eq!(r.lines[1].stock, None);
}

#[test]
fn valid_edge_cases() {
    let ok = [
        with(&["unknown"], json!({"x": 1})),
        with(&["lines", "0", "extra"], json!("ignored")),
        with(&["event_id"], json!("a".repeat(64))),
        with(&["event_id"], json!("A-Z_a.z-09")),
        with(&["lines", "0", "budget"], json!(1_000_000_000_000u64)),
        with(&["lines", "0", "stock"], json!(1_000_000)),
        with(&["lines", "0", "budget"], json!(0)),
        with(&["occurred_at"], json!("2026-11-29T10:00:00.123+01:00")),
        with(
            &["lines"],
            json!((0..32)
                .map(|i| json!({"promotion_id": format!("p{i}")}))
                .collect::<Vec<_>>()),
        ),
    ];
    for doc in ok {
        assert!(parse(&doc).is_ok(), "{}", String::from_utf8_lossy(&doc));
    }
}

#[test]
fn every_rule_has_its_reason() {
    use InvalidKind::*;
    let cases: Vec<(&str, Vec<u8>, InvalidKind)> = vec![
        ("not json", b"{nope".to_vec(), NotJson),
        ("empty", b"".to_vec(), NotJson),
        ("array", b"[1,2]".to_vec(), Shape),
        ("positional array", br#" ["OrderPlaced","e1","o1","c1","2026-11-29T10:00:00Z",[{"promotion_id":"p"}]]"#.to_vec(), Shape),
        ("string", b"\"x\"".to_vec(), Shape),
        ("not utf8", b"{\"type\":\"OrderPlaced\xff\"}".to_vec(), NotUtf8),
        ("too large", {
            let mut v = base();
            v["pad"] = json!("x".repeat(MAX_EVENT_BYTES));
            serde_json::to_vec(&v).unwrap()
        }, TooLarge),
        ("duplicate key", br#"{"type":"OrderPlaced","type":"OrderRefunded","event_id":"e","order_id":"o","customer_id":"c","occurred_at":"2026-11-29T10:00:00Z","lines":[{"promotion_id":"p"}]}"#.to_vec(), Shape),
        ("duplicate key in line", br#"{"type":"OrderPlaced","event_id":"e","order_id":"o","customer_id":"c","occurred_at":"2026-11-29T10:00:00Z","lines":[{"promotion_id":"p","budget":1,"budget":2}]}"#.to_vec(), Shape),
        ("no type", with(&["type"], json!(ABSENT)), MissingField),
        ("unknown type", with(&["type"], json!("OrderCancelled")), UnknownType),
        ("type case", with(&["type"], json!("orderplaced")), UnknownType),
        ("type number", with(&["type"], json!(1)), Shape),
        ("no event_id", with(&["event_id"], json!(ABSENT)), MissingField),
        ("no order_id", with(&["order_id"], json!(ABSENT)), MissingField),
        ("no customer_id", with(&["customer_id"], json!(ABSENT)), MissingField),
        ("no occurred_at", with(&["occurred_at"], json!(ABSENT)), MissingField),
        ("no lines", with(&["lines"], json!(ABSENT)), MissingField),
        ("empty id", with(&["event_id"], json!("")), InvalidId),
        ("long id", with(&["order_id"], json!("a".repeat(65))), InvalidId),
        ("colon", with(&["order_id"], json!("o:1")), InvalidId),
        ("brace", with(&["customer_id"], json!("c{1}")), InvalidId),
        ("close brace", with(&["lines", "0", "promotion_id"], json!("p}")), InvalidId),
        ("space", with(&["event_id"], json!("e 1")), InvalidId),
        ("tab", with(&["event_id"], json!("e\t1")), InvalidId),
        ("unicode", with(&["event_id"], json!("é")), InvalidId),
        ("numeric id", with(&["order_id"], json!(77)), InvalidId),
        ("null id", with(&["order_id"], json!(null)), InvalidId),
        ("bad time", with(&["occurred_at"], json!("yesterday")), InvalidTimestamp),
        ("date only", with(&["occurred_at"], json!("2026-11-29")), InvalidTimestamp),
        ("no zone", with(&["occurred_at"], json!("2026-11-29T10:00:00")), InvalidTimestamp),
        ("time number", with(&["occurred_at"], json!(1_700_000_000)), InvalidTimestamp),
        ("lines object", with(&["lines"], json!({"promotion_id": "p"})), InvalidLines),
        ("lines empty", with(&["lines"], json!([])), InvalidLines),
        ("33 lines", with(&["lines"], json!((0..33).map(|i| json!({"promotion_id": format!("p{i}")})).collect::<Vec<_>>())), InvalidLines),
        ("line not object", with(&["lines"], json!(["p"])), InvalidLines),
        ("second line not object", with(&["lines"], json!([{"promotion_id": "p"}, 1])), InvalidLines),
        ("line null", with(&["lines"], json!([null])), InvalidLines),
        ("duplicate promotion", with(&["lines", "1", "promotion_id"], json!("flash-42")), DuplicatePromotion),
        ("float", with(&["lines", "0", "budget"], json!(15.5)), InvalidAmount),
        ("float whole", with(&["lines", "0", "budget"], json!(1500.0)), InvalidAmount),
        ("exponent", b"{\"type\":\"OrderPlaced\",\"event_id\":\"e\",\"order_id\":\"o\",\"customer_id\":\"c\",\"occurred_at\":\"2026-11-29T10:00:00Z\",\"lines\":[{\"promotion_id\":\"p\",\"budget\":1e3}]}".to_vec(), InvalidAmount),
        ("negative", with(&["lines", "0", "stock"], json!(-1)), InvalidAmount),
        ("string amount", with(&["lines", "0", "budget"], json!("1500")), InvalidAmount),
        ("null amount", with(&["lines", "0", "stock"], json!(null)), InvalidAmount),
        ("budget over", with(&["lines", "0", "budget"], json!(1_000_000_000_001u64)), InvalidAmount),
        ("stock over", with(&["lines", "0", "stock"], json!(1_000_001)), InvalidAmount),
        ("beyond u64", b"{\"type\":\"OrderPlaced\",\"event_id\":\"e\",\"order_id\":\"o\",\"customer_id\":\"c\",\"occurred_at\":\"2026-11-29T10:00:00Z\",\"lines\":[{\"promotion_id\":\"p\",\"stock\":18446744073709551616}]}".to_vec(), InvalidAmount),
    ];
    for (name, bytes, want) in cases {
        assert_eq!(kind_of(&bytes), want, "case {name}");
    }
}

#[test]
fn refund_amounts_follow_the_same_rules() {
    let mut doc = base();
    doc["type"] = json!("OrderRefunded");
    doc["lines"][0]["budget"] = json!(-5);
    assert_eq!(
        kind_of(&serde_json::to_vec(&doc).unwrap()),
        InvalidKind::InvalidAmount
    );
}

#[test]
fn detail_names_the_field() {
    let e = parse(&with(&["lines", "1", "budget"], json!(2.5))).unwrap_err();
    assert!(e.detail.contains("lines[1].budget"), "{}", e.detail);
    let e = parse(&with(&["customer_id"], json!("a:b"))).unwrap_err();
    assert!(e.detail.contains("customer_id"), "{}", e.detail);
}

#[test]
fn salvage_reads_type_and_order_of_invalid_events() {
    let e = parse(&with(&["lines", "0", "budget"], json!(1.5))).unwrap_err();
    assert_eq!(e.salvage.event_type, Some(EventType::OrderPlaced));
    assert_eq!(e.salvage.order_id.as_ref().map(Id::as_str), Some("o-77"));
    assert_eq!(e.salvage.event_id.as_ref().map(Id::as_str), Some("e-1001"));
    let e = parse(&with(&["order_id"], json!("o:forged"))).unwrap_err();
    assert_eq!(e.salvage.order_id, None, "an invalid id is not salvaged");
    let e = parse(b"garbage").unwrap_err();
    assert_eq!(e.salvage, Salvage::default());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
    #[test]
    fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        let _ = parse(&bytes);
    }

    #[test]
    fn accepted_ids_never_forge_keys(s in "\\PC{0,70}") {
        if let Ok(id) = Id::parse(&s) {
            let forged = id.as_str().contains([':', '{', '}', ' ']);
            proptest::prop_assert!(!forged, "id {} could forge a key", id);
            proptest::prop_assert!((1..=64).contains(&id.as_str().len()));
        }
    }
}

#[test]
fn detail_is_clipped_however_long_the_input() {
    let long = "T".repeat(60_000);
    let v = format!(
        r#"{{"type":"{long}","event_id":"e","order_id":"o","customer_id":"c","occurred_at":"2026-11-29T10:00:00Z","lines":[{{"promotion_id":"p"}}]}}"#
    );
    let e = parse(v.as_bytes()).unwrap_err();
    assert!(
        e.detail.len() <= MAX_DETAIL_BYTES + 32,
        "{}",
        e.detail.len()
    );
    assert_eq!(e.salvage.event_id.unwrap().as_str(), "e");
    assert_eq!(clip("abc", 3), "abc");
    assert_eq!(clip("abcd", 3), "abc…(+1 bytes)");
    // Never inside a character.
    assert_eq!(clip("aé", 2), "a…(+2 bytes)");
}
