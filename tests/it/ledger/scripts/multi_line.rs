//! Orders of several promotions: all lines or none (release.lua gives back
//! the lines before a rejected one), and the replays of such an order.

use super::*;
use crate::common::redis::*;
use deductor::domain::decision::Reason;
use deductor::ledger::scripts;
use fred::prelude::*;

#[tokio::test]
async fn multi_line_is_all_or_nothing() {
    let r = standalone().await;
    seed_limited(&r, "a", "1").await;
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
    // The day indexes keep naming the released lines' orders (their
    // records are gone: `audit` skips a name without a record).
    r.assert_changed(
        &before,
        &[
            index_key(r.keys(), "a"),
            mark_a.clone(),
            used.clone(),
            index_key(r.keys(), "b"),
            mark_b.clone(),
            memo,
        ],
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
    let k = r.zombie_deduct("a", "o1", "c", "e1", T, 10, 0).await;
    let memo = r.keys().rejected(&id("b"), &id("e1"));
    r.set(&memo, "budget_exceeded").await;

    let e = placed("e1", "o1", "c", T, &[("a", 10, 0), ("b", 20, 0)]);
    let d = r.ledger.place(&e).await.unwrap();
    assert_eq!(rejected(&d), (true, Reason::BudgetExceeded, "b".into()));
    // a released and marked (its day index still names o1); b keeps its
    // reason (a mark never overwrites one).
    r.assert_changed(
        &start,
        &[
            index_key(r.keys(), "a"),
            k.memo.clone(),
            k.used.clone(),
            memo.clone(),
        ],
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
    let h = r.record(&r.keys().record(&id("a"), &id("o1"))).await;
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
