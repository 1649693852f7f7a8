//! Corrupt stored values and keys of the wrong type: `corrupt_promotion`,
//! remembered under the event's memo, and nothing else written.

use super::*;
use crate::common::redis::*;
use deductor::domain::decision::Reason;

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
            seed_limited(&r, "p", "3").await;
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
            r.assert_changed(
                &before,
                std::slice::from_ref(&memo),
                &format!("{field}={value:?}"),
            )
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

    seed_limited(&r, "p", "3").await;
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
        seed_limited(&r, "p", "3").await;
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
    // a's per-customer counter remains, at 0, and a's day index names o1.
    let memo_a = r.keys().rejected(&id("a"), &id("e1"));
    let memo_b = r.keys().rejected(&id("b"), &id("e1"));
    r.assert_changed(
        &before,
        &[
            index_key(r.keys(), "a"),
            memo_a.clone(),
            used.clone(),
            memo_b.clone(),
        ],
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
