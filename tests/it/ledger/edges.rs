//! The ledger's promises at the edges production reaches (issue 10, items
//! 1 to 5), each a reproduction that broke the promise before the fix:
//! corrupt data meeting a second delivery, a per-customer limit changed on
//! a live promotion, refunds naming another customer, a promotion replaced
//! or re-created while orders hold it, and refund results that expired
//! before the order did. Real Redis, each test under a key prefix of its own.

use crate::common::redis::*;
use deductor::admin::audit;
use deductor::admin::{self, PromoSpec};
use deductor::domain::decision::{PlaceDecision, Reason};
use deductor::ledger::Ledger;

const T: i64 = 1_800_000_000;

fn is_accepted(d: &PlaceDecision) -> bool {
    matches!(d, PlaceDecision::Accepted { .. })
}

/// Places an event that must be accepted.
async fn accept(r: &TestRedis, e: &str, o: &str, c: &str, t: i64, lines: &[(&str, u64, u64)]) {
    let d = r.ledger.place(&placed(e, o, c, t, lines)).await.unwrap();
    assert!(is_accepted(&d), "{e}: {d:?}");
}

async fn audit_clean(r: &TestRedis, p: &str) {
    let report = audit::audit_one(&r.ledger, &id(p)).await.unwrap();
    assert!(report.breaches.is_empty(), "{p}: {:?}", report.breaches);
}

fn spec(budget: Option<u64>, stock: Option<u64>, per_customer: Option<u64>) -> PromoSpec {
    PromoSpec {
        budget,
        stock,
        per_customer,
        ..PromoSpec::default()
    }
}

/// Item 1: corrupt data is a decision like any other. Delivery A meets
/// corrupt data on the second line and rejects; after the operator repairs
/// it, a slower delivery B of the same event must not deduct afresh and
/// accept (before the fix it did, and both deductions stayed held for an
/// event the topic says was rejected).
#[tokio::test]
async fn corrupt_data_is_remembered_so_every_delivery_repeats_the_rejection() {
    let r = standalone().await;
    admin::promo_set(&r.ledger, &id("p1"), spec(None, Some(10), None), false)
        .await
        .unwrap();
    r.seed("p2", &[("stock", "1e3")]).await;
    let e = placed("e1", "o1", "c1", T, &[("p1", 0, 1), ("p2", 0, 1)]);
    let a = r.ledger.place(&e).await.unwrap();
    assert_eq!(rejected(&a), (false, Reason::CorruptPromotion, "p2".into()));
    assert_eq!(r.promo_field("p1", "stock").await.as_deref(), Some("10"));

    // The operator repairs p2; delivery B of the same event arrives.
    r.seed("p2", &[("stock", "5")]).await;
    let b = r.ledger.place(&e).await.unwrap();
    assert_eq!(rejected(&b), (true, Reason::CorruptPromotion, "p2".into()));
    assert_eq!(r.promo_field("p1", "stock").await.as_deref(), Some("10"));
    assert_eq!(r.promo_field("p2", "stock").await.as_deref(), Some("5"));
    assert!(
        r.record(&r.keys().record(&id("p1"), &id("o1")))
            .await
            .is_empty(),
        "no deduction is held for the rejected event"
    );
    audit_clean(&r, "p1").await;

    // A single-line event meeting corrupt data answers the same after repair.
    r.seed("p3", &[("stock", "-1")]).await;
    let single = placed("e2", "o2", "c1", T, &[("p3", 0, 1)]);
    assert_eq!(
        rejected(&r.ledger.place(&single).await.unwrap()),
        (false, Reason::CorruptPromotion, "p3".into())
    );
    r.seed("p3", &[("stock", "3")]).await;
    assert_eq!(
        rejected(&r.ledger.place(&single).await.unwrap()),
        (true, Reason::CorruptPromotion, "p3".into())
    );
    assert_eq!(r.promo_field("p3", "stock").await.as_deref(), Some("3"));

    // A refund meeting corrupt data repeats its rejection after the repair;
    // a new refund event of the order applies.
    accept(&r, "e3", "o3", "c1", T, &[("p1", 0, 2)]).await;
    r.hset(&r.keys().promotion(&id("p1")), &[("stock", "08")])
        .await;
    let refund = refunded("r1", "o3", "c1", &[("p1", None, None)]);
    let d = r.ledger.refund(&refund).await.unwrap();
    assert_eq!(line(&d, 0), (Err(Reason::CorruptPromotion), false, 0, 0));
    r.hset(&r.keys().promotion(&id("p1")), &[("stock", "8")])
        .await;
    let d = r.ledger.refund(&refund).await.unwrap();
    assert_eq!(line(&d, 0), (Err(Reason::CorruptPromotion), true, 0, 0));
    assert_eq!(r.promo_field("p1", "stock").await.as_deref(), Some("8"));
    let d = r
        .ledger
        .refund(&refunded("r2", "o3", "c1", &[("p1", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Ok(()), false, 0, 2));
    assert_eq!(r.promo_field("p1", "stock").await.as_deref(), Some("10"));
    audit_clean(&r, "p1").await;
}

/// Item 1, the oversell variant: a zombie delivery of E deducted p1 (the
/// last unit), a second placement event E2 of the same order was absorbed
/// into that record and answered accepted, then E is rejected on corrupt
/// data. Before the fix the release gave the unit back while E2 stayed
/// accepted holding nothing, and the unit was sold again.
#[tokio::test]
async fn a_rejected_event_hands_its_record_to_an_absorbed_event_instead_of_releasing() {
    let r = standalone().await;
    admin::promo_set(&r.ledger, &id("p1"), spec(None, Some(1), None), false)
        .await
        .unwrap();
    r.seed("p2", &[("stock", "1e3")]).await;
    // The zombie delivery of E got as far as deducting p1.
    let k = r.zombie_deduct("p1", "o1", "c1", "e1", T, 0, 1).await;
    // E2, another placement of the order, is absorbed: accepted.
    let e2 = placed("e2", "o1", "c1", T, &[("p1", 0, 1)]);
    assert!(is_accepted(&r.ledger.place(&e2).await.unwrap()));
    // E itself is decided: corrupt on p2, so its lines are released.
    let e = placed("e1", "o1", "c1", T, &[("p1", 0, 1), ("p2", 0, 1)]);
    assert_eq!(
        rejected(&r.ledger.place(&e).await.unwrap()).1,
        Reason::CorruptPromotion
    );
    // The unit stays held, now by E2, which keeps its acceptance.
    assert_eq!(r.promo_field("p1", "stock").await.as_deref(), Some("0"));
    let rec = r.record(&k.record).await;
    assert_eq!(rec.get("event").map(String::as_str), Some("e2"), "{rec:?}");
    assert_eq!(rec.get("state").map(String::as_str), Some("deducted"));
    assert!(is_accepted(&r.ledger.place(&e2).await.unwrap()));
    // Nobody else gets the unit.
    let other = placed("e3", "o9", "c9", T, &[("p1", 0, 1)]);
    assert_eq!(
        rejected(&r.ledger.place(&other).await.unwrap()).1,
        Reason::StockInsufficient
    );
    audit_clean(&r, "p1").await;
    // Refunding the order returns the unit once.
    let d = r
        .ledger
        .refund(&refunded("r1", "o1", "c1", &[("p1", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Ok(()), false, 0, 1));
    assert_eq!(r.promo_field("p1", "stock").await.as_deref(), Some("1"));
    audit_clean(&r, "p1").await;
}

/// Item 2: a limit added to a live promotion. O1 was placed while P had no
/// limit (not counted); its refund must not give back a slot that O2 took
/// under the limit. Before the fix O3 was accepted: two orders, limit one.
#[tokio::test]
async fn a_limit_added_later_only_gives_back_counted_slots() {
    let r = standalone().await;
    let p = id("p");
    admin::promo_set(&r.ledger, &p, spec(None, Some(100), None), false)
        .await
        .unwrap();
    accept(&r, "e1", "o1", "c", T, &[("p", 0, 1)]).await;
    r.hset(&r.keys().promotion(&p), &[("per_customer", "1")])
        .await;
    accept(&r, "e2", "o2", "c", T, &[("p", 0, 1)]).await;
    let used = r.keys().used(&p, &id("c"));
    assert_eq!(r.get(&used).await.as_deref(), Some("1"));
    r.ledger
        .refund(&refunded("r1", "o1", "c", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(
        r.get(&used).await.as_deref(),
        Some("1"),
        "o1 never took a slot"
    );
    let d = r
        .ledger
        .place(&placed("e3", "o3", "c", T, &[("p", 0, 1)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d).1, Reason::UserLimitReached);
    audit_clean(&r, "p").await;
}

/// Item 2, the other way round: the limit removed, an uncounted order
/// released or refunded, the limit restored.
#[tokio::test]
async fn a_limit_removed_and_restored_keeps_the_counted_slot() {
    let r = standalone().await;
    let p = id("p");
    admin::promo_set(&r.ledger, &p, spec(None, Some(100), Some(1)), false)
        .await
        .unwrap();
    accept(&r, "e1", "o1", "c", T, &[("p", 0, 1)]).await;
    let _: () =
        fred::prelude::HashesInterface::hdel(r.pool(), r.keys().promotion(&p), "per_customer")
            .await
            .unwrap();
    // An uncounted multi-line order that is released (q rejects), and an
    // uncounted order refunded.
    admin::promo_set(&r.ledger, &id("q"), spec(None, Some(0), None), false)
        .await
        .unwrap();
    let d = r
        .ledger
        .place(&placed("e2", "o2", "c", T, &[("p", 0, 1), ("q", 0, 1)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d).1, Reason::StockInsufficient);
    accept(&r, "e3", "o3", "c", T, &[("p", 0, 1)]).await;
    r.ledger
        .refund(&refunded("r3", "o3", "c", &[("p", None, None)]))
        .await
        .unwrap();
    let used = r.keys().used(&p, &id("c"));
    assert_eq!(r.get(&used).await.as_deref(), Some("1"), "o1 still counts");
    r.hset(&r.keys().promotion(&p), &[("per_customer", "1")])
        .await;
    let d = r
        .ledger
        .place(&placed("e4", "o4", "c", T, &[("p", 0, 1)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d).1, Reason::UserLimitReached);
    audit_clean(&r, "p").await;
}

/// Item 3: a refund whose event names another customer acts on the
/// customer the deduction counted for. Before the fix it decremented the
/// named customer's counter: C2 could exceed the limit and C1 stayed blocked.
#[tokio::test]
async fn a_refund_naming_another_customer_frees_the_deductions_customer() {
    let r = standalone().await;
    let p = id("p");
    admin::promo_set(&r.ledger, &p, spec(None, Some(100), Some(1)), false)
        .await
        .unwrap();
    for (e, o, c) in [("e1", "o1", "c1"), ("e2", "o2", "c2")] {
        accept(&r, e, o, c, T, &[("p", 0, 1)]).await;
    }
    // The refund of c1's order names c2.
    let d = r
        .ledger
        .refund(&refunded("r1", "o1", "c2", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Ok(()), false, 0, 1));
    assert_eq!(
        r.get(&r.keys().used(&p, &id("c1"))).await.as_deref(),
        Some("0")
    );
    assert_eq!(
        r.get(&r.keys().used(&p, &id("c2"))).await.as_deref(),
        Some("1")
    );
    // c2 is still at the limit; c1 may order again.
    let d = r
        .ledger
        .place(&placed("e3", "o3", "c2", T, &[("p", 0, 1)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d).1, Reason::UserLimitReached);
    accept(&r, "e4", "o4", "c1", T, &[("p", 0, 1)]).await;
    // The redelivered refund repeats its result and changes nothing.
    let before = r.dump().await;
    let d = r
        .ledger
        .refund(&refunded("r1", "o1", "c2", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Ok(()), true, 0, 1));
    r.assert_unchanged(&before, "the redelivered refund").await;
    audit_clean(&r, "p").await;
}

/// Item 4: a promotion force-replaced while an order holds it. Before the
/// fix the refund credited the new incarnation with what was taken from the
/// old one: budget 1000000000000999, past the 15-digit bound, and every
/// later call on the promotion failed CORRUPT (bricked).
#[tokio::test]
async fn a_refund_never_credits_a_replaced_or_recreated_promotion() {
    let r = standalone().await;
    let p = id("p");
    admin::promo_set(
        &r.ledger,
        &p,
        spec(Some(999_999_999_999_000), None, None),
        false,
    )
    .await
    .unwrap();
    accept(&r, "e1", "o1", "c", T, &[("p", 1000, 0)]).await;
    admin::promo_set(
        &r.ledger,
        &p,
        spec(Some(999_999_999_999_999), None, None),
        true,
    )
    .await
    .unwrap();
    let d = r
        .ledger
        .refund(&refunded("r1", "o1", "c", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0).0, Ok(()), "the order's record is reverted");
    assert_eq!(
        r.promo_field("p", "budget").await.as_deref(),
        Some("999999999999999")
    );
    // The promotion still works.
    accept(&r, "e2", "o2", "c", T, &[("p", 1, 0)]).await;
    audit_clean(&r, "p").await;

    // Deleted and re-created: the same.
    accept(&r, "e3", "o3", "c", T, &[("p", 10, 0)]).await;
    r.del(&r.keys().promotion(&p)).await;
    admin::promo_set(&r.ledger, &p, spec(Some(50), None, None), false)
        .await
        .unwrap();
    r.ledger
        .refund(&refunded("r3", "o3", "c", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(r.promo_field("p", "budget").await.as_deref(), Some("50"));
    audit_clean(&r, "p").await;
}

/// Item 4: remaining never exceeds initial, even where a record and the
/// promotion disagree (a hand-edited hash of the same incarnation).
#[tokio::test]
async fn a_refund_never_lifts_remaining_above_initial() {
    let r = standalone().await;
    let p = id("p");
    admin::promo_set(&r.ledger, &p, spec(None, Some(5), None), false)
        .await
        .unwrap();
    accept(&r, "e1", "o1", "c", T, &[("p", 0, 2)]).await;
    // Someone "fixed" the stock by hand back to its initial amount.
    r.hset(&r.keys().promotion(&p), &[("stock", "5")]).await;
    r.ledger
        .refund(&refunded("r1", "o1", "c", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(r.promo_field("p", "stock").await.as_deref(), Some("5"));
    // And no field ever passes the 15-digit bound without an initial amount.
    r.seed("big", &[("budget", "999999999999990")]).await;
    accept(&r, "e2", "o2", "c", T, &[("big", 5, 0)]).await;
    r.hset(
        &r.keys().promotion(&id("big")),
        &[("budget", "999999999999998")],
    )
    .await;
    r.ledger
        .refund(&refunded("r2", "o2", "c", &[("big", None, None)]))
        .await
        .unwrap();
    assert_eq!(
        r.promo_field("big", "budget").await.as_deref(),
        Some("999999999999999")
    );
}

/// Item 5: refund results live as long as the order's record, not
/// `refund_ttl`. Before the fix a partial refund of 40 redelivered after
/// `refund_ttl` was applied again (80 returned), and a full refund flipped
/// to `already_reverted`.
#[tokio::test]
async fn a_refund_redelivered_after_refund_ttl_repeats_its_result() {
    let base = standalone().await;
    let mut settings = crate::common::redis::settings(&base.url, &base.prefix);
    settings.refund_ttl_secs = 1;
    let ledger = Ledger::connect(&settings).await.unwrap();
    let r = base.with_ledger(ledger).await;
    admin::promo_set(&r.ledger, &id("p"), spec(Some(1000), None, None), false)
        .await
        .unwrap();
    for (e, o) in [("e1", "o1"), ("e2", "o2")] {
        accept(&r, e, o, "c", T, &[("p", 100, 0)]).await;
    }
    let partial = refunded("r1", "o1", "c", &[("p", Some(40), None)]);
    let full = refunded("r2", "o2", "c", &[("p", None, None)]);
    assert_eq!(
        line(&r.ledger.refund(&partial).await.unwrap(), 0),
        (Ok(()), false, 40, 0)
    );
    assert_eq!(
        line(&r.ledger.refund(&full).await.unwrap(), 0),
        (Ok(()), false, 100, 0)
    );
    assert_eq!(r.promo_field("p", "budget").await.as_deref(), Some("940"));
    // Past refund_ttl (1 s): every key with that TTL is gone.
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    assert_eq!(
        line(&r.ledger.refund(&partial).await.unwrap(), 0),
        (Ok(()), true, 40, 0)
    );
    assert_eq!(
        line(&r.ledger.refund(&full).await.unwrap(), 0),
        (Ok(()), true, 100, 0)
    );
    assert_eq!(r.promo_field("p", "budget").await.as_deref(), Some("940"));
    audit_clean(&r, "p").await;
}

/// `promo set --force` without `--discard-outstanding` checks in the same
/// script as the write that nothing is outstanding: a deduction landing after
/// the CLI's first look is still seen, and nothing is replaced.
#[tokio::test]
async fn a_guarded_replace_refuses_while_deductions_are_outstanding() {
    let r = standalone().await;
    let p = id("p");
    admin::promo_set(&r.ledger, &p, spec(None, Some(5), None), false)
        .await
        .unwrap();
    accept(&r, "e1", "o1", "c", T, &[("p", 0, 1)]).await;
    let before = r.dump().await;
    let e = admin::promo_replace_if_settled(&r.ledger, &p, spec(None, Some(9), None))
        .await
        .unwrap_err();
    assert!(matches!(e, admin::AdminError::Refused(_)), "{e}");
    r.assert_unchanged(&before, "a refused replace").await;
    r.ledger
        .refund(&refunded("r1", "o1", "c", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(
        admin::promo_replace_if_settled(&r.ledger, &p, spec(None, Some(9), None))
            .await
            .unwrap(),
        admin::PromoSetResult::Replaced
    );
    assert_eq!(r.promo_field("p", "stock").await.as_deref(), Some("9"));
    assert_eq!(r.promo_field("p", "gen").await.as_deref(), Some("2"));
}

/// A line marked released while no line holds the event's reason: the
/// reason was written on a Redis node that failed over before replicating it
/// (the event was not published: the durability gate had not passed). Found
/// by the chaos suite's Cluster failover run, which got `order_reverted` for
/// an order never refunded. The event is decided again instead.
#[tokio::test]
async fn a_released_event_whose_reason_was_lost_is_decided_again() {
    let r = standalone().await;
    for p in ["a", "b"] {
        admin::promo_set(&r.ledger, &id(p), spec(Some(1000), Some(10), None), false)
            .await
            .unwrap();
    }
    let e = placed(
        "e1",
        "o1",
        "c1",
        T,
        &[("a", 10, 1), ("b", 10, 1), ("ghost", 1, 1)],
    );
    let first = r.ledger.place(&e).await.unwrap();
    assert_eq!(
        rejected(&first),
        (false, Reason::PromotionNotFound, "ghost".to_owned())
    );
    // The failing line's reason is lost; the released marks of a and b stay.
    r.del(&r.keys().rejected(&id("ghost"), &id("e1"))).await;
    let again = r.ledger.place(&e).await.unwrap();
    let (_, reason, p) = rejected(&again);
    assert_eq!((reason, p.as_str()), (Reason::PromotionNotFound, "ghost"));
    // Nothing is held, and the reason is stored again.
    audit_clean(&r, "a").await;
    audit_clean(&r, "b").await;
    let third = r.ledger.place(&e).await.unwrap();
    assert_eq!(
        rejected(&third),
        (true, Reason::PromotionNotFound, "ghost".to_owned())
    );
}

/// A rejected placement whose release meets corrupt data (found by
/// `scripts/chaos --long`): a zombie delivery of E deducted `flash` (budget
/// 29), the data of `flash` is then corrupted, and E is rejected on its
/// second line. Before the fix the release was reported and skipped: the
/// rejected event kept its deduction and the order's refund gave it back
/// (`RollbackApplied 29` for an order the topic says was rejected). Now the
/// placement fails with a blocked release (the pipeline retries it), and
/// after the repair it repeats the rejection with nothing held.
#[tokio::test]
async fn a_release_that_meets_corrupt_data_waits_for_the_repair() {
    let r = standalone().await;
    admin::promo_set(
        &r.ledger,
        &id("flash"),
        spec(Some(100), Some(10), None),
        false,
    )
    .await
    .unwrap();
    admin::promo_set(&r.ledger, &id("member"), spec(None, None, Some(1)), false)
        .await
        .unwrap();
    // c1 has used its one `member` order already.
    accept(&r, "e0", "o0", "c1", T, &[("member", 0, 0)]).await;
    // The zombie delivery of E got as far as deducting `flash`.
    let k = r.zombie_deduct("flash", "o1", "c1", "e1", T, 29, 0).await;
    assert_eq!(
        r.promo_field("flash", "budget").await.as_deref(),
        Some("71")
    );
    // Then `flash`'s stock is corrupted, and E is delivered again.
    r.hset(&r.keys().promotion(&id("flash")), &[("stock", "007")])
        .await;
    let e = placed("e1", "o1", "c1", T, &[("flash", 29, 0), ("member", 0, 0)]);
    let err = r.ledger.place(&e).await.unwrap_err();
    assert!(err.is_release_blocked(), "{err}");
    assert!(err.to_string().contains("stock: 007"), "{err}");
    // Nothing of `flash` was written: the deduction is still held.
    assert_eq!(
        r.promo_field("flash", "budget").await.as_deref(),
        Some("71")
    );
    assert_eq!(
        r.record(&k.record).await.get("state").map(String::as_str),
        Some("deducted")
    );
    // Still blocked on a retry before the repair.
    assert!(r.ledger.place(&e).await.unwrap_err().is_release_blocked());

    // The operator repairs the field; the retry decides as the first delivery would have.
    r.hset(&r.keys().promotion(&id("flash")), &[("stock", "10")])
        .await;
    let d = r.ledger.place(&e).await.unwrap();
    assert_eq!(
        rejected(&d),
        (true, Reason::UserLimitReached, "member".into())
    );
    assert_eq!(
        r.promo_field("flash", "budget").await.as_deref(),
        Some("100")
    );
    assert!(r.record(&k.record).await.is_empty(), "nothing held by E");
    audit_clean(&r, "flash").await;
    // The order's refund finds nothing to give back.
    let d = r
        .ledger
        .refund(&refunded(
            "r1",
            "o1",
            "c1",
            &[("flash", None, None), ("member", None, None)],
        ))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Err(Reason::NoDeduction), false, 0, 0));
    assert_eq!(
        r.promo_field("flash", "budget").await.as_deref(),
        Some("100")
    );
}

/// A rejection read back on the first line releases the later lines too.
/// An earlier attempt of the event deducted both lines; then the first
/// line's deduction was lost (as a Redis failover loses a write its
/// replica lacked: the record gone, the amounts back) and a retry rejected
/// it afresh (the budget is short now), storing the reason. A further
/// delivery reads that rejection back on the first line and must release
/// the second line's deduction: the event is rejected, it holds nothing
/// (before the fix the later line stayed deducted for good).
#[tokio::test]
async fn a_rejection_read_back_on_the_first_line_releases_the_later_lines() {
    let r = standalone().await;
    admin::promo_set(&r.ledger, &id("a"), spec(Some(10), None, None), false)
        .await
        .unwrap();
    admin::promo_set(&r.ledger, &id("b"), spec(None, Some(10), None), false)
        .await
        .unwrap();
    let e = placed("e1", "o1", "c1", T, &[("a", 5, 0), ("b", 0, 1)]);
    accept(&r, "e1", "o1", "c1", T, &[("a", 5, 0), ("b", 0, 1)]).await;
    assert_eq!(r.promo_field("b", "stock").await.as_deref(), Some("9"));

    // The first line's writes are lost; its budget is short now.
    r.del(&r.keys().record(&id("a"), &id("o1"))).await;
    r.seed("a", &[("budget", "3")]).await;
    // The retry that rejects afresh (the reason is stored on line a).
    r.set(&r.keys().rejected(&id("a"), &id("e1")), "budget_exceeded")
        .await;

    let d = r.ledger.place(&e).await.unwrap();
    assert_eq!(rejected(&d), (true, Reason::BudgetExceeded, "a".into()));
    assert_eq!(
        r.promo_field("b", "stock").await.as_deref(),
        Some("10"),
        "the rejected event still holds its later line"
    );
    audit_clean(&r, "b").await;
}

/// Issue 23, defect 6: order o1 has lines P, Q, R (stock 1 each); delivery 1
/// is accepted on all three but never published; then Q's record is
/// corrupted (`counted 7`); delivery 2 is rejected `corrupt_promotion` on Q
/// and must release both P *and* R: a rejected order holds nothing. Before
/// the fix R kept its unit and its `deducted` record for the rejected
/// event, and `audit` saw no breach since the record accounted for it.
/// Run on `r` (its ledger batching or not, gated or not); returns the
/// event, for the caller's further checks.
pub(crate) async fn corrupt_record_met_on_redelivery_releases_every_other_line(
    r: &TestRedis,
    place: impl AsyncFn(&deductor::domain::event::OrderPlaced) -> PlaceDecision,
) {
    for p in ["P", "Q", "R"] {
        admin::promo_set(&r.ledger, &id(p), spec(None, Some(1), Some(1)), false)
            .await
            .unwrap();
    }
    let e = placed(
        "e1",
        "o1",
        "c1",
        T,
        &[("P", 0, 1), ("Q", 0, 1), ("R", 0, 1)],
    );
    let d = place(&e).await;
    assert!(is_accepted(&d), "delivery 1: {d:?}");
    for p in ["P", "Q", "R"] {
        assert_eq!(r.promo_field(p, "stock").await.as_deref(), Some("0"), "{p}");
    }
    // Delivery 1's outcome was never published; Q's record goes corrupt.
    r.hset(&r.keys().record(&id("Q"), &id("o1")), &[("counted", "7")])
        .await;

    let d = place(&e).await;
    assert_eq!(rejected(&d), (false, Reason::CorruptPromotion, "Q".into()));
    for p in ["P", "R"] {
        assert_eq!(
            r.promo_field(p, "stock").await.as_deref(),
            Some("1"),
            "the rejected event still holds line {p}"
        );
        assert!(
            r.record(&r.keys().record(&id(p), &id("o1")))
                .await
                .is_empty(),
            "line {p} keeps a record of the rejected event"
        );
        assert_eq!(
            r.get(&r.keys().used(&id(p), &id("c1"))).await.as_deref(),
            Some("0"),
            "line {p}'s per-customer slot"
        );
        audit_clean(r, p).await;
    }
    // Every later delivery repeats the rejection and changes nothing.
    let before = r.dump().await;
    let d = place(&e).await;
    assert_eq!(rejected(&d), (true, Reason::CorruptPromotion, "Q".into()));
    r.assert_unchanged(&before, "a delivery after the rejection")
        .await;
}

#[tokio::test]
async fn a_corrupt_record_met_on_redelivery_releases_the_later_lines_too() {
    let r = standalone().await;
    corrupt_record_met_on_redelivery_releases_every_other_line(&r, async |e| {
        r.ledger.place(e).await.unwrap()
    })
    .await;
}

#[tokio::test]
async fn a_corrupt_record_met_on_redelivery_releases_the_later_lines_too_batched() {
    let plain = standalone().await;
    let mut s = settings(&plain.url, &plain.prefix);
    s.batch_max_lines = 32;
    let r = plain.with_ledger(Ledger::connect(&s).await.unwrap()).await;
    corrupt_record_met_on_redelivery_releases_every_other_line(&r, async |e| {
        r.ledger.place(e).await.unwrap()
    })
    .await;
}

/// Issue 23, paper case (b): a deduction handed over to an absorbed event
/// of another customer. A zombie delivery of E1 (customer c1) deducts
/// line P of order o1, taking c1's one slot; a zombie delivery of E2
/// (customer c2, same order) is absorbed into that record. E1 then
/// finishes, rejected on line X: its release hands P's deduction over to
/// E2. E2 finishes, rejected on X too: its release gives the deduction
/// back, and c1's slot, which the record counted, must go back with it.
/// Before the fix it never did (the release named c2, whose counter the
/// record never took): c1 stayed at its limit holding nothing.
#[tokio::test]
async fn a_hand_over_to_another_customer_gives_the_first_customers_slot_back() {
    let r = standalone().await;
    admin::promo_set(&r.ledger, &id("P"), spec(None, Some(10), Some(1)), false)
        .await
        .unwrap();
    admin::promo_set(&r.ledger, &id("X"), spec(None, Some(0), None), false)
        .await
        .unwrap();
    r.zombie_deduct("P", "o1", "c1", "E1", T, 0, 1).await;
    r.zombie_deduct("P", "o1", "c2", "E2", T, 0, 1).await;
    let used = |c: &str| r.keys().used(&id("P"), &id(c));
    assert_eq!(r.get(&used("c1")).await.as_deref(), Some("1"));
    let record = r.keys().record(&id("P"), &id("o1"));
    assert_eq!(
        r.record(&record).await.get("absorbed").map(String::as_str),
        Some("E2")
    );

    let e1 = placed("E1", "o1", "c1", T, &[("P", 0, 1), ("X", 0, 1)]);
    let d = r.ledger.place(&e1).await.unwrap();
    assert_eq!(rejected(&d), (false, Reason::StockInsufficient, "X".into()));
    assert_eq!(
        r.record(&record).await.get("event").map(String::as_str),
        Some("E2")
    );
    let e2 = placed("E2", "o1", "c2", T, &[("P", 0, 1), ("X", 0, 1)]);
    let d = r.ledger.place(&e2).await.unwrap();
    assert_eq!(rejected(&d).1, Reason::StockInsufficient);

    assert!(r.record(&record).await.is_empty(), "nothing held");
    assert_eq!(r.promo_field("P", "stock").await.as_deref(), Some("10"));
    assert_eq!(
        r.get(&used("c1")).await.as_deref(),
        Some("0"),
        "c1's slot is given back"
    );
    assert_eq!(r.get(&used("c2")).await, None, "c2 never had a slot");
    audit_clean(&r, "P").await;
    // c1 can order P again.
    accept(&r, "E3", "o2", "c1", T, &[("P", 0, 1)]).await;
}

/// Issue 23, paper case (a): a chain of absorbed events. Zombie deliveries
/// of E1 (deducts line P of order o1) and E2 (absorbed into E1's record,
/// noted as `absorbed`); then E3 of the same order, single-line, is
/// absorbed too (not noted: `absorbed` keeps the first) and accepted. E2
/// and then E1 finish, both rejected on line X. E3's acceptance must keep
/// a deduction: the record is handed over to E3, never given back.
#[tokio::test]
async fn a_chain_of_absorbed_events_keeps_the_accepted_ones_deduction() {
    let r = standalone().await;
    admin::promo_set(&r.ledger, &id("P"), spec(None, Some(10), None), false)
        .await
        .unwrap();
    admin::promo_set(&r.ledger, &id("X"), spec(None, Some(0), None), false)
        .await
        .unwrap();
    r.zombie_deduct("P", "o1", "c1", "E1", T, 0, 1).await;
    r.zombie_deduct("P", "o1", "c1", "E2", T, 0, 1).await;
    accept(&r, "E3", "o1", "c1", T, &[("P", 0, 1)]).await;
    for e in ["E2", "E1"] {
        let d = r
            .ledger
            .place(&placed(e, "o1", "c1", T, &[("P", 0, 1), ("X", 0, 1)]))
            .await
            .unwrap();
        assert_eq!(rejected(&d).1, Reason::StockInsufficient, "{e}");
    }
    let record = r.record(&r.keys().record(&id("P"), &id("o1"))).await;
    assert_eq!(
        record.get("event").map(String::as_str),
        Some("E3"),
        "the accepted E3 holds the deduction: {record:?}"
    );
    assert_eq!(r.promo_field("P", "stock").await.as_deref(), Some("9"));
    audit_clean(&r, "P").await;
    // E3 redelivered answers as first, with the record's amounts.
    let d = r
        .ledger
        .place(&placed("E3", "o1", "c1", T, &[("P", 0, 1)]))
        .await
        .unwrap();
    match d {
        PlaceDecision::Accepted { lines, .. } => assert_eq!(lines[0].stock, 1),
        other => panic!("{other:?}"),
    }
}

/// `redis.batch_linger_ms` (issue 27 item 1): placements that reach a
/// lingering batcher together are decided exactly as one at a time would
/// decide them, and every one gets its own reply (the memo reads of the
/// redeliveries too): 12 orders race for a stock of 5 and two 2-line
/// orders for a budget that covers one, with batches
/// of at most 8 lines waiting up to 20 ms to fill. Then every event again
/// (redeliveries) repeats its decision, and every order is refunded (twice),
/// its refund lines batched as well.
#[tokio::test]
async fn placements_through_a_lingering_batch_decide_as_one_at_a_time() {
    let plain = standalone().await;
    let mut s = settings(&plain.url, &plain.prefix);
    s.batch_max_lines = 8;
    s.batch_linger_ms = 20;
    let r = plain.with_ledger(Ledger::connect(&s).await.unwrap()).await;
    admin::promo_set(&r.ledger, &id("P"), spec(None, Some(5), Some(1)), false)
        .await
        .unwrap();
    for q in ["Q", "R"] {
        admin::promo_set(&r.ledger, &id(q), spec(Some(100), None, None), false)
            .await
            .unwrap();
    }
    let mut events: Vec<_> = (0..12)
        .map(|i| {
            let (e, o, c) = (format!("E{i}"), format!("o{i}"), format!("c{i}"));
            placed(&e, &o, &c, T, &[("P", 0, 1)])
        })
        .collect();
    // Q second: the order that loses is rejected on its second line, so a
    // redelivery finds its rejection by the memo reads (batched too).
    events.push(placed("M1", "m1", "c1", T, &[("R", 30, 0), ("Q", 60, 0)]));
    events.push(placed("M2", "m2", "c2", T, &[("R", 30, 0), ("Q", 60, 0)]));
    let mut first: Vec<bool> = Vec::new();
    for round in 0..2 {
        let decisions: Vec<PlaceDecision> =
            futures::future::join_all(events.iter().map(|e| r.ledger.place(e)))
                .await
                .into_iter()
                .map(|d| d.unwrap())
                .collect();
        for d in &decisions[..12] {
            if !is_accepted(d) {
                assert_eq!(rejected(d).1, Reason::StockInsufficient, "{d:?}");
            }
        }
        let accepted: Vec<bool> = decisions.iter().map(is_accepted).collect();
        assert_eq!(
            accepted[..12].iter().filter(|a| **a).count(),
            5,
            "round {round}: {decisions:?}"
        );
        // The 2-line orders take 60 of Q's 100 each: exactly one of them.
        assert_eq!(
            accepted[12..].iter().filter(|a| **a).count(),
            1,
            "round {round}: {decisions:?}"
        );
        if round == 0 {
            first = accepted;
        } else {
            // Redeliveries: the same decision, read back as a duplicate.
            assert_eq!(accepted, first, "{decisions:?}");
            for d in &decisions {
                let duplicate = match d {
                    PlaceDecision::Accepted { duplicate, .. } => *duplicate,
                    PlaceDecision::Rejected { duplicate, .. } => *duplicate,
                };
                assert!(duplicate, "{d:?}");
            }
        }
        assert_eq!(r.promo_field("P", "stock").await.as_deref(), Some("0"));
        assert_eq!(r.promo_field("Q", "budget").await.as_deref(), Some("40"));
        assert_eq!(r.promo_field("R", "budget").await.as_deref(), Some("70"));
    }
    // Refunds of every order, racing too (rollback_batch.lua), one of the P
    // refunds naming another customer (applied to the deduction's), each
    // delivered twice.
    let refunds: Vec<_> = events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let h = &e.header;
            let customer = if i == 0 {
                "someone"
            } else {
                h.customer_id.as_str()
            };
            let lines: Vec<(&str, Option<u64>, Option<u64>)> = e
                .lines
                .iter()
                .map(|l| (l.promotion_id.as_str(), None, None))
                .collect();
            refunded(&format!("R{i}"), h.order_id.as_str(), customer, &lines)
        })
        .collect();
    for round in 0..2 {
        let decisions = futures::future::join_all(refunds.iter().map(|e| r.ledger.refund(e))).await;
        for (i, d) in decisions.into_iter().enumerate() {
            let d = d.unwrap();
            assert_eq!(d.applied(), first[i], "refund {i}, round {round}: {d:?}");
            assert!(
                d.lines.iter().all(|l| l.duplicate == (round == 1)),
                "refund {i}, round {round}: {d:?}"
            );
        }
        assert_eq!(r.promo_field("P", "stock").await.as_deref(), Some("5"));
        for q in ["Q", "R"] {
            assert_eq!(r.promo_field(q, "budget").await.as_deref(), Some("100"));
        }
    }
    for i in 0..12 {
        let used = r.keys().used(&id("P"), &id(&format!("c{i}")));
        // Back to 0, or never taken (a rejected order).
        let left = r.get(&used).await;
        assert!(
            matches!(left.as_deref(), None | Some("0")),
            "c{i}: {left:?}"
        );
    }
    for p in ["P", "Q", "R"] {
        audit_clean(&r, p).await;
    }
}
