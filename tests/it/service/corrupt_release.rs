//! A rejected placement whose release meets corrupt data, end to end: the
//! running service must hold the event (no outcome, no commit past it),
//! retry it, and once the operator repairs the field publish the rejection
//! with nothing held. Before the fix the release was skipped: the rejected
//! event kept its deduction (found by `scripts/chaos --long`).

use std::time::Duration;

use crate::common::{kafka, redis, service};
use deductor::admin::PromoSpec;
use deductor::domain::event::Id;
use serde_json::json;

const PLACED_AT: &str = "2026-11-29T10:00:00Z";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_blocked_by_corrupt_data_holds_the_event_until_the_repair() {
    let f = service::Fixture::new("corrupt-release", 1).await;
    let store = redis::TestRedis::of_fixture(&f).await;
    let ledger = store.ledger.clone();
    let flash = PromoSpec {
        budget: Some(100),
        stock: Some(10),
        ..PromoSpec::default()
    };
    f.promo(&ledger, "flash", flash).await;
    let member = PromoSpec {
        per_customer: Some(1),
        ..PromoSpec::default()
    };
    f.promo(&ledger, "member", member).await;
    let id = |s: &str| Id::parse(s).unwrap();
    // c1 has used its one `member` order; a zombie delivery of e1 got as
    // far as deducting `flash` (29 of budget) before dying.
    let used = store.keys().used(&id("member"), &id("c1"));
    store.set(&used, "1").await;
    let k = store
        .zombie_deduct("flash", "o1", "c1", "e1", 1_795_946_400, 29, 0)
        .await;
    // Then `flash`'s stock is corrupted.
    let promo = store.keys().promotion(&id("flash"));
    store.hset(&promo, &[("stock", "007")]).await;

    let e1 = json!({"type": "OrderPlaced", "event_id": "e1", "order_id": "o1",
        "customer_id": "c1", "occurred_at": PLACED_AT,
        "lines": [{"promotion_id": "flash", "budget": 29}, {"promotion_id": "member"}]});
    kafka::produce_events(&f.topics.input, &[e1]).await;
    let svc = service::start(f.settings(&[
        ("retry.initial_interval_ms", "50"),
        ("retry.max_interval_ms", "200"),
    ]));

    // The event is retried, not decided: its second line was rejected (the
    // reason is stored), then for seconds of retries there is no outcome,
    // nothing committed, and the deduction is still held.
    let memo = store.keys().rejected(&id("member"), &id("e1"));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while store.get(&memo).await.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "e1 was never attempted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        store.get(&memo).await.as_deref(),
        Some("user_limit_reached")
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let early = kafka::read_all(&f.topics.outcome).await;
    assert!(
        early.is_empty(),
        "an outcome before the repair: {:?}",
        early.iter().map(|r| r.json()).collect::<Vec<_>>()
    );
    let committed = kafka::committed(&f.topics.group, &f.topics.input, 1).await;
    assert_ne!(
        committed.get(&0).copied().flatten(),
        Some(1),
        "committed past the held event"
    );
    assert_eq!(
        store.promo_field("flash", "budget").await.as_deref(),
        Some("71")
    );
    assert!(!svc.is_finished(), "the service stopped on corrupt data");

    // The operator puts the field back; the event is decided once.
    store.hset(&promo, &[("stock", "10")]).await;
    let outcomes = kafka::read_until(&f.topics.outcome, Duration::from_secs(60), |r| {
        !r.is_empty()
    })
    .await;
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 1, Duration::from_secs(30))
        .await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");

    assert_eq!(outcomes.len(), 1, "one outcome");
    let o = outcomes[0].json();
    assert_eq!(o["type"], "DeductRejected", "{o}");
    assert_eq!(o["reason"], "user_limit_reached", "{o}");
    assert_eq!(o["promotion_id"], "member", "{o}");
    assert_eq!(
        store.promo_field("flash", "budget").await.as_deref(),
        Some("100")
    );
    assert!(
        store.record(&k.record).await.is_empty(),
        "nothing held by e1"
    );
    f.cleanup().await;
}
