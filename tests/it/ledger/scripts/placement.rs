//! deduct.lua on one line: acceptance, each rejection in the contract's
//! order, business time, unlimited dimensions and large amounts, and the
//! replays of what it decided.

use super::*;
use crate::common::redis::*;
use deductor::domain::decision::{PlaceDecision, Reason};

#[tokio::test]
async fn accept_deducts_counts_and_records() {
    let r = standalone().await;
    seed_limited(&r, "p", "2").await;
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
    // The new record's order in the day index (a standalone server), which
    // outlives the record.
    let index = &dump[&index_key(r.keys(), "p")];
    assert_eq!(index.value, DumpedValue::Set(["o1".to_owned()].into()));
    assert!(index.expires, "the index has a TTL");
    assert_eq!(dump.len(), 4, "{dump:#?}");
}

#[tokio::test]
async fn replay_of_an_accepted_line_is_a_duplicate_and_changes_nothing() {
    let r = standalone().await;
    seed_limited(&r, "p", "1").await;
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
        r.record(&record).await.get("absorbed").map(String::as_str),
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
    seed_limited(&r, "p", "1").await;
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
        r.assert_changed(&before, std::slice::from_ref(&memo), event)
            .await;
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

/// The day index's TTL (docs/contract.md section 2): deduct.lua, a batch
/// of deduct_batch.lua and rollback.lua's tombstone raise it to the index
/// TTL when it is below the new record's TTL or absent, leave it when it
/// already outlives the record (no write), and never lower it.
#[tokio::test]
async fn the_day_index_ttl_is_raised_only_below_the_records() {
    use deductor::ledger::calls::{self, Call};
    use deductor::ledger::scripts;
    use fred::prelude::Value;

    let r = standalone().await;
    seed_limited(&r, "p", "9").await;
    let (record_ttl, index_ttl) = (1_000_i64, 2_000_i64);
    let index = r.keys().index(&id("p"), 20_000);
    // Placement line n (deduct.lua's keys and arguments), or a refund of
    // order n that finds nothing deducted (rollback.lua's tombstone), with
    // the day index and its TTLs.
    let line = |n: usize, refund: bool| -> Call {
        let (o, c) = (format!("o{n}"), format!("c{n}"));
        let e = format!("{}{n}", if refund { "r" } else { "e" });
        let ids = (&id("p"), &id(&o), &id(&c), &id(&e));
        let (script, line_keys, mut args) = if refund {
            let k = r.keys().rollback_line(ids.0, ids.1, ids.2, ids.3);
            let args = vec![
                String::new(),
                String::new(),
                record_ttl.to_string(),
                "500".into(),
                e,
                c,
            ];
            (&scripts::ROLLBACK, k, args)
        } else {
            let k = r.keys().deduct_line(ids.0, ids.1, ids.2, ids.3);
            let args = vec![
                "1".into(),
                "0".into(),
                T.to_string(),
                e,
                record_ttl.to_string(),
                "500".into(),
                c,
            ];
            (&scripts::DEDUCT, k, args)
        };
        args.extend([o, index_ttl.to_string()]);
        let mut keys = line_keys.as_vec();
        keys.push(index.clone());
        Call { script, keys, args }
    };
    let mut n = 0;
    for how in ["deduct", "batch", "batch of two", "tombstone"] {
        // (the index's TTL before, in ms, or -1 for none; whether it is raised)
        for (before, raised) in [
            (-1, true),
            (record_ttl * 1000 - 5_000, true),
            (record_ttl * 1000 + 5_000, false),
            (index_ttl * 1000 * 2, false),
        ] {
            let mut calls = Vec::new();
            for _ in 0..(if how == "batch of two" { 2 } else { 1 }) {
                n += 1;
                calls.push(line(n, how == "tombstone"));
            }
            let call = if how.starts_with("batch") {
                calls::deduct_batch(calls)
            } else {
                calls.remove(0)
            };
            set_index_ttl(&r, &index, before).await;
            let reply = r
                .eval(call.script.body, call.keys, call.args)
                .await
                .unwrap_or_else(|e| panic!("{how}: {e}"));
            assert!(
                !format!("{reply:?}").contains("rejected") || how == "tombstone",
                "{how}: {reply:?}"
            );
            let after = pttl(&r, &index).await;
            let what = format!("{how}, index TTL {before} ms before: {after} ms after");
            if raised {
                assert!(
                    after > index_ttl * 1000 - 5_000 && after <= index_ttl * 1000,
                    "raised to the index TTL: {what}"
                );
            } else {
                assert!(
                    after <= before && after > before - 5_000,
                    "left as it was: {what}"
                );
            }
            assert!(
                after > record_ttl * 1000 - 1_000,
                "outlives the record: {what}"
            );
        }
    }

    // A service user whose ACL predates `+pttl` (docs/operations.md): the
    // read is refused, the line still stands and the TTL is raised as before
    // the rule, also where the set already outlives the record.
    let user = format!("no-pttl-{:08x}", rand::random::<u32>());
    let rules: Vec<String> = ["reset", "on", ">pw", "~*", "+@all", "-pttl"]
        .map(String::from)
        .to_vec();
    fred::prelude::AclInterface::acl_setuser(r.pool(), user.as_str(), rules)
        .await
        .expect("ACL SETUSER");
    let mut settings = crate::common::redis::settings(&r.url, &r.prefix);
    settings.username = user.clone();
    settings.password = "pw".into();
    let as_user = deductor::ledger::Ledger::connect(&settings)
        .await
        .expect("connect as the user");
    set_index_ttl(&r, &index, record_ttl * 1000 + 5_000).await;
    let call = line(n + 1, false);
    let reply: Value =
        fred::prelude::LuaInterface::eval(as_user.pool(), call.script.body, call.keys, call.args)
            .await
            .expect("deduct.lua as a user without +pttl");
    assert!(format!("{reply:?}").contains("accepted"), "{reply:?}");
    let after = pttl(&r, &index).await;
    assert!(
        after > index_ttl * 1000 - 5_000,
        "raised without +pttl: {after} ms"
    );
    as_user.quit().await;
    let _: Result<i64, _> = fred::prelude::AclInterface::acl_deluser(r.pool(), user.as_str()).await;
}

/// Makes `index` a set (of "x") whose TTL is `ms` milliseconds, or none
/// when `ms` is negative.
async fn set_index_ttl(r: &TestRedis, index: &str, ms: i64) {
    let set = if ms < 0 {
        "redis.call('SADD', KEYS[1], 'x'); return redis.call('PERSIST', KEYS[1])"
    } else {
        "redis.call('SADD', KEYS[1], 'x'); return redis.call('PEXPIRE', KEYS[1], ARGV[1])"
    };
    r.eval(set, vec![index.to_owned()], vec![ms.max(0).to_string()])
        .await
        .expect("set the index's TTL");
}

/// `key`'s PTTL.
async fn pttl(r: &TestRedis, key: &str) -> i64 {
    match r
        .eval(
            "return redis.call('PTTL', KEYS[1])",
            vec![key.to_owned()],
            vec![],
        )
        .await
        .expect("pttl")
    {
        fred::prelude::Value::Integer(ms) => ms,
        v => panic!("PTTL {v:?}"),
    }
}
