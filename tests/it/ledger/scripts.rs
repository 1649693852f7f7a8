//! Every branch of lua/deduct.lua, release.lua, rollback.lua and memo.lua,
//! through the Ledger API against the real Redis (raw EVAL where the API
//! cannot reach a branch). Each test owns a key prefix.

use crate::common::redis::*;
use deductor::admin::{self, AdminError, PromoSetResult, PromoSpec};
use deductor::domain::decision::{PlaceDecision, Reason, RefundDecision, Remaining};
use deductor::error::Disposition;
use deductor::ledger::{scripts, ErrorClass, Ledger};
use fred::prelude::*;

const T: i64 = 1_800_000_000;

fn accepted(d: &PlaceDecision) -> (bool, Vec<(u64, u64, Remaining)>) {
    match d {
        PlaceDecision::Accepted { duplicate, lines } => (
            *duplicate,
            lines
                .iter()
                .map(|l| (l.budget, l.stock, l.remaining))
                .collect(),
        ),
        other => panic!("expected accepted, got {other:?}"),
    }
}

fn rejected(d: &PlaceDecision) -> (bool, Reason, String) {
    match d {
        PlaceDecision::Rejected {
            duplicate,
            reason,
            promotion_id,
        } => (*duplicate, *reason, promotion_id.to_string()),
        other => panic!("expected rejected, got {other:?}"),
    }
}

fn left(budget: Option<u64>, stock: Option<u64>) -> Remaining {
    Remaining { budget, stock }
}

fn line(d: &RefundDecision, i: usize) -> (Result<(), Reason>, bool, u64, u64) {
    let l = &d.lines[i];
    (l.status, l.duplicate, l.budget, l.stock)
}

#[tokio::test]
async fn accept_deducts_counts_and_records() {
    let r = standalone().await;
    r.seed(
        "p",
        &[("budget", "100"), ("stock", "5"), ("per_customer", "2")],
    )
    .await;
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c1", T, &[("p", 30, 1)]))
        .await
        .unwrap();
    assert_eq!(
        accepted(&d),
        (false, vec![(30, 1, left(Some(70), Some(4)))])
    );

    let dump = r.dump().await;
    let k = r
        .keys()
        .deduct_line(&id("p"), &id("o1"), &id("c1"), &id("e1"));
    assert_eq!(r.promo_field("p", "budget").await.as_deref(), Some("70"));
    assert_eq!(r.promo_field("p", "stock").await.as_deref(), Some("4"));
    assert_eq!(
        dump[&k.used],
        Dumped {
            value: DumpedValue::String("1".into()),
            expires: true
        }
    );
    let record = &dump[&k.record];
    assert!(record.expires, "record has a TTL");
    let DumpedValue::Hash(h) = &record.value else {
        panic!("record is a hash")
    };
    let want: Vec<(&str, &str)> = vec![
        ("budget", "30"),
        ("budget0", "30"),
        ("counted", "1"),
        ("customer", "c1"),
        ("event", "e1"),
        ("state", "deducted"),
        ("stock", "1"),
        ("stock0", "1"),
    ];
    assert_eq!(
        h.iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect::<Vec<_>>(),
        want
    );
    assert!(!dump.contains_key(&k.memo), "an acceptance stores no memo");
    assert_eq!(dump.len(), 3, "{dump:#?}");
}

#[tokio::test]
async fn replay_of_an_accepted_line_is_a_duplicate_and_changes_nothing() {
    let r = standalone().await;
    r.seed(
        "p",
        &[("budget", "100"), ("stock", "5"), ("per_customer", "1")],
    )
    .await;
    let e = placed("e1", "o1", "c1", T, &[("p", 30, 1)]);
    r.ledger.place(&e).await.unwrap();
    let before = r.dump().await;
    let d = r.ledger.place(&e).await.unwrap();
    assert_eq!(accepted(&d), (true, vec![(30, 1, left(Some(70), Some(4)))]));
    r.assert_unchanged(&before, "a replay of an accepted line")
        .await;

    // A new event of the same order is absorbed by the record too (step 1);
    // its memo is written, so that it keeps its decision, and the record
    // notes the first absorbed event (release.lua hands the deduction over).
    let e2 = placed("e2", "o1", "c1", T, &[("p", 50, 3)]);
    let d = r.ledger.place(&e2).await.unwrap();
    assert_eq!(accepted(&d), (true, vec![(30, 1, left(Some(70), Some(4)))]));
    let memo = r.keys().rejected(&id("p"), &id("e2"));
    let record = r.keys().record(&id("p"), &id("o1"));
    r.assert_changed(
        &before,
        &[record.clone(), memo.clone()],
        "a new event of the accepted order",
    )
    .await;
    assert_eq!(r.get(&memo).await.as_deref(), Some("accepted"));
    assert_eq!(
        r.hgetall(&record).await.get("absorbed").map(String::as_str),
        Some("e2")
    );

    // After the order's refund, both placement events still answer accepted.
    r.ledger
        .refund(&refunded("r1", "o1", "c1", &[("p", None, None)]))
        .await
        .unwrap();
    for e in [&e, &e2] {
        let d = r.ledger.place(e).await.unwrap();
        assert_eq!(
            accepted(&d),
            (true, vec![(30, 1, left(Some(100), Some(5)))]),
            "{}",
            e.header.event_id
        );
    }
    // A third event of the refunded order is decided afresh: order_reverted.
    let d = r
        .ledger
        .place(&placed("e3", "o1", "c1", T, &[("p", 50, 3)]))
        .await
        .unwrap();
    assert!(
        matches!(
            d,
            PlaceDecision::Rejected {
                reason: Reason::OrderReverted,
                ..
            }
        ),
        "{d:?}"
    );
}

#[tokio::test]
async fn replay_of_a_rejected_event_repeats_the_reason() {
    let r = standalone().await;
    r.seed("p", &[("budget", "10")]).await;
    let e = placed("e1", "o1", "c1", T, &[("p", 20, 0)]);
    let d = r.ledger.place(&e).await.unwrap();
    assert_eq!(rejected(&d), (false, Reason::BudgetExceeded, "p".into()));
    let memo = r.keys().rejected(&id("p"), &id("e1"));
    assert_eq!(r.get(&memo).await.as_deref(), Some("budget_exceeded"));

    // Now there would be budget enough: the event is still rejected the same way.
    r.seed("p", &[("budget", "1000")]).await;
    let before = r.dump().await;
    let d = r.ledger.place(&e).await.unwrap();
    assert_eq!(rejected(&d), (true, Reason::BudgetExceeded, "p".into()));
    r.assert_unchanged(&before, "a replay of a rejected event")
        .await;
    assert!(before[&memo].expires, "the memo has a TTL");
}

#[tokio::test]
async fn rejections_come_in_the_contract_order_and_store_only_the_memo() {
    let r = standalone().await;
    let c = "c1";
    // The customer already holds one order of p (per_customer 1).
    r.seed(
        "p",
        &[("budget", "100"), ("stock", "5"), ("per_customer", "1")],
    )
    .await;
    r.ledger
        .place(&placed("e0", "o0", c, T, &[("p", 1, 1)]))
        .await
        .unwrap();

    let cases: [(&str, u64, u64, Reason); 3] = [
        ("e1", 1000, 10, Reason::BudgetExceeded), // budget, stock and user limit all fail
        ("e2", 10, 10, Reason::StockInsufficient), // stock and user limit fail
        ("e3", 10, 1, Reason::UserLimitReached),  // only the user limit fails
    ];
    for (event, b, s, reason) in cases {
        let before = r.dump().await;
        let order = format!("o-{event}");
        let d = r
            .ledger
            .place(&placed(event, &order, c, T, &[("p", b, s)]))
            .await
            .unwrap();
        assert_eq!(rejected(&d), (false, reason, "p".into()), "{event}");
        let memo = r.keys().rejected(&id("p"), &id(event));
        r.assert_changed(&before, &[memo.clone()], event).await;
        assert_eq!(r.get(&memo).await.as_deref(), Some(reason.as_str()));
    }
}

#[tokio::test]
async fn promotion_not_found() {
    let r = standalone().await;
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c1", T, &[("nope", 1, 1)]))
        .await
        .unwrap();
    assert_eq!(
        rejected(&d),
        (false, Reason::PromotionNotFound, "nope".into())
    );
    assert_eq!(r.dump().await.len(), 1, "only the memo");
}

#[tokio::test]
async fn paused_and_out_of_window_are_inactive_on_business_time() {
    let r = standalone().await;
    r.seed("paused", &[("budget", "100"), ("status", "paused")])
        .await;
    let d = r
        .ledger
        .place(&placed("e0", "o0", "c", T, &[("paused", 1, 0)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d).1, Reason::PromotionInactive);

    r.seed(
        "w",
        &[
            ("budget", "100"),
            ("status", "active"),
            ("starts_at", "1000"),
            ("ends_at", "2000"),
        ],
    )
    .await;
    for (i, (t, ok)) in [
        (999, false),
        (1000, true),
        (1999, true),
        (2000, false),
        (-5, false),
    ]
    .into_iter()
    .enumerate()
    {
        let (e, o) = (format!("e{i}"), format!("o{i}"));
        let d = r
            .ledger
            .place(&placed(&e, &o, "c", t, &[("w", 1, 0)]))
            .await
            .unwrap();
        if ok {
            accepted(&d);
        } else {
            assert_eq!(rejected(&d).1, Reason::PromotionInactive, "t={t}");
        }
    }
    assert_eq!(r.promo_field("w", "budget").await.as_deref(), Some("98"));
}

#[tokio::test]
async fn negative_business_time_is_a_valid_argument() {
    let r = standalone().await;
    r.seed("p", &[("budget", "100")]).await;
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c", -86_400, &[("p", 1, 0)]))
        .await
        .unwrap();
    accepted(&d);
}

#[tokio::test]
async fn unlimited_dimensions_are_absent_fields() {
    let r = standalone().await;
    r.seed("free", &[("status", "active")]).await;
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c", T, &[("free", 5_000, 7)]))
        .await
        .unwrap();
    assert_eq!(accepted(&d), (false, vec![(5_000, 7, left(None, None))]));
    assert_eq!(
        r.hgetall(&r.keys().promotion(&id("free"))).await.len(),
        1,
        "hash unchanged"
    );
    let used = r.keys().used(&id("free"), &id("c"));
    assert_eq!(
        r.get(&used).await,
        None,
        "no per_customer: used is not counted"
    );

    r.seed("stock-only", &[("stock", "3")]).await;
    let d = r
        .ledger
        .place(&placed(
            "e2",
            "o2",
            "c",
            T,
            &[("stock-only", 1_000_000_000_000, 2)],
        ))
        .await
        .unwrap();
    assert_eq!(
        accepted(&d),
        (false, vec![(1_000_000_000_000, 2, left(None, Some(1)))])
    );
}

#[tokio::test]
async fn large_amounts_stay_exact() {
    let r = standalone().await;
    r.seed(
        "big",
        &[("budget", "999999999999999"), ("stock", "1000000")],
    )
    .await;
    let e = placed("e1", "o1", "c", T, &[("big", 1_000_000_000_000, 1_000_000)]);
    let d = r.ledger.place(&e).await.unwrap();
    assert_eq!(
        accepted(&d).1,
        vec![(
            1_000_000_000_000,
            1_000_000,
            left(Some(998_999_999_999_999), Some(0))
        )]
    );
    assert_eq!(
        r.promo_field("big", "budget").await.as_deref(),
        Some("998999999999999")
    );
    let d = r
        .ledger
        .refund(&refunded("r1", "o1", "c", &[("big", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Ok(()), false, 1_000_000_000_000, 1_000_000));
    assert_eq!(
        r.promo_field("big", "budget").await.as_deref(),
        Some("999999999999999")
    );
}

#[tokio::test]
async fn refund_before_placement_leaves_a_tombstone() {
    let r = standalone().await;
    r.seed(
        "p",
        &[("budget", "100"), ("stock", "5"), ("per_customer", "1")],
    )
    .await;
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
    r.seed(
        "p",
        &[("budget", "100"), ("stock", "5"), ("per_customer", "1")],
    )
    .await;
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
    r.seed(
        "p",
        &[("budget", "100"), ("stock", "5"), ("per_customer", "1")],
    )
    .await;
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
    let h = r.hgetall(&record).await;
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
    let h = r.hgetall(&record).await;
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
        r.assert_changed(&before, &[record.clone()], event).await;
        assert_eq!(
            r.hgetall(&record)
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
        r.hgetall(&record)
            .await
            .get("refund:r1")
            .map(String::as_str),
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

#[tokio::test]
async fn multi_line_is_all_or_nothing() {
    let r = standalone().await;
    r.seed(
        "a",
        &[("budget", "100"), ("stock", "5"), ("per_customer", "1")],
    )
    .await;
    r.seed("b", &[("budget", "100")]).await;
    r.seed("c", &[("stock", "0")]).await;
    let before = r.dump().await;
    let e = placed(
        "e1",
        "o1",
        "cust",
        T,
        &[("a", 10, 1), ("b", 20, 0), ("c", 0, 1)],
    );
    let d = r.ledger.place(&e).await.unwrap();
    assert_eq!(rejected(&d), (false, Reason::StockInsufficient, "c".into()));
    let used = r.keys().used(&id("a"), &id("cust"));
    let memo = r.keys().rejected(&id("c"), &id("e1"));
    let (mark_a, mark_b) = (
        r.keys().rejected(&id("a"), &id("e1")),
        r.keys().rejected(&id("b"), &id("e1")),
    );
    // Counters restored exactly; what is left is the failing line's memo,
    // the released marks of the lines before it (and the used counter, back
    // at 0).
    r.assert_changed(
        &before,
        &[mark_a.clone(), used.clone(), mark_b.clone(), memo],
        "a rejected multi-line placement",
    )
    .await;
    assert_eq!(r.get(&used).await.as_deref(), Some("0"));
    assert_eq!(r.get(&mark_a).await.as_deref(), Some("released"));
    assert_eq!(r.get(&mark_b).await.as_deref(), Some("released"));

    // All lines fine: accepted, not a duplicate; replay: all duplicates.
    let ok = placed("e2", "o2", "cust", T, &[("a", 10, 1), ("b", 20, 0)]);
    let d = r.ledger.place(&ok).await.unwrap();
    assert_eq!(
        accepted(&d),
        (
            false,
            vec![
                (10, 1, left(Some(90), Some(4))),
                (20, 0, left(Some(80), None))
            ]
        )
    );
    let d = r.ledger.place(&ok).await.unwrap();
    assert!(accepted(&d).0);
}

#[tokio::test]
async fn multi_line_replay_of_a_rejected_event_is_rejected_again_on_the_same_line() {
    let r = standalone().await;
    r.seed("a", &[("budget", "100")]).await;
    r.seed("b", &[("budget", "5")]).await;
    let e = placed("e1", "o1", "c", T, &[("a", 10, 0), ("b", 20, 0)]);
    assert_eq!(
        rejected(&r.ledger.place(&e).await.unwrap()),
        (false, Reason::BudgetExceeded, "b".into())
    );

    // Now b has budget and a has none: the replay still names b.
    r.seed("a", &[("budget", "0")]).await;
    r.seed("b", &[("budget", "1000")]).await;
    let before = r.dump().await;
    let d = r.ledger.place(&e).await.unwrap();
    assert_eq!(rejected(&d), (true, Reason::BudgetExceeded, "b".into()));
    r.assert_unchanged(&before, "a replay of a rejected multi-line event")
        .await;
}

#[tokio::test]
async fn multi_line_replay_finishes_a_release_a_crash_interrupted() {
    let r = standalone().await;
    r.seed("a", &[("budget", "100"), ("per_customer", "1")])
        .await;
    r.seed("b", &[("budget", "100")]).await;
    let start = r.dump().await;
    // The first delivery deducted a, stored b's rejection, then crashed.
    let k = r
        .keys()
        .deduct_line(&id("a"), &id("o1"), &id("c"), &id("e1"));
    let args = ["10", "0", "1800000000", "e1", "1000", "1000", "c"]
        .map(String::from)
        .to_vec();
    r.eval(scripts::DEDUCT.body, k.as_vec(), args)
        .await
        .unwrap();
    let memo = r.keys().rejected(&id("b"), &id("e1"));
    r.set(&memo, "budget_exceeded").await;

    let e = placed("e1", "o1", "c", T, &[("a", 10, 0), ("b", 20, 0)]);
    let d = r.ledger.place(&e).await.unwrap();
    assert_eq!(rejected(&d), (true, Reason::BudgetExceeded, "b".into()));
    // a released and marked; b keeps its reason (a mark never overwrites one).
    r.assert_changed(
        &start,
        &[k.memo.clone(), k.used.clone(), memo.clone()],
        "the replay that finishes the release",
    )
    .await;
    assert_eq!(r.get(&k.memo).await.as_deref(), Some("released"));
    assert_eq!(r.get(&memo).await.as_deref(), Some("budget_exceeded"));
    assert_eq!(r.promo_field("a", "budget").await.as_deref(), Some("100"));
}

#[tokio::test]
async fn release_leaves_a_line_another_event_deducted() {
    let r = standalone().await;
    r.seed("a", &[("budget", "100")]).await;
    r.seed("b", &[("budget", "5")]).await;
    accepted(
        &r.ledger
            .place(&placed("e1", "o1", "c", T, &[("a", 10, 0)]))
            .await
            .unwrap(),
    );
    // A second event of the same order: a is absorbed (already deducted by e1), b fails.
    let d = r
        .ledger
        .place(&placed("e2", "o1", "c", T, &[("a", 10, 0), ("b", 20, 0)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d).1, Reason::BudgetExceeded);
    assert_eq!(
        r.promo_field("a", "budget").await.as_deref(),
        Some("90"),
        "e1's deduction is kept"
    );
    let h = r.hgetall(&r.keys().record(&id("a"), &id("o1"))).await;
    assert_eq!(h["event"], "e1");

    assert!(
        !h.contains_key("absorbed"),
        "the rejected e2 no longer holds a's record: {h:?}"
    );

    // release.lua directly: not this event's record -> 0; this event's -> 1; again -> 0.
    let k = r
        .keys()
        .deduct_line(&id("a"), &id("o1"), &id("c"), &id("e2"));
    let args = |e: &str| vec![e.to_owned(), "1000".to_owned(), "c".to_owned()];
    let v = r
        .eval(scripts::RELEASE.body, k.as_vec(), args("e2"))
        .await
        .unwrap();
    assert_eq!(v, Value::Array(vec![Value::Integer(0)]));
    let v = r
        .eval(scripts::RELEASE.body, k.as_vec(), args("e1"))
        .await
        .unwrap();
    assert_eq!(v, Value::Array(vec![Value::Integer(1)]));
    let v = r
        .eval(scripts::RELEASE.body, k.as_vec(), args("e1"))
        .await
        .unwrap();
    assert_eq!(v, Value::Array(vec![Value::Integer(0)]));
    assert_eq!(r.promo_field("a", "budget").await.as_deref(), Some("100"));
}

/// Each corrupt value, in each place a script reads it: the decision is
/// `corrupt_promotion`, remembered under the event's memo (the only key
/// written), except when the memo itself is what is corrupt.
#[tokio::test]
async fn corrupt_stored_values_reject_and_write_nothing() {
    let r = standalone().await;
    let bad = [
        "-3",
        "1e3",
        "007",
        "abc",
        "nan",
        " 5 ",
        "inf",
        "0x10",
        "-0",
        "9007199254740993",
        "",
    ];
    let p = id("p");
    let mut n = 0;
    for value in bad {
        for field in ["budget", "stock", "per_customer", "starts_at", "ends_at"] {
            n += 1;
            r.seed(
                "p",
                &[("budget", "100"), ("stock", "5"), ("per_customer", "3")],
            )
            .await;
            r.hset(&r.keys().promotion(&p), &[(field, value)]).await;
            let before = r.dump().await;
            let d = r
                .ledger
                .place(&placed(
                    &format!("e{n}"),
                    &format!("o{n}"),
                    "c",
                    T,
                    &[("p", 1, 1)],
                ))
                .await
                .unwrap();
            assert_eq!(
                rejected(&d),
                (false, Reason::CorruptPromotion, "p".into()),
                "{field}={value:?}"
            );
            let memo = r.keys().rejected(&p, &id(&format!("e{n}")));
            r.assert_changed(&before, &[memo.clone()], &format!("{field}={value:?}"))
                .await;
            assert_eq!(r.get(&memo).await.as_deref(), Some("corrupt_promotion"));
        }
    }
    // status, used, record fields and the memos.
    r.seed("p", &[("budget", "100"), ("status", "closed")])
        .await;
    let before = r.dump().await;
    let d = r
        .ledger
        .place(&placed("s1", "s1", "c", T, &[("p", 1, 1)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d).1, Reason::CorruptPromotion);
    r.assert_changed(
        &before,
        &[r.keys().rejected(&p, &id("s1"))],
        "status=closed",
    )
    .await;

    r.seed(
        "p",
        &[("budget", "100"), ("stock", "5"), ("per_customer", "3")],
    )
    .await;
    let k = r.keys().deduct_line(&p, &id("ox"), &id("c"), &id("ex"));
    let corruptions: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("used", vec![]),
        (
            "record",
            vec![
                ("state", "deducted"),
                ("event", "e0"),
                ("budget", "-3"),
                ("stock", "0"),
                ("budget0", "1"),
                ("stock0", "0"),
            ],
        ),
        (
            "record",
            vec![
                ("state", "gone"),
                ("event", "e0"),
                ("budget", "1"),
                ("stock", "0"),
                ("budget0", "1"),
                ("stock0", "0"),
            ],
        ),
        (
            "record",
            vec![
                ("state", "deducted"),
                ("event", "e0"),
                ("budget", "1"),
                ("stock", "0"),
                ("budget0", "1"),
            ],
        ),
        (
            "record",
            vec![
                ("state", "deducted"),
                ("event", "e0"),
                ("budget", "2"),
                ("stock", "0"),
                ("budget0", "1"),
                ("stock0", "0"),
            ],
        ),
        ("memo", vec![]),
    ];
    for (which, fields) in corruptions {
        r.del(&k.used).await;
        r.del(&k.record).await;
        r.del(&k.memo).await;
        match which {
            "used" => r.set(&k.used, "007").await,
            "record" => r.hset(&k.record, &fields).await,
            _ => r.set(&k.memo, "whatever").await,
        }
        let before = r.dump().await;
        let d = r
            .ledger
            .place(&placed("ex", "ox", "c", T, &[("p", 1, 1)]))
            .await
            .unwrap();
        assert_eq!(
            rejected(&d).1,
            Reason::CorruptPromotion,
            "{which} {fields:?}"
        );
        let written = if which == "memo" {
            vec![]
        } else {
            vec![k.memo.clone()]
        };
        r.assert_changed(&before, &written, &format!("{which} {fields:?}"))
            .await;
    }
}

/// A key of the wrong type, for each of the four keys of deduct and rollback.
#[tokio::test]
async fn wrong_key_types_are_corrupt() {
    let r = standalone().await;
    let p = id("p");
    for i in 0..4 {
        r.seed(
            "p",
            &[("budget", "100"), ("stock", "5"), ("per_customer", "3")],
        )
        .await;
        let place = r
            .keys()
            .deduct_line(&p, &id("o1"), &id("c"), &id("e1"))
            .as_vec();
        let refund = r
            .keys()
            .rollback_line(&p, &id("o1"), &id("c"), &id("r1"))
            .as_vec();
        for keys in [&place, &refund] {
            for k in keys.iter() {
                if k != &place[0] {
                    r.del(k).await;
                }
            }
        }
        // The promotion becomes a string; the others become hashes or strings
        // of the wrong kind (used and memos are strings, records hashes).
        for keys in [&place, &refund] {
            let k = &keys[i];
            r.del(k).await;
            match i {
                0 | 2 => r.set(k, "oops").await,
                _ => r.hset(k, &[("x", "1")]).await,
            }
        }
        let before = r.dump().await;
        let d = r
            .ledger
            .place(&placed("e1", "o1", "c", T, &[("p", 1, 1)]))
            .await
            .unwrap();
        assert_eq!(rejected(&d).1, Reason::CorruptPromotion, "deduct key {i}");
        let d = r
            .ledger
            .refund(&refunded("r1", "o1", "c", &[("p", None, None)]))
            .await
            .unwrap();
        assert_eq!(
            line(&d, 0).0,
            Err(Reason::CorruptPromotion),
            "rollback key {i}"
        );
        // The placement and the refund remember their corrupt_promotion
        // under their memos, unless the memo is the corrupt key.
        let mut written = if i < 3 {
            vec![place[3].clone(), refund[3].clone()]
        } else {
            vec![]
        };
        written.sort();
        r.assert_changed(&before, &written, &format!("key {i}"))
            .await;
    }
}

#[tokio::test]
async fn corrupt_line_of_a_multi_line_order_releases_the_others() {
    let r = standalone().await;
    r.seed("a", &[("budget", "100"), ("per_customer", "1")])
        .await;
    r.seed("b", &[("budget", "1e3")]).await;
    let used = r.keys().used(&id("a"), &id("c"));
    let before = r.dump().await;
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c", T, &[("a", 10, 0), ("b", 1, 0)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d), (false, Reason::CorruptPromotion, "b".into()));
    // a was deducted, then released and marked; b remembers the rejection;
    // a's per-customer counter remains, at 0.
    let memo_a = r.keys().rejected(&id("a"), &id("e1"));
    let memo_b = r.keys().rejected(&id("b"), &id("e1"));
    r.assert_changed(
        &before,
        &[memo_a.clone(), used.clone(), memo_b.clone()],
        "a multi-line placement with a corrupt line",
    )
    .await;
    assert_eq!(r.get(&used).await.as_deref(), Some("0"));
    assert_eq!(r.get(&memo_a).await.as_deref(), Some("released"));
    assert_eq!(r.get(&memo_b).await.as_deref(), Some("corrupt_promotion"));

    // A corrupt rejection memo found by the look-up before deducting.
    r.seed("b", &[("budget", "100")]).await;
    let memo = r.keys().rejected(&id("b"), &id("e2"));
    r.set(&memo, "not-a-reason").await;
    let before = r.dump().await;
    let d = r
        .ledger
        .place(&placed("e2", "o2", "c", T, &[("a", 10, 0), ("b", 1, 0)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d), (false, Reason::CorruptPromotion, "b".into()));
    // Only a's line is marked released (b's memo cannot be written over).
    r.assert_changed(
        &before,
        &[r.keys().rejected(&id("a"), &id("e2"))],
        "a corrupt rejection memo",
    )
    .await;
}

#[tokio::test]
async fn corrupt_refund_memo_and_rollback_errors_leave_other_lines_alone() {
    let r = standalone().await;
    r.seed("a", &[("budget", "100")]).await;
    r.seed("b", &[("budget", "100")]).await;
    r.ledger
        .place(&placed("e1", "o1", "c", T, &[("a", 10, 0), ("b", 10, 0)]))
        .await
        .unwrap();
    r.set(&r.keys().refund(&id("a"), &id("r1")), "applied 1")
        .await;
    let d = r
        .ledger
        .refund(&refunded(
            "r1",
            "o1",
            "c",
            &[("a", None, None), ("b", None, None)],
        ))
        .await
        .unwrap();
    assert_eq!(line(&d, 0).0, Err(Reason::CorruptPromotion));
    assert_eq!(line(&d, 1), (Ok(()), false, 10, 0));
    assert_eq!(r.promo_field("a", "budget").await.as_deref(), Some("90"));
    assert_eq!(r.promo_field("b", "budget").await.as_deref(), Some("100"));
}

/// Bad arguments: an error reply with code BADARG and nothing written.
#[tokio::test]
async fn bad_arguments_are_badarg_error_replies() {
    let r = standalone().await;
    r.seed(
        "p",
        &[("budget", "100"), ("stock", "5"), ("per_customer", "3")],
    )
    .await;
    let k = r
        .keys()
        .deduct_line(&id("p"), &id("o1"), &id("c"), &id("e1"));
    let good = ["1", "1", "1800000000", "e1", "1000", "1000", "c"];
    let before = r.dump().await;
    let bad_numbers = [
        "-3",
        "1e3",
        "007",
        "abc",
        " 5 ",
        "nan",
        "inf",
        "0x10",
        "-0",
        "9007199254740993",
        "",
    ];
    let mut cases: Vec<Vec<String>> = Vec::new();
    for i in [0usize, 1, 2, 4, 5] {
        for v in bad_numbers {
            if i == 2 && v == "-3" {
                continue; // a negative business time is valid
            }
            let mut args = good.map(String::from).to_vec();
            args[i] = v.into();
            cases.push(args);
        }
    }
    for v in ["", "a:b", "{x}", "e 1"] {
        for i in [3, 6] {
            let mut args = good.map(String::from).to_vec();
            args[i] = v.into();
            cases.push(args);
        }
    }
    let mut zero_ttl = good.map(String::from).to_vec();
    zero_ttl[4] = "0".into();
    cases.push(zero_ttl);
    cases.push(good[..6].iter().map(|s| s.to_string()).collect());
    for args in cases {
        let e = r
            .eval(scripts::DEDUCT.body, k.as_vec(), args.clone())
            .await
            .unwrap_err();
        assert_eq!(classify_code(&e), ErrorClass::BadArg, "{args:?}: {e}");
    }
    let e = r
        .eval(
            scripts::DEDUCT.body,
            k.as_vec()[..3].to_vec(),
            good.map(String::from).to_vec(),
        )
        .await
        .unwrap_err();
    assert_eq!(classify_code(&e), ErrorClass::BadArg, "{e}");

    let rk = r
        .keys()
        .rollback_line(&id("p"), &id("o1"), &id("c"), &id("r1"));
    for args in [
        ["x", "", "1000", "1000", "r1", "c"],
        ["", "-1", "1000", "1000", "r1", "c"],
        ["", "", "0", "1000", "r1", "c"],
        ["", "", "1000", "1e3", "r1", "c"],
        ["", "", "1000", "1000", "r:1", "c"],
        ["", "", "1000", "1000", "r1", ""],
    ] {
        let e = r
            .eval(
                scripts::ROLLBACK.body,
                rk.as_vec(),
                args.map(String::from).to_vec(),
            )
            .await
            .unwrap_err();
        assert_eq!(classify_code(&e), ErrorClass::BadArg, "{args:?}: {e}");
    }
    let rel = k.as_vec();
    let s3 = |a: &str, b: &str, c: &str| vec![a.to_owned(), b.to_owned(), c.to_owned()];
    for args in [
        vec![],
        vec!["".to_string()],
        vec!["e1".into(), "x".into()],
        s3("", "1000", "c"),
        s3("e1", "0", "c"),
        s3("e1", "1000", "c d"),
    ] {
        let e = r
            .eval(scripts::RELEASE.body, rel.clone(), args.clone())
            .await
            .unwrap_err();
        assert_eq!(classify_code(&e), ErrorClass::BadArg, "{args:?}: {e}");
    }
    let e = r
        .eval(scripts::MEMO.body, vec![k.memo.clone()], vec!["x".into()])
        .await
        .unwrap_err();
    assert_eq!(classify_code(&e), ErrorClass::BadArg, "{e}");
    r.assert_unchanged(&before, "bad arguments").await;
}

fn classify_code(e: &fred::error::Error) -> ErrorClass {
    deductor::ledger::classify(e)
}

#[tokio::test]
async fn noscript_falls_back_to_eval() {
    let r = standalone().await;
    r.seed("p", &[("budget", "100")]).await;
    let _: () = r.pool().next().script_flush(false).await.unwrap();
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c", T, &[("p", 1, 0)]))
        .await
        .unwrap();
    accepted(&d);
    let cached: Vec<bool> = r
        .pool()
        .next()
        .script_exists(vec![scripts::DEDUCT.sha1.clone()])
        .await
        .unwrap();
    assert_eq!(cached, vec![true], "EVAL cached the script");
    let _: () = r.pool().next().script_flush(false).await.unwrap();
    let d = r
        .ledger
        .refund(&refunded("r1", "o1", "c", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0).0, Ok(()));
    r.ledger.load_scripts().await.unwrap();
    let cached: Vec<bool> = r
        .pool()
        .next()
        .script_exists(
            scripts::all()
                .iter()
                .map(|s| s.sha1.clone())
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    assert!(cached.iter().all(|c| *c), "{cached:?}");
    r.ledger.ping().await.unwrap();
}

#[tokio::test]
async fn connection_errors_are_classified() {
    let mut s = settings("redis://127.0.0.1:1", &unique_prefix());
    s.connect_timeout_ms = 500;
    let e = Ledger::connect(&s).await.unwrap_err();
    assert_eq!(e.disposition(), Disposition::Retry, "{e}");

    let mut s = settings(&redis_url(), &unique_prefix());
    s.username = format!("nobody-{}", unique_prefix());
    s.password = "wrong".into();
    let e = Ledger::connect(&s).await.unwrap_err();
    assert_eq!(
        (e.class(), e.disposition()),
        (ErrorClass::Auth, Disposition::Fatal),
        "{e}"
    );

    let s = settings("not a url", &unique_prefix());
    let e = Ledger::connect(&s).await.unwrap_err();
    assert_eq!(e.disposition(), Disposition::Fatal, "{e}");
}

#[tokio::test]
async fn promo_set_refuses_without_force_and_replaces_with_it() {
    let r = standalone().await;
    let p = id("flash");
    let spec = PromoSpec {
        budget: Some(1000),
        stock: Some(10),
        per_customer: Some(1),
        starts_at: Some(1_000),
        ends_at: Some(2_000_000_000),
        paused: false,
    };
    assert_eq!(
        admin::promo_set(&r.ledger, &p, spec.clone(), false)
            .await
            .unwrap(),
        PromoSetResult::Created
    );
    let v = admin::promo_show(&r.ledger, &p)
        .await
        .unwrap()
        .expect("exists");
    assert_eq!(
        (v.budget, v.stock, v.per_customer),
        (Some(1000), Some(10), Some(1))
    );
    assert_eq!(
        (v.initial_budget, v.initial_stock, v.paused),
        (Some(1000), Some(10), false)
    );
    assert_eq!((v.starts_at, v.ends_at), (Some(1_000), Some(2_000_000_000)));
    assert!(v.to_string().contains("flash"));

    let other = PromoSpec {
        budget: Some(5),
        paused: true,
        ..PromoSpec::default()
    };
    let e = admin::promo_set(&r.ledger, &p, other.clone(), false)
        .await
        .unwrap_err();
    assert!(matches!(e, AdminError::Exists(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "promotion flash exists; pass --force to overwrite"
    );
    assert_eq!(
        admin::promo_show(&r.ledger, &p).await.unwrap().unwrap(),
        v,
        "unchanged"
    );

    assert_eq!(
        admin::promo_set(&r.ledger, &p, other, true).await.unwrap(),
        PromoSetResult::Replaced
    );
    let v = admin::promo_show(&r.ledger, &p).await.unwrap().unwrap();
    assert_eq!(
        (v.budget, v.stock, v.per_customer, v.paused),
        (Some(5), None, None, true)
    );
    assert_eq!(v.initial_budget, Some(5));
    let fields = r.hgetall(&r.keys().promotion(&p)).await;
    assert_eq!(fields.len(), 4, "the whole hash was replaced: {fields:?}");
    assert_eq!(fields["gen"], "2", "a new incarnation");

    // What promo set writes is what the scripts read.
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c", T, &[("flash", 1, 0)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d).1, Reason::PromotionInactive);
    assert!(admin::promo_show(&r.ledger, &id("absent"))
        .await
        .unwrap()
        .is_none());
    let e = admin::promo_set(
        &r.ledger,
        &p,
        PromoSpec {
            starts_at: Some(5),
            ends_at: Some(5),
            ..Default::default()
        },
        true,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, AdminError::Invalid(_)), "{e}");
}
