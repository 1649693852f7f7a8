//! Promotion changes made while the running service decides a burst of
//! events.

use std::time::Duration;

use super::*;
use crate::common::kafka;
use crate::common::service::{self, Fixture};

/// Waits for the outcome of event `id` and returns it.
async fn outcome_of(f: &Fixture, id: &str) -> serde_json::Value {
    let found = |r: &kafka::Record| {
        serde_json::from_slice::<serde_json::Value>(r.payload.as_deref().unwrap_or_default())
            .ok()
            .filter(|v| v["event_id"] == id)
    };
    let rs = kafka::read_until(&f.topics.outcome, Duration::from_secs(90), |rs| {
        rs.iter().any(|r| found(r).is_some())
    })
    .await;
    rs.iter().find_map(found).unwrap()
}

/// Issue 11, "done when": pause, resume, adjust and limit run while the
/// service processes a burst of events, and nothing is lost: every event is
/// decided, initial - remaining == outstanding on every promotion, Redis
/// agrees with the decisions (accepted - refunded), and `audit` is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_changes_during_a_burst_lose_nothing_and_audit_stays_clean() {
    use crate::common::workload::{self, Shape, PLACED_AT};
    let f = Fixture::new("live-sale", 3).await;
    let ledger = f.ledger().await;
    let shape = Shape {
        orders: 400,
        customers: 150,
        promotions: 2,
        stock: 120,
        budget: 60_000,
        per_customer: Some(1),
        ..Shape::default()
    };
    let w = workload::generate("ls", &shape);
    w.seed(&f, &ledger).await;
    let svc = service::start(f.settings(&[]));
    let producer = {
        let w = w.clone();
        let topic = f.topics.input.clone();
        tokio::spawn(async move { w.produce_paced(topic, 20, Duration::from_millis(150)).await })
    };
    let cli = |args: &'static [&'static str]| {
        let e = f.env(&[("log.level", "warn")]);
        async move { deductor(&e, args).await }
    };
    // A marker placement on p0 by a customer of its own, decided in between.
    let marker = |n: u32| {
        serde_json::json!({"type": "OrderPlaced", "event_id": format!("m-e{n}"),
            "order_id": format!("m-o{n}"), "customer_id": format!("m-c{n}"),
            "occurred_at": PLACED_AT, "lines": [{"promotion_id": "p0", "budget": 10, "stock": 1}]})
    };

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_exit(&cli(&["promo", "pause", "p0"]).await, 0, "pause");
    kafka::produce_events(&f.topics.input, &[marker(1)]).await;
    let v = outcome_of(&f, "m-e1").await;
    assert_eq!(v["reason"], "promotion_inactive", "paused: {v}");
    assert_exit(&cli(&["promo", "resume", "p0"]).await, 0, "resume");
    kafka::produce_events(&f.topics.input, &[marker(2)]).await;
    let v = outcome_of(&f, "m-e2").await;
    assert_eq!(v["type"], "DeductAccepted", "resumed: {v}");

    assert_exit(
        &cli(&[
            "promo", "adjust", "p0", "--stock", "+30", "--budget", "+5000",
        ])
        .await,
        0,
        "adjust up",
    );
    assert_exit(
        &cli(&["promo", "limit", "p1", "--per-customer", "2"]).await,
        0,
        "limit 2",
    );
    // Taking back may meet a promotion already sold out: then it is refused
    // and nothing is written.
    let o = cli(&["promo", "adjust", "p1", "--stock", "-3"]).await;
    if o.status.code() != Some(0) {
        assert_exit(&o, 1, "adjust down refused");
        assert!(stderr(&o).contains("below 0"), "{}", stderr(&o));
    }
    assert_exit(
        &cli(&["promo", "limit", "p0", "--per-customer", "none"]).await,
        0,
        "limit none",
    );
    assert_exit(
        &cli(&["promo", "adjust", "p1", "--budget", "-100"]).await,
        0,
        "adjust budget down",
    );
    assert_exit(
        &cli(&["promo", "limit", "p0", "--per-customer", "3"]).await,
        0,
        "limit 3",
    );

    producer.await.unwrap();
    let (outcomes, _dlq) = w.wait_done(&f, Duration::from_secs(180)).await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");

    // Every event decided once; the decisions add up to what Redis holds.
    let mut first: std::collections::BTreeMap<String, serde_json::Value> = Default::default();
    for r in &outcomes {
        let v = r.json();
        if let Some(id) = v["event_id"].as_str() {
            first.entry(id.to_owned()).or_insert(v);
        }
    }
    for id in w.event_ids() {
        assert!(first.contains_key(&id), "event {id} has no outcome");
    }
    let mut held: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
    for v in first.values() {
        let sign = match v["type"].as_str() {
            Some("DeductAccepted") => 1,
            Some("RollbackApplied") => -1,
            _ => continue,
        };
        for l in v["lines"].as_array().unwrap() {
            if sign < 0 && l["status"] != "applied" {
                continue;
            }
            let e = held
                .entry(l["promotion_id"].as_str().unwrap().to_owned())
                .or_default();
            e.0 += sign * l["budget"].as_i64().unwrap();
            e.1 += sign * l["stock"].as_i64().unwrap();
        }
    }
    for p in ["p0", "p1"] {
        let id = deductor::domain::event::Id::parse(p).unwrap();
        let view = deductor::admin::promo_show(&ledger, &id)
            .await
            .unwrap()
            .unwrap();
        let report = deductor::admin::audit::audit_one(&ledger, &id)
            .await
            .unwrap();
        let (ib, b) = (
            view.initial_budget.unwrap() as i64,
            view.budget.unwrap() as i64,
        );
        let (is, s) = (
            view.initial_stock.unwrap() as i64,
            view.stock.unwrap() as i64,
        );
        assert_eq!(
            (ib - b, is - s),
            (report.outstanding_budget, report.outstanding_stock),
            "{p}: initial - remaining == outstanding"
        );
        assert_eq!(
            (ib - b, is - s),
            held.get(p).copied().unwrap_or_default(),
            "{p}: initial - remaining == accepted - refunded"
        );
        assert!(report.breaches.is_empty(), "{p}: {:?}", report.breaches);
    }
    let o = cli(&["audit", "--output", "json"]).await;
    assert_exit(&o, 0, "audit after the burst");
    assert_eq!(json_of(&o)["clean"], true);
    f.cleanup().await;
}
