//! Issue 27 item 3, end to end: the previous release decided the first
//! events of a sale (records in the previous layout, written by its scripts)
//! and stopped before committing them, as a `Recreate` rollout stops it. This
//! build's service then consumes the topic from the committed offset: the
//! events the previous release decided come out as duplicates with their
//! amounts, refunds of its orders return exactly what was taken, new orders
//! go into the lean layout, and `audit` ends clean.

use std::time::Duration;

use crate::common::{kafka, redis, service};
use crate::ledger::upgrade::{kind, old_deduct, old_rollback, status};
use deductor::admin::{audit, PromoSpec};
use deductor::domain::event::Id;
use serde_json::{json, Value};

const AT: &str = "2026-11-29T10:00:00Z";

fn placed(e: &str, o: &str, c: &str, budget: u64, stock: u64) -> Value {
    json!({"type": "OrderPlaced", "event_id": e, "order_id": o, "customer_id": c,
        "occurred_at": AT,
        "lines": [{"promotion_id": "flash", "budget": budget, "stock": stock}]})
}

fn refunded(e: &str, o: &str, c: &str, amounts: Option<(u64, u64)>) -> Value {
    let line = match amounts {
        Some((b, s)) => json!({"promotion_id": "flash", "budget": b, "stock": s}),
        None => json!({"promotion_id": "flash"}),
    };
    json!({"type": "OrderRefunded", "event_id": e, "order_id": o, "customer_id": c,
        "occurred_at": AT, "lines": [line]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_carries_on_a_sale_the_previous_release_started() {
    let f = service::Fixture::new("upgrade", 1).await;
    let store = redis::TestRedis::of_fixture(&f).await;
    let ledger = store.ledger.clone();
    let flash = PromoSpec {
        budget: Some(1000),
        stock: Some(50),
        per_customer: Some(2),
        ..PromoSpec::default()
    };
    f.promo(&ledger, "flash", flash).await;

    // The previous release decided e1, e2, r1 and e3 in Redis, then stopped
    // before committing their offsets.
    assert_eq!(
        status(&old_deduct(&store, "flash", "o1", "c1", "e1", 30, 1).await),
        "accepted"
    );
    assert_eq!(
        status(&old_deduct(&store, "flash", "o2", "c2", "e2", 20, 2).await),
        "accepted"
    );
    assert_eq!(
        status(&old_rollback(&store, "flash", "o1", "c1", "r1", Some(10)).await),
        "applied"
    );
    assert_eq!(
        status(&old_deduct(&store, "flash", "o3", "c1", "e3", 25, 1).await),
        "accepted"
    );
    let id = |s: &str| Id::parse(s).unwrap();
    for o in ["o1", "o2", "o3"] {
        let key = store.keys().record(&id("flash"), &id(o));
        assert_eq!(kind(&store, &key).await, "hash", "{o}: the previous layout");
    }

    let events = [
        placed("e1", "o1", "c1", 30, 1),
        placed("e2", "o2", "c2", 20, 2),
        refunded("r1", "o1", "c1", Some((10, 0))),
        placed("e3", "o3", "c1", 25, 1),
        refunded("r2", "o1", "c1", None),
        refunded("r3", "o2", "c2", None),
        placed("e5", "o5", "c3", 15, 1),
    ];
    kafka::produce_events(&f.topics.input, &events).await;
    let svc = service::start(f.settings(&[]));
    let outcomes = kafka::read_until(&f.topics.outcome, Duration::from_secs(60), |r| {
        r.len() >= events.len()
    })
    .await;
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 1, Duration::from_secs(30))
        .await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");

    // One outcome per event, in order per order; what the previous release decided is
    // a duplicate with its amounts.
    let seen: Vec<(String, String, bool, u64, u64)> = outcomes
        .iter()
        .map(|r| {
            let o = r.json();
            let line = &o["lines"][0];
            (
                o["event_id"].as_str().unwrap_or_default().to_owned(),
                o["type"].as_str().unwrap_or_default().to_owned(),
                o["duplicate"].as_bool().unwrap_or_default(),
                line["budget"].as_u64().unwrap_or(u64::MAX),
                line["stock"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect();
    let want: Vec<(String, String, bool, u64, u64)> = [
        ("e1", "DeductAccepted", true, 30, 1),
        ("e2", "DeductAccepted", true, 20, 2),
        ("r1", "RollbackApplied", true, 10, 0),
        ("e3", "DeductAccepted", true, 25, 1),
        ("r2", "RollbackApplied", false, 20, 1),
        ("r3", "RollbackApplied", false, 20, 2),
        ("e5", "DeductAccepted", false, 15, 1),
    ]
    .iter()
    .map(|(e, t, d, b, s)| ((*e).to_owned(), (*t).to_owned(), *d, *b, *s))
    .collect();
    // The contract orders outcomes per order (docs/contract.md section 1),
    // not across orders: r1 (o1) and e3 (o3) may be answered either way.
    assert_eq!(seen.len(), want.len(), "{seen:?}");
    for order in [&["e1", "r1", "r2"][..], &["e2", "r3"], &["e3"], &["e5"]] {
        let of = |v: &[(String, String, bool, u64, u64)]| {
            v.iter()
                .filter(|o| order.contains(&o.0.as_str()))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(of(&seen), of(&want), "the outcomes of {order:?}");
    }

    // 1000 - 30 - 20 + 10 - 25 + 20 + 20 - 15; 50 - 1 - 2 - 1 + 1 + 2 - 1.
    assert_eq!(
        store.promo_field("flash", "budget").await.as_deref(),
        Some("960")
    );
    assert_eq!(
        store.promo_field("flash", "stock").await.as_deref(),
        Some("48")
    );
    let report = audit::audit_one(&ledger, &id("flash")).await.unwrap();
    assert!(report.breaches.is_empty(), "{:?}", report.breaches);
    assert!(report.corrupt.is_empty(), "{:?}", report.corrupt);
    assert_eq!(
        (
            report.held,
            report.outstanding_budget,
            report.outstanding_stock
        ),
        (2, 40, 2),
        "o3 (previous layout) and o5 (lean) are held"
    );
    for (o, layout) in [
        ("o1", "string"),
        ("o2", "string"),
        ("o3", "hash"),
        ("o5", "string"),
    ] {
        let key = store.keys().record(&id("flash"), &id(o));
        assert_eq!(kind(&store, &key).await, layout, "{o}");
    }
    f.cleanup().await;
}
