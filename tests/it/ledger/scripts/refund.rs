//! rollback.lua: refunds before their placement (tombstones), partial
//! refunds, refunds above what is outstanding, replays of a refund, and a
//! promotion deleted meanwhile.

use super::*;
use crate::common::redis::*;
use deductor::domain::decision::Reason;

#[tokio::test]
async fn refund_before_placement_leaves_a_tombstone() {
    let r = standalone().await;
    seed_limited(&r, "p", "1").await;
    let d = r
        .ledger
        .refund(&refunded("r1", "o1", "c", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Err(Reason::NoDeduction), false, 0, 0));
    assert!(!d.applied());

    let record = r.keys().record(&id("p"), &id("o1"));
    let dump = r.dump().await;
    let DumpedValue::Hash(h) = &dump[&record].value else {
        panic!("tombstone is a hash")
    };
    assert_eq!(h.get("state").map(String::as_str), Some("reverted"));
    assert_eq!(h.get("event"), None, "a tombstone names no event");
    assert!(dump[&record].expires);

    // The late placement is rejected, never deducted.
    let before = r.dump().await;
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c", T, &[("p", 10, 1)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d), (false, Reason::OrderReverted, "p".into()));
    let memo = r.keys().rejected(&id("p"), &id("e1"));
    r.assert_changed(&before, &[memo], "the late placement")
        .await;
}

#[tokio::test]
async fn replay_of_a_placement_after_its_refund_is_an_accepted_duplicate() {
    let r = standalone().await;
    seed_limited(&r, "p", "1").await;
    let e = placed("e1", "o1", "c", T, &[("p", 30, 2)]);
    accepted(&r.ledger.place(&e).await.unwrap());
    r.ledger
        .refund(&refunded("r1", "o1", "c", &[("p", None, None)]))
        .await
        .unwrap();
    let before = r.dump().await;
    let d = r.ledger.place(&e).await.unwrap();
    assert_eq!(
        accepted(&d),
        (true, vec![(30, 2, left(Some(100), Some(5)))])
    );
    r.assert_unchanged(&before, "a replay after the refund")
        .await;

    // Another event of the refunded order is rejected.
    let d = r
        .ledger
        .place(&placed("e2", "o1", "c", T, &[("p", 30, 2)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d), (false, Reason::OrderReverted, "p".into()));
}

#[tokio::test]
async fn partial_refunds_sum_to_the_deduction() {
    let r = standalone().await;
    seed_limited(&r, "p", "1").await;
    r.ledger
        .place(&placed("e1", "o1", "c", T, &[("p", 30, 3)]))
        .await
        .unwrap();
    let record = r.keys().record(&id("p"), &id("o1"));
    let used = r.keys().used(&id("p"), &id("c"));

    let d = r
        .ledger
        .refund(&refunded("r1", "o1", "c", &[("p", Some(10), Some(1))]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Ok(()), false, 10, 1));
    assert_eq!(d.lines[0].remaining, left(Some(80), Some(3)));
    let h = r.record(&record).await;
    assert_eq!(
        (
            h["state"].as_str(),
            h["budget"].as_str(),
            h["stock"].as_str()
        ),
        ("deducted", "20", "2")
    );
    assert_eq!(r.get(&used).await.as_deref(), Some("1"), "still held");

    // Only budget given: stock defaults to everything outstanding.
    let d = r
        .ledger
        .refund(&refunded("r2", "o1", "c", &[("p", Some(5), None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Ok(()), false, 5, 2));
    let d = r
        .ledger
        .refund(&refunded("r3", "o1", "c", &[("p", None, Some(0))]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Ok(()), false, 15, 0));
    let h = r.record(&record).await;
    assert_eq!(
        (
            h["state"].as_str(),
            h["budget"].as_str(),
            h["stock"].as_str()
        ),
        ("reverted", "0", "0")
    );
    assert_eq!((h["budget0"].as_str(), h["stock0"].as_str()), ("30", "3"));
    assert_eq!(r.get(&used).await.as_deref(), Some("0"), "released");
    assert_eq!(r.promo_field("p", "budget").await.as_deref(), Some("100"));
    assert_eq!(r.promo_field("p", "stock").await.as_deref(), Some("5"));

    let d = r
        .ledger
        .refund(&refunded("r4", "o1", "c", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Err(Reason::AlreadyReverted), false, 0, 0));
    // The customer may use the promotion again.
    accepted(
        &r.ledger
            .place(&placed("e2", "o2", "c", T, &[("p", 1, 1)]))
            .await
            .unwrap(),
    );
}

#[tokio::test]
async fn used_never_goes_below_zero() {
    let r = standalone().await;
    r.seed("p", &[("budget", "100"), ("per_customer", "1")])
        .await;
    r.ledger
        .place(&placed("e1", "o1", "c", T, &[("p", 30, 0)]))
        .await
        .unwrap();
    let used = r.keys().used(&id("p"), &id("c"));
    r.set(&used, "0").await;
    let d = r
        .ledger
        .refund(&refunded("r1", "o1", "c", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0).0, Ok(()));
    assert_eq!(r.get(&used).await.as_deref(), Some("0"));
}

#[tokio::test]
async fn refund_above_the_outstanding_amount_is_rejected() {
    let r = standalone().await;
    r.seed("p", &[("budget", "100"), ("stock", "5")]).await;
    r.ledger
        .place(&placed("e1", "o1", "c", T, &[("p", 30, 1)]))
        .await
        .unwrap();
    for (event, b, s) in [
        ("r1", Some(31), None),
        ("r2", None, Some(2)),
        ("r3", Some(30), Some(2)),
    ] {
        let before = r.dump().await;
        let d = r
            .ledger
            .refund(&refunded(event, "o1", "c", &[("p", b, s)]))
            .await
            .unwrap();
        assert_eq!(
            line(&d, 0),
            (Err(Reason::ExceedsDeducted), false, 0, 0),
            "{event}"
        );
        // The result is kept in the order's record (field refund:<E>).
        let record = r.keys().record(&id("p"), &id("o1"));
        r.assert_changed(&before, std::slice::from_ref(&record), event)
            .await;
        assert_eq!(
            r.record(&record)
                .await
                .get(&format!("refund:{event}"))
                .map(String::as_str),
            Some("rejected exceeds_deducted")
        );
    }
}

#[tokio::test]
async fn refund_replay_returns_the_stored_result() {
    let r = standalone().await;
    r.seed("p", &[("budget", "100"), ("stock", "5")]).await;
    r.ledger
        .place(&placed("e1", "o1", "c", T, &[("p", 30, 1)]))
        .await
        .unwrap();
    let e = refunded(
        "r1",
        "o1",
        "c",
        &[("p", Some(10), None), ("missing", None, None)],
    );
    let first = r.ledger.refund(&e).await.unwrap();
    assert_eq!(line(&first, 0), (Ok(()), false, 10, 1));
    assert_eq!(line(&first, 1), (Err(Reason::NoDeduction), false, 0, 0));
    assert!(first.applied());
    let record = r.keys().record(&id("p"), &id("o1"));
    assert_eq!(
        r.record(&record).await.get("refund:r1").map(String::as_str),
        Some("applied 10 1")
    );

    let before = r.dump().await;
    let again = r.ledger.refund(&e).await.unwrap();
    assert_eq!(line(&again, 0), (Ok(()), true, 10, 1));
    assert_eq!(line(&again, 1), (Err(Reason::NoDeduction), true, 0, 0));
    assert!(again.duplicate());
    r.assert_unchanged(&before, "a refund replay").await;
}

#[tokio::test]
async fn a_deleted_promotion_is_never_recreated_by_a_refund() {
    let r = standalone().await;
    r.seed("p", &[("budget", "100"), ("stock", "5")]).await;
    r.ledger
        .place(&placed("e1", "o1", "c", T, &[("p", 30, 1)]))
        .await
        .unwrap();
    let promo = r.keys().promotion(&id("p"));
    r.del(&promo).await;
    let d = r
        .ledger
        .refund(&refunded("r1", "o1", "c", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Ok(()), false, 30, 1));
    assert_eq!(d.lines[0].remaining, left(None, None));
    assert!(!r.dump().await.contains_key(&promo));

    // Nor a field that was absent (an unlimited dimension).
    r.seed("q", &[("budget", "100")]).await;
    r.ledger
        .place(&placed("e2", "o2", "c", T, &[("q", 30, 4)]))
        .await
        .unwrap();
    r.ledger
        .refund(&refunded("r2", "o2", "c", &[("q", None, None)]))
        .await
        .unwrap();
    assert_eq!(r.promo_field("q", "stock").await, None);
    assert_eq!(r.promo_field("q", "budget").await.as_deref(), Some("100"));
}
