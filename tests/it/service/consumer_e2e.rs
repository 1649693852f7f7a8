//! The service in-process against the real Kafka and Redis: outcomes
//! compared field by field with CONTRACT.md section 4, poison messages to
//! the dead-letter topic, and a graceful shutdown in the middle of a burst.
//! Each test owns its topics, consumer group and key prefix.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::kafka::{self, Placed, Raw, Record};
use crate::common::service::{self, Fixture};
use deductor::admin::audit;
use deductor::admin::{self, PromoSpec};
use deductor::domain::event::Id;
use deductor::domain::outcome::{outcome_id, OutcomeType};
use serde_json::{json, Value};

const PLACED_AT: &str = "2026-11-29T10:00:00Z";
/// `PLACED_AT` in unix seconds.
const T: i64 = 1_795_946_400;
const REFUNDED_AT: &str = "2026-11-30T08:00:00Z";
const WAIT: Duration = Duration::from_secs(60);

fn placed(e: &str, o: &str, c: &str, lines: Value) -> Value {
    json!({"type": "OrderPlaced", "event_id": e, "order_id": o, "customer_id": c,
           "occurred_at": PLACED_AT, "lines": lines})
}

fn refunded(e: &str, o: &str, c: &str, lines: Value) -> Value {
    json!({"type": "OrderRefunded", "event_id": e, "order_id": o, "customer_id": c,
           "occurred_at": REFUNDED_AT, "lines": lines})
}

fn oid(event: &str, kind: OutcomeType) -> String {
    outcome_id(event, kind)
}

/// The outcome the contract expects for `event`, minus `source` and
/// `processed_at` (checked on their own).
fn accepted(event: &Value, duplicate: bool, lines: Value) -> Value {
    let e = event["event_id"].as_str().unwrap();
    json!({"type": "DeductAccepted", "outcome_id": oid(e, OutcomeType::DeductAccepted),
           "event_id": e, "order_id": event["order_id"], "customer_id": event["customer_id"],
           "duplicate": duplicate, "lines": lines})
}

fn deduct_rejected(event: &Value, duplicate: bool, reason: &str, promotion: &str) -> Value {
    let e = event["event_id"].as_str().unwrap();
    let lines: Vec<Value> = event["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            json!({"promotion_id": l["promotion_id"], "budget": l.get("budget").cloned().unwrap_or(json!(0)),
                   "stock": l.get("stock").cloned().unwrap_or(json!(0))})
        })
        .collect();
    json!({"type": "DeductRejected", "outcome_id": oid(e, OutcomeType::DeductRejected),
           "event_id": e, "order_id": event["order_id"], "customer_id": event["customer_id"],
           "duplicate": duplicate, "reason": reason, "promotion_id": promotion, "lines": lines})
}

fn rollback(event: &Value, duplicate: bool, reason: Option<&str>, lines: Value) -> Value {
    let e = event["event_id"].as_str().unwrap();
    let kind = if reason.is_none() {
        OutcomeType::RollbackApplied
    } else {
        OutcomeType::RollbackRejected
    };
    let mut v = json!({"type": kind.as_str(), "outcome_id": oid(e, kind),
           "event_id": e, "order_id": event["order_id"], "customer_id": event["customer_id"],
           "duplicate": duplicate, "lines": lines});
    if let Some(r) = reason {
        v["reason"] = json!(r);
    }
    v
}

fn left(budget: Option<u64>, stock: Option<u64>) -> Value {
    json!({"budget": budget, "stock": stock})
}

/// `processed_at`: RFC 3339, UTC, milliseconds (`2026-11-29T10:00:00.012Z`),
/// and close to now (it is the processing time, not the event's).
fn assert_processed_at(v: &Value) {
    let s = v["processed_at"]
        .as_str()
        .expect("processed_at is a string");
    let t = chrono::DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("processed_at {s:?} is not RFC 3339: {e}"));
    assert_eq!(
        s.len(),
        24,
        "processed_at {s:?}: seconds with 3 decimals, UTC"
    );
    assert!(
        s.ends_with('Z') && s.as_bytes()[19] == b'.',
        "processed_at {s:?}"
    );
    let age = chrono::Utc::now().signed_duration_since(t);
    assert!(
        age.num_seconds().abs() < 600,
        "processed_at {s:?} is not the processing time"
    );
}

/// Matches every produced record with its one outcome (by source) and
/// compares the outcome with `expected` field by field.
fn check_outcomes(
    topic: &str,
    produced: &[(Value, Placed)],
    expected: &[Value],
    outcomes: &[Record],
) {
    assert_eq!(
        outcomes.len(),
        produced.len(),
        "one outcome per input record"
    );
    let mut by_source: BTreeMap<(i32, i64), &Record> = BTreeMap::new();
    for r in outcomes {
        let v = r.json();
        let src = (
            v["source"]["partition"].as_i64().unwrap() as i32,
            v["source"]["offset"].as_i64().unwrap(),
        );
        assert!(
            by_source.insert(src, r).is_none(),
            "two outcomes name source {src:?}"
        );
    }
    for ((event, at), want) in produced.iter().zip(expected) {
        let r = by_source
            .get(&(at.partition, at.offset))
            .unwrap_or_else(|| panic!("no outcome for {event} at {at:?}"));
        let mut got = r.json();
        crate::common::contract::assert_outcome(&got);
        assert_processed_at(&got);
        assert_eq!(
            got["source"],
            json!({"topic": topic, "partition": at.partition, "offset": at.offset}),
            "source of the outcome of {}",
            event["event_id"]
        );
        assert_eq!(
            r.key_str().as_deref(),
            event["order_id"].as_str(),
            "outcome key is the order_id"
        );
        let m = got.as_object_mut().unwrap();
        m.remove("processed_at");
        m.remove("source");
        assert_eq!(&got, want, "outcome of {}", event["event_id"]);
    }
}

struct Phases<'a> {
    f: &'a Fixture,
    produced: Vec<(Value, Placed)>,
    expected: Vec<Value>,
}

impl Phases<'_> {
    /// Produces one phase's events and waits until the outcome topic holds
    /// one outcome per record produced so far, so the next phase sees this
    /// phase's effects (remaining amounts are then deterministic).
    async fn run(&mut self, events: Vec<(Value, Value)>) {
        let (evs, wants): (Vec<Value>, Vec<Value>) = events.into_iter().unzip();
        let at = kafka::produce_events(&self.f.topics.input, &evs).await;
        self.produced.extend(evs.into_iter().zip(at));
        self.expected.extend(wants);
        kafka::read_n(&self.f.topics.outcome, self.produced.len(), WAIT).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_outcomes_match_the_contract() {
    let f = Fixture::new("e2e", 3).await;
    let ledger = f.ledger().await;
    let spec = |budget: Option<u64>, stock: Option<u64>, per_customer: Option<u64>| PromoSpec {
        budget,
        stock,
        per_customer,
        ..PromoSpec::default()
    };
    f.promo(&ledger, "flash", spec(Some(10_000), Some(2), Some(1)))
        .await;
    f.promo(&ledger, "full", spec(Some(5_000), None, None))
        .await;
    f.promo(&ledger, "tiny", spec(Some(100), None, None)).await;
    f.promo(&ledger, "limit", spec(None, None, Some(1))).await;
    f.promo(&ledger, "scarce", spec(Some(1_000), Some(0), None))
        .await;
    f.promo(
        &ledger,
        "paused",
        PromoSpec {
            budget: Some(1_000),
            paused: true,
            ..PromoSpec::default()
        },
    )
    .await;
    f.promo(
        &ledger,
        "window",
        PromoSpec {
            budget: Some(1_000),
            starts_at: Some(T - 7200),
            ends_at: Some(T - 3600),
            ..PromoSpec::default()
        },
    )
    .await;

    let svc = service::start(f.settings(&[]));
    let mut ph = Phases {
        f: &f,
        produced: Vec::new(),
        expected: Vec::new(),
    };

    // A: first decisions, each on its own promotion.
    let a1 = placed(
        "e-a1",
        "o-1",
        "c-1",
        json!([{"promotion_id": "flash", "budget": 1000, "stock": 1}]),
    );
    let a2 = placed("e-a2", "o-5", "c-5", json!([{"promotion_id": "limit"}]));
    let a3 = placed(
        "e-a3",
        "o-4",
        "c-4",
        json!([{"promotion_id": "tiny", "budget": 200}]),
    );
    let a4 = placed(
        "e-a4",
        "o-9",
        "c-9",
        json!([{"promotion_id": "nope", "budget": 1}]),
    );
    let a5 = placed(
        "e-a5",
        "o-10",
        "c-10",
        json!([{"promotion_id": "paused", "budget": 10}]),
    );
    let a6 = placed(
        "e-a6",
        "o-11",
        "c-11",
        json!([{"promotion_id": "window", "budget": 10}]),
    );
    let a7 = refunded("e-a7", "o-8", "c-8", json!([{"promotion_id": "full"}]));
    let a8 = placed(
        "e-a8",
        "o-3",
        "c-3",
        json!([{"promotion_id": "scarce", "budget": 100, "stock": 1}]),
    );
    ph.run(vec![
        (a1.clone(), accepted(&a1, false, json!([{"promotion_id": "flash", "budget": 1000, "stock": 1, "remaining": left(Some(9000), Some(1))}]))),
        (a2.clone(), accepted(&a2, false, json!([{"promotion_id": "limit", "budget": 0, "stock": 0, "remaining": left(None, None)}]))),
        (a3.clone(), deduct_rejected(&a3, false, "budget_exceeded", "tiny")),
        (a4.clone(), deduct_rejected(&a4, false, "promotion_not_found", "nope")),
        (a5.clone(), deduct_rejected(&a5, false, "promotion_inactive", "paused")),
        (a6.clone(), deduct_rejected(&a6, false, "promotion_inactive", "window")),
        (a7.clone(), rollback(&a7, false, Some("no_deduction"), json!([{"promotion_id": "full", "status": "no_deduction", "budget": 0, "stock": 0, "remaining": left(Some(5000), None)}]))),
        (a8.clone(), deduct_rejected(&a8, false, "stock_insufficient", "scarce")),
    ])
    .await;

    // B: a redelivery of a1 (same bytes), the per-customer limit, a
    // placement of a refunded order, a multi-line rejection (full released).
    let b2 = placed("e-b2", "o-6", "c-5", json!([{"promotion_id": "limit"}]));
    let b3 = placed(
        "e-b3",
        "o-8",
        "c-8",
        json!([{"promotion_id": "full", "budget": 100}]),
    );
    let b4 = placed(
        "e-b4",
        "o-7",
        "c-7",
        json!([{"promotion_id": "full", "budget": 100}, {"promotion_id": "tiny", "budget": 500}]),
    );
    ph.run(vec![
        (a1.clone(), accepted(&a1, true, json!([{"promotion_id": "flash", "budget": 1000, "stock": 1, "remaining": left(Some(9000), Some(1))}]))),
        (b2.clone(), deduct_rejected(&b2, false, "user_limit_reached", "limit")),
        (b3.clone(), deduct_rejected(&b3, false, "order_reverted", "full")),
        (b4.clone(), deduct_rejected(&b4, false, "budget_exceeded", "tiny")),
    ])
    .await;

    // C: a multi-line placement (full is back at 5000: b4 released it).
    let c1 = placed(
        "e-c1",
        "o-2",
        "c-2",
        json!([{"promotion_id": "flash", "budget": 500, "stock": 1}, {"promotion_id": "full", "budget": 2000}]),
    );
    ph.run(vec![(
        c1.clone(),
        accepted(&c1, false, json!([
            {"promotion_id": "flash", "budget": 500, "stock": 1, "remaining": left(Some(8500), Some(0))},
            {"promotion_id": "full", "budget": 2000, "stock": 0, "remaining": left(Some(3000), None)}])),
    )])
    .await;

    // D: a full refund and a partial one.
    let d1 = refunded("e-d1", "o-1", "c-1", json!([{"promotion_id": "flash"}]));
    let d2 = refunded(
        "e-d2",
        "o-2",
        "c-2",
        json!([{"promotion_id": "full", "budget": 500}]),
    );
    ph.run(vec![
        (d1.clone(), rollback(&d1, false, None, json!([{"promotion_id": "flash", "status": "applied", "budget": 1000, "stock": 1, "remaining": left(Some(9500), Some(1))}]))),
        (d2.clone(), rollback(&d2, false, None, json!([{"promotion_id": "full", "status": "applied", "budget": 500, "stock": 0, "remaining": left(Some(3500), None)}]))),
    ])
    .await;

    // E: a redelivered refund, a second refund of a reverted order.
    let e2 = refunded("e-e2", "o-1", "c-1", json!([{"promotion_id": "flash"}]));
    ph.run(vec![
        (d1.clone(), rollback(&d1, true, None, json!([{"promotion_id": "flash", "status": "applied", "budget": 1000, "stock": 1, "remaining": left(Some(9500), Some(1))}]))),
        (e2.clone(), rollback(&e2, false, Some("already_reverted"), json!([{"promotion_id": "flash", "status": "already_reverted", "budget": 0, "stock": 0, "remaining": left(Some(9500), Some(1))}]))),
    ])
    .await;

    // F: a multi-line refund with one line applied and one refused, then a
    // refund asking for more than is outstanding.
    let f1 = refunded(
        "e-f1",
        "o-2",
        "c-2",
        json!([{"promotion_id": "flash"}, {"promotion_id": "full", "budget": 999_999}]),
    );
    let f2 = refunded(
        "e-f2",
        "o-2",
        "c-2",
        json!([{"promotion_id": "full", "budget": 1501}]),
    );
    ph.run(vec![
        (f1.clone(), rollback(&f1, false, None, json!([
            {"promotion_id": "flash", "status": "applied", "budget": 500, "stock": 1, "remaining": left(Some(10_000), Some(2))},
            {"promotion_id": "full", "status": "exceeds_deducted", "budget": 0, "stock": 0, "remaining": left(Some(3500), None)}]))),
        (f2.clone(), rollback(&f2, false, Some("exceeds_deducted"), json!([{"promotion_id": "full", "status": "exceeds_deducted", "budget": 0, "stock": 0, "remaining": left(Some(3500), None)}]))),
    ])
    .await;

    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("run returns Ok after a clean stop");

    let outcomes = kafka::read_all(&f.topics.outcome).await;
    check_outcomes(&f.topics.input, &ph.produced, &ph.expected, &outcomes);
    assert!(
        kafka::read_all(&f.topics.dlq).await.is_empty(),
        "no dead letters for valid events"
    );

    // Redis: the counters the decisions add up to, and the ledger invariant.
    let show = |p: &'static str| {
        let ledger = ledger.clone();
        async move {
            admin::promo_show(&ledger, &Id::parse(p).unwrap())
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("promotion {p} exists"))
        }
    };
    let flash = show("flash").await;
    assert_eq!(
        (flash.budget, flash.stock),
        (Some(10_000), Some(2)),
        "flash: everything refunded"
    );
    let full = show("full").await;
    assert_eq!(full.budget, Some(3_500), "full: 5000 - 2000 + 500");
    assert_eq!(
        show("tiny").await.budget,
        Some(100),
        "tiny: nothing deducted"
    );
    assert_eq!(show("scarce").await.stock, Some(0));
    assert_eq!(show("paused").await.budget, Some(1_000));
    for p in [
        "flash", "full", "tiny", "limit", "scarce", "paused", "window",
    ] {
        let r = audit::audit_one(&ledger, &Id::parse(p).unwrap())
            .await
            .unwrap();
        assert!(r.breaches.is_empty(), "{p}: {:?}", r.breaches);
    }
    let full_report = audit::audit_one(&ledger, &Id::parse("full").unwrap())
        .await
        .unwrap();
    assert_eq!(
        (full_report.held, full_report.outstanding_budget),
        (1, 1_500)
    );

    // After a clean stop every offset is committed: nothing is redelivered.
    let ends = kafka::end_offsets(&f.topics.input).await;
    let committed = kafka::committed(&f.topics.group, &f.topics.input, f.topics.partitions).await;
    for (p, end) in &ends {
        let c = committed[p];
        assert!(
            c == Some(*end) || (*end == 0 && c.is_none()),
            "partition {p}: committed {c:?}, log end {end}"
        );
    }
    f.cleanup().await;
}

/// One invalid-event case.
struct Poison {
    name: &'static str,
    key: &'static str,
    payload: Option<Vec<u8>>,
    kind: &'static str,
    /// `Some((type, order_id, event_id))` when an `invalid_event` outcome is due.
    outcome: Option<(&'static str, &'static str, Option<&'static str>)>,
}

fn doc(patch: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut v = placed(
        "e-p",
        "o-p",
        "c-p",
        json!([{"promotion_id": "pp", "budget": 10, "stock": 1}]),
    );
    patch(&mut v);
    serde_json::to_vec(&v).unwrap()
}

fn poison_cases() -> Vec<Poison> {
    let mut big = placed(
        "e-big",
        "o-big",
        "c-p",
        json!([{"promotion_id": "pp", "budget": 1}]),
    );
    big["pad"] = json!("x".repeat(70 * 1024));
    let lines33: Vec<Value> = (0..33)
        .map(|i| json!({"promotion_id": format!("q{i}")}))
        .collect();
    vec![
        Poison { name: "not json", key: "k-notjson", payload: Some(b"{nope".to_vec()), kind: "not_json", outcome: None },
        Poison { name: "invalid utf-8", key: "k-utf8", payload: Some(b"{\"type\":\"OrderPlaced\xff\"}".to_vec()), kind: "not_utf8", outcome: None },
        Poison { name: "over 64 KiB", key: "o-big", payload: Some(serde_json::to_vec(&big).unwrap()), kind: "too_large", outcome: Some(("DeductRejected", "o-big", Some("e-big"))) },
        Poison { name: "wrong shape", key: "k-shape", payload: Some(b"[1,2]".to_vec()), kind: "wrong_shape", outcome: None },
        Poison { name: "unknown type", key: "o-unk", payload: Some(doc(|v| { v["type"] = json!("OrderCancelled"); v["order_id"] = json!("o-unk"); })), kind: "unknown_type", outcome: None },
        Poison { name: "order id with ':'", key: "o:forged", payload: Some(doc(|v| { v["order_id"] = json!("o:forged"); })), kind: "invalid_id", outcome: None },
        Poison { name: "event id with ':'", key: "o-colon", payload: Some(doc(|v| { v["order_id"] = json!("o-colon"); v["event_id"] = json!("e:1"); })), kind: "invalid_id", outcome: Some(("DeductRejected", "o-colon", None)) },
        Poison { name: "customer id with '{'", key: "o-brace", payload: Some(doc(|v| { v["order_id"] = json!("o-brace"); v["event_id"] = json!("e-brace"); v["customer_id"] = json!("c{1"); })), kind: "invalid_id", outcome: Some(("DeductRejected", "o-brace", Some("e-brace"))) },
        Poison { name: "float amount", key: "o-float", payload: Some(doc(|v| { v["order_id"] = json!("o-float"); v["event_id"] = json!("e-float"); v["lines"][0]["budget"] = json!(15.5); })), kind: "invalid_amount", outcome: Some(("DeductRejected", "o-float", Some("e-float"))) },
        Poison { name: "negative amount", key: "o-neg", payload: Some(doc(|v| { v["order_id"] = json!("o-neg"); v["event_id"] = json!("e-neg"); v["lines"][0]["stock"] = json!(-1); })), kind: "invalid_amount", outcome: Some(("DeductRejected", "o-neg", Some("e-neg"))) },
        Poison { name: "exponent amount", key: "o-exp", payload: Some(br#"{"type":"OrderRefunded","event_id":"e-exp","order_id":"o-exp","customer_id":"c-p","occurred_at":"2026-11-29T10:00:00Z","lines":[{"promotion_id":"pp","budget":1e3}]}"#.to_vec()), kind: "invalid_amount", outcome: Some(("RollbackRejected", "o-exp", Some("e-exp"))) },
        Poison { name: "duplicate promotion", key: "o-dup", payload: Some(doc(|v| { v["order_id"] = json!("o-dup"); v["event_id"] = json!("e-dup"); v["lines"] = json!([{"promotion_id": "pp"}, {"promotion_id": "pp"}]); })), kind: "duplicate_promotion", outcome: Some(("DeductRejected", "o-dup", Some("e-dup"))) },
        Poison { name: "33 lines", key: "o-33", payload: Some(doc(|v| { v["order_id"] = json!("o-33"); v["event_id"] = json!("e-33"); v["lines"] = json!(lines33); })), kind: "invalid_lines", outcome: Some(("DeductRejected", "o-33", Some("e-33"))) },
        Poison { name: "missing occurred_at", key: "o-time", payload: Some(doc(|v| { v["order_id"] = json!("o-time"); v["event_id"] = json!("e-time"); v.as_object_mut().unwrap().remove("occurred_at"); })), kind: "missing_field", outcome: Some(("DeductRejected", "o-time", Some("e-time"))) },
        Poison { name: "null payload", key: "k-null", payload: None, kind: "not_json", outcome: None },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_are_dead_lettered_and_the_partition_moves_on() {
    let f = Fixture::new("poison", 3).await;
    let ledger = f.ledger().await;
    f.promo(
        &ledger,
        "pp",
        PromoSpec {
            budget: Some(1_000),
            stock: Some(10),
            ..PromoSpec::default()
        },
    )
    .await;

    // Every case, then a valid event, all in partition 0, in this order.
    let cases = poison_cases();
    let ts = chrono::Utc::now().timestamp_millis() - 60_000;
    let mut raws: Vec<Raw> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| Raw {
            key: Some(c.key.as_bytes().to_vec()),
            payload: c.payload.clone(),
            partition: Some(0),
            timestamp: Some(ts + i as i64),
            ..Raw::default()
        })
        .collect();
    let valid = placed(
        "e-after",
        "o-after",
        "c-after",
        json!([{"promotion_id": "pp", "budget": 10, "stock": 1}]),
    );
    raws.push(Raw {
        key: Some(b"o-after".to_vec()),
        payload: Some(serde_json::to_vec(&valid).unwrap()),
        partition: Some(0),
        timestamp: None,
        ..Raw::default()
    });
    let at = kafka::produce_raw(&f.topics.input, &raws).await;

    let svc = service::start(f.settings(&[]));
    let want_outcomes = cases.iter().filter(|c| c.outcome.is_some()).count() + 1;
    let outcomes = kafka::read_n(&f.topics.outcome, want_outcomes, WAIT).await;
    let dlq = kafka::read_n(&f.topics.dlq, cases.len(), WAIT).await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("run returns Ok");

    // Dead letters: original key and bytes, every header of the contract.
    let by_offset: BTreeMap<String, &Record> = dlq
        .iter()
        .map(|r| {
            (
                r.headers
                    .get("deductor.source.offset")
                    .cloned()
                    .unwrap_or_default(),
                r,
            )
        })
        .collect();
    assert_eq!(
        by_offset.len(),
        cases.len(),
        "one dead letter per poison record"
    );
    for (c, placed_at) in cases.iter().zip(&at) {
        let r = by_offset
            .get(&placed_at.offset.to_string())
            .unwrap_or_else(|| {
                panic!("{}: no dead letter for offset {}", c.name, placed_at.offset)
            });
        assert_eq!(
            r.key.as_deref(),
            Some(c.key.as_bytes()),
            "{}: key kept",
            c.name
        );
        assert_eq!(r.payload, c.payload, "{}: bytes unchanged", c.name);
        let h = &r.headers;
        crate::common::contract::assert_dead_letter_headers(h);
        let header = |k: &str| {
            h.get(k)
                .cloned()
                .unwrap_or_else(|| panic!("{}: header {k} missing: {h:?}", c.name))
        };
        assert_eq!(header("deductor.error.kind"), c.kind, "{}", c.name);
        assert!(
            header("deductor.error").len() > c.kind.len(),
            "{}: a readable reason: {h:?}",
            c.name
        );
        assert_eq!(
            header("deductor.source.topic"),
            f.topics.input,
            "{}",
            c.name
        );
        assert_eq!(header("deductor.source.partition"), "0", "{}", c.name);
        assert_eq!(
            header("deductor.source.timestamp"),
            placed_at.timestamp.to_string(),
            "{}",
            c.name
        );
        assert_eq!(
            header("deductor.consumer.group"),
            f.topics.group,
            "{}",
            c.name
        );
    }

    // invalid_event outcomes exactly where order_id and type were readable.
    let mut by_src: BTreeMap<i64, Value> = BTreeMap::new();
    for r in &outcomes {
        let v = r.json();
        crate::common::contract::assert_outcome(&v);
        assert_eq!(v["source"]["partition"], json!(0));
        assert_eq!(v["source"]["topic"], json!(f.topics.input));
        by_src.insert(v["source"]["offset"].as_i64().unwrap(), v);
    }
    for (c, placed_at) in cases.iter().zip(&at) {
        let got = by_src.get(&placed_at.offset);
        match (c.outcome, got) {
            (None, None) => {}
            (None, Some(v)) => panic!("{}: unexpected outcome {v}", c.name),
            (Some(_), None) => panic!("{}: no invalid_event outcome", c.name),
            (Some((kind, order, event)), Some(v)) => {
                assert_eq!(v["type"], json!(kind), "{}", c.name);
                assert_eq!(v["reason"], json!("invalid_event"), "{}", c.name);
                assert_eq!(v["order_id"], json!(order), "{}", c.name);
                assert_eq!(v["event_id"], json!(event), "{}", c.name);
                assert_eq!(v["duplicate"], json!(false), "{}", c.name);
                let id = v["outcome_id"].as_str().unwrap_or_default();
                assert!(!id.is_empty(), "{}: outcome_id", c.name);
                if let Some(e) = event {
                    let k = if kind == "DeductRejected" {
                        OutcomeType::DeductRejected
                    } else {
                        OutcomeType::RollbackRejected
                    };
                    assert_eq!(id, oid(e, k), "{}", c.name);
                }
                assert_processed_at(v);
            }
        }
    }
    let after = &by_src[&at.last().unwrap().offset];
    assert_eq!(
        after["type"],
        json!("DeductAccepted"),
        "the valid event after the poison ones: {after}"
    );
    assert_eq!(after["event_id"], json!("e-after"));
    let pp = admin::promo_show(&ledger, &Id::parse("pp").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (pp.budget, pp.stock),
        (Some(990), Some(9)),
        "only the valid event deducted"
    );
    let ends = kafka::end_offsets(&f.topics.input).await;
    let committed = kafka::committed(&f.topics.group, &f.topics.input, 3).await;
    assert_eq!(
        committed[&0],
        Some(ends[&0]),
        "partition 0 committed past every poison record"
    );
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_commits_what_was_done_and_reprocesses_nothing() {
    const EVENTS: usize = 2000;
    const BUDGET: u64 = 1_000_000;
    let f = Fixture::new("drain", 3).await;
    let ledger = f.ledger().await;
    f.promo(
        &ledger,
        "bulk",
        PromoSpec {
            budget: Some(BUDGET),
            ..PromoSpec::default()
        },
    )
    .await;
    let events: Vec<Value> = (0..EVENTS)
        .map(|i| {
            placed(
                &format!("e{i}"),
                &format!("o{i}"),
                &format!("c{i}"),
                json!([{"promotion_id": "bulk", "budget": 1}]),
            )
        })
        .collect();
    let at = kafka::produce_events(&f.topics.input, &events).await;
    let event_at: BTreeMap<(i32, i64), String> = at
        .iter()
        .zip(&events)
        .map(|(a, e)| {
            (
                (a.partition, a.offset),
                e["event_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();

    // First run: cancelled in the middle of the burst.
    let settings = f.settings(&[]);
    let drain = settings.drain_timeout();
    let svc = service::start(settings.clone());
    let deadline = Instant::now() + WAIT;
    while svc
        .status
        .events_done
        .load(std::sync::atomic::Ordering::Relaxed)
        < 200
    {
        assert!(Instant::now() < deadline, "the service processed nothing");
        assert!(!svc.is_finished(), "the service stopped by itself");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (result, took) = svc.stop(drain + Duration::from_secs(10)).await;
    result.expect("run returns Ok on cancel");
    assert!(
        took <= drain + Duration::from_secs(5),
        "stopped in {took:?}, drain timeout {drain:?}"
    );

    let first = kafka::committed(&f.topics.group, &f.topics.input, 3).await;
    let first: BTreeMap<i32, i64> = first
        .into_iter()
        .map(|(p, o)| (p, o.unwrap_or(0)))
        .collect();
    let done_first: usize = first.values().map(|o| *o as usize).sum();
    assert!(
        done_first >= 200,
        "committed {first:?} after 200 events were done"
    );
    assert!(
        done_first < EVENTS,
        "the stop came after the whole burst ({first:?}): nothing left to test"
    );
    let run1 = kafka::read_all(&f.topics.outcome).await;
    let run1_src = kafka::sources(&run1);
    // G1: nothing committed past an event without an outcome; G4: every
    // outcome published was committed (in-flight work finished, then commit).
    for (p, c) in &first {
        for o in 0..*c {
            assert!(
                run1_src.contains(&(*p, o)),
                "partition {p}: committed {c} but offset {o} has no outcome"
            );
        }
    }
    for (p, o) in &run1_src {
        assert!(
            *o < first[p],
            "outcome for {p}@{o} published but not committed ({first:?})"
        );
    }

    // Second run: same group; it resumes at the committed offsets.
    let svc = service::start(settings);
    let all = kafka::read_until(&f.topics.outcome, WAIT, |rs| rs.len() >= EVENTS).await;
    let (result, _) = svc.stop(drain + Duration::from_secs(10)).await;
    result.expect("run returns Ok");

    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for r in &all {
        crate::common::contract::assert_outcome(&r.json());
        *count
            .entry(r.json()["event_id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(count.len(), EVENTS, "every event has an outcome");
    let repeated: Vec<(&(i32, i64), &String)> =
        event_at.iter().filter(|(_, e)| count[*e] != 1).collect();
    assert!(
        repeated.is_empty(),
        "events with more than one outcome: {:?}",
        &repeated[..repeated.len().min(10)]
    );
    let bulk = admin::promo_show(&ledger, &Id::parse("bulk").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        bulk.budget,
        Some(BUDGET - EVENTS as u64),
        "each event deducted exactly once"
    );
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 3, Duration::from_secs(10))
        .await;
    f.cleanup().await;
}

/// Trace context and correlation (issue 15): an input record's
/// `traceparent` is continued (same trace, the event's own span) on the
/// outcome and on the dead letter; allow-listed headers are copied onto the
/// outcome; a dead letter keeps every header of the original record;
/// outcomes carry `content-type` and the CloudEvents binary-mode attributes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_and_correlation_ids_reach_outcomes_and_dead_letters() {
    let f = Fixture::new("trace", 1).await;
    let ledger = f.ledger().await;
    f.promo(
        &ledger,
        "tp",
        PromoSpec {
            stock: Some(10),
            ..PromoSpec::default()
        },
    )
    .await;
    const T1: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const T2: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let h = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let event = placed(
        "e-tr",
        "o-tr",
        "c-tr",
        json!([{"promotion_id": "tp", "stock": 1}]),
    );
    kafka::produce_raw(
        &f.topics.input,
        &[
            Raw {
                key: Some(b"o-tr".to_vec()),
                payload: Some(serde_json::to_vec(&event).unwrap()),
                partition: Some(0),
                headers: h(&[
                    ("traceparent", T1),
                    ("tracestate", "vendor=1"),
                    ("x-correlation-id", "corr-1"),
                    ("x-tenant", "t-1"),
                    ("x-private", "not-copied"),
                ]),
                ..Raw::default()
            },
            Raw {
                key: Some(b"o-bad".to_vec()),
                payload: Some(b"{not json".to_vec()),
                partition: Some(0),
                headers: h(&[
                    ("traceparent", T2),
                    ("x-correlation-id", "corr-2"),
                    ("x-private", "kept"),
                ]),
                ..Raw::default()
            },
        ],
    )
    .await;
    // A list setting, comma separated as --set and the environment give it.
    let svc =
        service::start(f.settings(&[("kafka.propagate_headers", "x-correlation-id, x-tenant")]));
    let outcomes = kafka::read_n(&f.topics.outcome, 1, WAIT).await;
    let dlq = kafka::read_n(&f.topics.dlq, 1, WAIT).await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("run returns Ok");

    let o = &outcomes[0];
    let body = o.json();
    let hd = &o.headers;
    assert_eq!(body["type"], "DeductAccepted", "{body}");
    let span_of = |tp: &str| tp.split('-').nth(2).unwrap_or_default().to_owned();
    let trace_of = |tp: &str| tp.split('-').nth(1).unwrap_or_default().to_owned();
    let tp = &hd["traceparent"];
    assert_eq!(trace_of(tp), trace_of(T1), "same trace: {tp}");
    assert_ne!(span_of(tp), span_of(T1), "the event's own span: {tp}");
    assert_eq!(hd["tracestate"], "vendor=1");
    assert_eq!(hd["x-correlation-id"], "corr-1");
    assert_eq!(hd["x-tenant"], "t-1");
    assert!(!hd.contains_key("x-private"), "not allow-listed: {hd:?}");
    assert_eq!(hd["content-type"], "application/json");
    assert_eq!(hd["ce_specversion"], "1.0");
    assert_eq!(hd["ce_id"], body["outcome_id"].as_str().unwrap());
    assert_eq!(hd["ce_type"], "DeductAccepted");
    assert_eq!(hd["ce_subject"], "o-tr");
    assert_eq!(hd["ce_time"], body["processed_at"].as_str().unwrap());
    assert_eq!(hd["ce_source"], format!("/deductor/{}", f.topics.group));
    crate::common::contract::assert_outcome_headers(hd);

    let d = &dlq[0];
    let hd = &d.headers;
    let tp = &hd["traceparent"];
    assert_eq!(trace_of(tp), trace_of(T2), "same trace: {tp}");
    assert_ne!(span_of(tp), span_of(T2), "the event's own span: {tp}");
    assert_eq!(hd["x-correlation-id"], "corr-2", "original headers kept");
    assert_eq!(hd["x-private"], "kept", "every original header kept");
    assert_eq!(hd["deductor.error.kind"], "not_json", "{hd:?}");
    crate::common::contract::assert_dead_letter_headers(hd);
    assert_eq!(d.payload.as_deref(), Some(b"{not json".as_slice()));
    f.cleanup().await;
}

/// With `tracing.otlp_endpoint` set, the event's span is exported over
/// OTLP/HTTP (protobuf) to the collector, in the input record's trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_spans_are_exported_over_otlp_when_configured() {
    use std::io::{Read, Write};
    // A stand-in collector: answers 200 to every request, keeps what it got.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    let sink = got.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let mut req = Vec::new();
            let mut buf = [0u8; 65536];
            // Read the head, then as many body bytes as Content-Length says.
            loop {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
                let text = String::from_utf8_lossy(&req).to_ascii_lowercase();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if req.len() >= end + 4 + len {
                        break;
                    }
                }
            }
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            sink.lock().unwrap().push(req);
        }
    });

    let f = Fixture::new("otlp", 1).await;
    let ledger = f.ledger().await;
    f.promo(&ledger, "ot", PromoSpec::default()).await;
    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let event = placed("e-ot", "o-ot", "c-ot", json!([{"promotion_id": "ot"}]));
    kafka::produce_raw(
        &f.topics.input,
        &[Raw {
            key: Some(b"o-ot".to_vec()),
            payload: Some(serde_json::to_vec(&event).unwrap()),
            headers: vec![("traceparent".into(), TP.into())],
            ..Raw::default()
        }],
    )
    .await;
    let endpoint = format!("http://127.0.0.1:{port}");
    let svc = service::start(f.settings(&[("tracing.otlp_endpoint", endpoint.as_str())]));
    kafka::read_n(&f.topics.outcome, 1, WAIT).await;
    // Shutdown flushes the exporter's batch.
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("run returns Ok");

    let trace_id: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&TP[3 + 2 * i..5 + 2 * i], 16).unwrap())
        .collect();
    let requests = got.lock().unwrap().clone();
    let found = requests.iter().any(|r| {
        let head = String::from_utf8_lossy(r).to_ascii_lowercase();
        head.starts_with("post /v1/traces")
            && head.contains("content-type: application/x-protobuf")
            && r.windows(16).any(|w| w == trace_id.as_slice())
    });
    assert!(
        found,
        "no OTLP export of the input's trace among {} request(s): {:?}",
        requests.len(),
        requests
            .iter()
            .map(|r| String::from_utf8_lossy(&r[..r.len().min(200)]).into_owned())
            .collect::<Vec<_>>()
    );
    f.cleanup().await;
}
