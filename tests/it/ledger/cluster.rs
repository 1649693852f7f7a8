//! The Ledger against the real 3-primary Redis Cluster: multi-promotion
//! orders whose promotions live on different nodes are decided, released and
//! refunded correctly, and no call is refused (CROSSSLOT or anything else:
//! every error fails the test).

use std::collections::BTreeSet;

use crate::common::redis::*;
use deductor::admin::{self, PromoSpec};
use deductor::domain::decision::{PlaceDecision, Reason};
use deductor::ledger::scripts;
use fred::prelude::*;

const T: i64 = 1_800_000_000;

/// `(start, end, primary "host:port")` of every slot range, from CLUSTER SLOTS.
async fn slot_owners(r: &TestRedis) -> Vec<(i64, i64, String)> {
    let slots: Value = r.pool().cluster_slots().await.unwrap();
    let Value::Array(ranges) = slots else {
        panic!("CLUSTER SLOTS: {slots:?}")
    };
    ranges
        .into_iter()
        .map(|range| {
            let Value::Array(items) = range else {
                panic!("range {range:?}")
            };
            let Value::Array(primary) = &items[2] else {
                panic!("primary {:?}", items[2])
            };
            let host = primary[0].as_string().unwrap();
            let port = primary[1].as_i64().unwrap();
            (
                items[0].as_i64().unwrap(),
                items[1].as_i64().unwrap(),
                format!("{host}:{port}"),
            )
        })
        .collect()
}

/// Promotion ids whose keys live on pairwise different primaries, one per primary.
async fn ids_on_distinct_nodes(r: &TestRedis) -> Vec<String> {
    let owners = slot_owners(r).await;
    let primaries: BTreeSet<&String> = owners.iter().map(|o| &o.2).collect();
    let mut found: Vec<(String, String)> = Vec::new();
    for n in 0..1000 {
        let p = format!("promo-{n}");
        let slot: i64 = r
            .pool()
            .cluster_keyslot(r.keys().promotion(&id(&p)))
            .await
            .unwrap();
        // Every key of the promotion hashes to the tag's slot.
        let record = r.keys().record(&id(&p), &id("o1"));
        assert_eq!(
            r.pool().cluster_keyslot::<i64, _>(record).await.unwrap(),
            slot
        );
        let node = owners
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|o| o.2.clone())
            .expect("slot is covered");
        if !found.iter().any(|(_, n)| *n == node) {
            found.push((p, node));
        }
        if found.len() == primaries.len() {
            break;
        }
    }
    assert!(found.len() >= 3, "need 3 primaries, found {found:?}");
    found.into_iter().map(|(p, _)| p).collect()
}

fn spec(budget: u64, stock: u64) -> PromoSpec {
    PromoSpec {
        budget: Some(budget),
        stock: Some(stock),
        per_customer: Some(1),
        ..PromoSpec::default()
    }
}

#[tokio::test]
async fn multi_promotion_orders_across_nodes() {
    let r = cluster().await;
    let ps = ids_on_distinct_nodes(&r).await;
    let (a, b, c) = (ps[0].as_str(), ps[1].as_str(), ps[2].as_str());
    for p in [a, b, c] {
        admin::promo_set(&r.ledger, &id(p), spec(100, 5), false)
            .await
            .unwrap();
    }
    let start = r.dump().await;
    assert_eq!(
        start.len(),
        7,
        "three hashes, their gen keys and the ledger marker: {start:#?}"
    );

    // Accepted over three nodes, then a replay is absorbed.
    let e = placed("e1", "o1", "cust", T, &[(a, 10, 1), (b, 20, 2), (c, 30, 3)]);
    let d = r.ledger.place(&e).await.unwrap();
    let PlaceDecision::Accepted {
        duplicate: false,
        lines,
    } = &d
    else {
        panic!("{d:?}")
    };
    assert_eq!(
        lines.iter().map(|l| l.remaining.budget).collect::<Vec<_>>(),
        [Some(90), Some(80), Some(70)]
    );
    let after = r.dump().await;
    let d = r.ledger.place(&e).await.unwrap();
    assert!(
        matches!(
            d,
            PlaceDecision::Accepted {
                duplicate: true,
                ..
            }
        ),
        "{d:?}"
    );
    r.assert_unchanged(&after, "a replay over three nodes")
        .await;

    // Rejected on the last node: the two other nodes are released exactly.
    let before = r.dump().await;
    let e2 = placed(
        "e2",
        "o2",
        "other",
        T,
        &[(a, 10, 1), (b, 10, 1), (c, 10, 9)],
    );
    let d = r.ledger.place(&e2).await.unwrap();
    assert_eq!(
        d,
        PlaceDecision::Rejected {
            duplicate: false,
            reason: Reason::StockInsufficient,
            promotion_id: id(c)
        }
    );
    let used = |p: &str| r.keys().used(&id(p), &id("other"));
    let memo = r.keys().rejected(&id(c), &id("e2"));
    let mark = |p: &str| r.keys().rejected(&id(p), &id("e2"));
    let mut want = vec![used(a), used(b), memo, mark(a), mark(b)];
    want.sort();
    r.assert_changed(
        &before,
        &want,
        "only the counters at 0, the memo and the released marks",
    )
    .await;
    for p in [a, b] {
        assert_eq!(r.get(&mark(p)).await.as_deref(), Some("released"));
    }
    for p in [a, b] {
        assert_eq!(r.get(&used(p)).await.as_deref(), Some("0"));
    }
    let d = r.ledger.place(&e2).await.unwrap();
    assert!(
        matches!(
            d,
            PlaceDecision::Rejected {
                duplicate: true,
                reason: Reason::StockInsufficient,
                ..
            }
        ),
        "{d:?}"
    );

    // Refund across nodes: one line partial, the others in full.
    let d = r
        .ledger
        .refund(&refunded(
            "r1",
            "o1",
            "cust",
            &[(a, Some(5), Some(0)), (b, None, None), (c, None, None)],
        ))
        .await
        .unwrap();
    let got: Vec<_> = d
        .lines
        .iter()
        .map(|l| (l.status, l.budget, l.stock))
        .collect();
    assert_eq!(got, [(Ok(()), 5, 0), (Ok(()), 20, 2), (Ok(()), 30, 3)]);
    for (p, budget, stock) in [(a, "95", "4"), (b, "100", "5"), (c, "100", "5")] {
        assert_eq!(
            r.promo_field(p, "budget").await.as_deref(),
            Some(budget),
            "{p}"
        );
        assert_eq!(
            r.promo_field(p, "stock").await.as_deref(),
            Some(stock),
            "{p}"
        );
    }
    let again = r
        .ledger
        .refund(&refunded(
            "r1",
            "o1",
            "cust",
            &[(a, Some(5), Some(0)), (b, None, None), (c, None, None)],
        ))
        .await
        .unwrap();
    assert!(again.duplicate(), "{again:?}");
}

#[tokio::test]
async fn corrupt_data_on_one_node_releases_the_others() {
    let r = cluster().await;
    let ps = ids_on_distinct_nodes(&r).await;
    let (a, b) = (ps[0].as_str(), ps[1].as_str());
    admin::promo_set(&r.ledger, &id(a), spec(100, 5), false)
        .await
        .unwrap();
    r.seed(b, &[("budget", "007")]).await;
    let before = r.dump().await;
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c", T, &[(a, 10, 1), (b, 1, 0)]))
        .await
        .unwrap();
    assert_eq!(
        d,
        PlaceDecision::Rejected {
            duplicate: false,
            reason: Reason::CorruptPromotion,
            promotion_id: id(b)
        }
    );
    // a released and marked, b's rejection remembered, a's counter at 0.
    let mut want = vec![
        r.keys().used(&id(a), &id("c")),
        r.keys().rejected(&id(a), &id("e1")),
        r.keys().rejected(&id(b), &id("e1")),
    ];
    want.sort();
    r.assert_changed(&before, &want, "corrupt data on one node")
        .await;
    assert_eq!(r.promo_field(a, "budget").await.as_deref(), Some("100"));
}

/// SCRIPT EXISTS on one node (a custom command: fred honours the node for those).
async fn cached_on(r: &TestRedis, node: &Server, shas: &[String]) -> Vec<bool> {
    let mut args = vec!["EXISTS".to_owned()];
    args.extend(shas.iter().cloned());
    let v: Vec<i64> = r
        .pool()
        .next()
        .with_cluster_node(node.clone())
        .custom(fred::cmd!("SCRIPT"), args)
        .await
        .unwrap();
    v.into_iter().map(|x| x == 1).collect()
}

#[tokio::test]
async fn scripts_reload_on_every_node() {
    // Alone on the stack: another test's call between the flush and the
    // look at each node's cache would load the script again.
    let exclusive = crate::common::stack_exclusive().await;
    let r = cluster_within(&exclusive).await;
    let ps = ids_on_distinct_nodes(&r).await;
    for p in &ps {
        admin::promo_set(&r.ledger, &id(p), spec(100, 5), false)
            .await
            .unwrap();
    }
    let primaries = r
        .pool()
        .next()
        .cached_cluster_state()
        .unwrap()
        .unique_primary_nodes();
    assert!(primaries.len() >= 3);
    let deduct = vec![scripts::DEDUCT.sha1.clone()];

    // Each node's cache emptied: EVALSHA says NOSCRIPT, the ledger sends the script.
    let _: () = r.pool().next().script_flush_cluster(false).await.unwrap();
    for node in &primaries {
        assert_eq!(
            cached_on(&r, node, &deduct).await,
            [false],
            "{node} flushed"
        );
    }
    let lines: Vec<(&str, u64, u64)> = ps.iter().map(|p| (p.as_str(), 1, 1)).collect();
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c", T, &lines))
        .await
        .unwrap();
    assert!(
        matches!(
            d,
            PlaceDecision::Accepted {
                duplicate: false,
                ..
            }
        ),
        "{d:?}"
    );
    for node in &primaries {
        assert_eq!(
            cached_on(&r, node, &deduct).await,
            [true],
            "{node}: EVAL cached it"
        );
    }

    let _: () = r.pool().next().script_flush_cluster(false).await.unwrap();
    r.ledger.load_scripts().await.unwrap();
    let shas: Vec<String> = scripts::all().iter().map(|s| s.sha1.clone()).collect();
    for node in &primaries {
        let cached = cached_on(&r, node, &shas).await;
        assert!(cached.iter().all(|c| *c), "{node}: {cached:?}");
    }
    r.ledger.ping().await.unwrap();
}
