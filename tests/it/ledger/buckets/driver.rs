//! The service's walk (src/domain/buckets.rs) driven on a real Redis by
//! src/ledger/buckets.rs's `drive`, many deliveries at once: a flash sale
//! on three buckets sells exactly its stock and strands nothing, refunds
//! give back to the bucket they took from and are sold again, and the
//! per-customer limit holds across buckets. On the standalone server and
//! on the 3-node Cluster.

use std::collections::BTreeMap;

use deductor::domain::buckets::{Dim, Outcome, Place, Placed, Refund, RefundRun, Report, Units};
use deductor::domain::event::Id;
use deductor::ledger::buckets::{choose_suffixes, drive, Buckets, StepGate};
use deductor::ledger::error::ErrorClass;
use fred::prelude::{Client, ClusterInterface, HashesInterface, KeysInterface};
use fred::util::redis_keyslot;
use futures::stream::{self, StreamExt};

use super::scripts::bucket_fields;
use crate::common::redis::{cluster, standalone, TestRedis};

const K: usize = 3;

fn id(s: String) -> Id {
    Id::parse(&s).expect("an id")
}

async fn create(r: &TestRedis, name: &str, total: Units, limit: u32) -> Vec<String> {
    // The tags `promo set --buckets` will choose: on the Cluster, one
    // bucket per primary.
    let client = r.pool().next();
    let suffixes = choose_suffixes(client, name, K);
    let p = id(name.to_owned());
    let keys: Vec<String> = suffixes.iter().map(|s| r.keys().bucket(&p, *s)).collect();
    assert_eq!(
        client.cached_cluster_state().is_some(),
        r.cluster,
        "the Cluster's layout known"
    );
    if let Some(routing) = client.cached_cluster_state() {
        let nodes: std::collections::BTreeSet<String> = keys
            .iter()
            .filter_map(|k| routing.get_server(redis_keyslot(k.as_bytes())))
            .map(|s| s.to_string())
            .collect();
        assert_eq!(nodes.len(), K, "{keys:?} on {nodes:?}");
    }
    for (j, key) in keys.iter().enumerate() {
        let fields = bucket_fields(total.share(K, j), j, K, Some(limit));
        let _: () = r.pool().hset(key, fields).await.expect("HSET");
        let _: () = r.pool().expire(key, 3_600, None).await.expect("EXPIRE");
    }
    keys
}

/// What the buckets hold: free, given away, set aside (summed).
async fn holdings(r: &TestRedis, keys: &[String]) -> (Units, Units, Units) {
    let mut sum = [Units::ZERO; 3];
    for key in keys {
        let h: BTreeMap<String, String> = r.pool().hgetall(key).await.expect("HGETALL");
        let get = |f: &str| -> i64 {
            h.get(f)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{key} {f}: {h:?}"))
        };
        for (i, (b, s)) in [
            ("budget", "stock"),
            ("held_budget", "held_stock"),
            ("set_budget", "set_stock"),
        ]
        .into_iter()
        .enumerate()
        {
            assert!(get(b) >= 0 && get(s) >= 0, "{key} below zero: {h:?}");
            sum[i] += Units::new(get(b), get(s));
        }
    }
    (sum[0], sum[1], sum[2])
}

/// Places one order per (order, customer), `width` at a time.
async fn place(
    client: &Client,
    keys: &[String],
    orders: Vec<(Id, Id)>,
    width: usize,
) -> Vec<(Id, Report)> {
    let one = Units::new(1, 1);
    stream::iter(orders)
        .map(|(o, c)| {
            let client = client.clone();
            let keys = keys.to_vec();
            async move {
                let b = Buckets {
                    client: &client,
                    keys,
                    ttl_secs: 3_600,
                    gate: None,
                };
                let mut p = Place::new(o.clone(), c, one, K);
                let report = drive(&b, &mut p).await.expect("the walk");
                (o, report)
            }
        })
        .buffer_unordered(width)
        .collect()
        .await
}

fn accepted(reports: &[(Id, Report)]) -> Vec<Id> {
    reports
        .iter()
        .filter(|(_, r)| matches!(r, Report::Done(Outcome::Placed(Placed::Accepted(_)))))
        .map(|(o, _)| o.clone())
        .collect()
}

async fn flash_sale(r: TestRedis) {
    let client = r.pool().next().clone();
    let keys = create(&r, "sale", Units::new(1_000, 45), 1).await;
    // 150 orders for 45 units, 12 at a time.
    let orders = (0..150)
        .map(|n| (id(format!("o{n:04}")), id(format!("c{n:04}"))))
        .collect();
    let first = place(&client, &keys, orders, 12).await;
    let sold = accepted(&first);
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for (_, rep) in &first {
        *kinds.entry(format!("{rep:?}")).or_default() += 1;
    }
    println!(
        "{} buckets: {kinds:?}",
        if r.cluster { "Cluster" } else { "standalone" }
    );
    assert_eq!(sold.len(), 45, "sold {} of 45", sold.len());
    for (o, rep) in &first {
        assert!(
            matches!(
                rep,
                Report::Done(Outcome::Placed(
                    Placed::Accepted(_) | Placed::Short(Dim::Stock)
                )) | Report::Short {
                    dim: Dim::Stock,
                    ..
                }
            ),
            "order {o}: {rep:?}"
        );
    }
    let (free, held, set) = holdings(&r, &keys).await;
    assert_eq!(
        (free.stock, held, set),
        (0, Units::ZERO, Units::ZERO),
        "left in the buckets"
    );
    assert_eq!(free.budget, 1_000 - 45, "budget taken");

    // Nine refunds at once, each naming the order only: what was taken
    // goes back.
    let refunds: Vec<Report> = stream::iter(sold.iter().take(9).cloned().enumerate())
        .map(|(i, o)| {
            let client = client.clone();
            let keys = keys.clone();
            async move {
                let b = Buckets {
                    client: &client,
                    keys,
                    ttl_secs: 3_600,
                    gate: None,
                };
                let mut run = RefundRun::new(id(format!("r{i:04}")), o, K);
                drive(&b, &mut run).await.expect("the refund's walk")
            }
        })
        .buffer_unordered(9)
        .collect()
        .await;
    for rep in &refunds {
        assert_eq!(
            *rep,
            Report::Done(Outcome::Refund(Refund::Applied(Units::new(1, 1)))),
            "a refund"
        );
    }
    let (free, _, _) = holdings(&r, &keys).await;
    assert_eq!(free.stock, 9, "refunded units back");

    // Thirty more orders: exactly the nine refunded units sell.
    let orders = (150..180)
        .map(|n| (id(format!("o{n:04}")), id(format!("c{n:04}"))))
        .collect();
    let second = place(&client, &keys, orders, 10).await;
    assert_eq!(accepted(&second).len(), 9, "resold");
    let (free, held, set) = holdings(&r, &keys).await;
    assert_eq!(
        (free.stock, held, set),
        (0, Units::ZERO, Units::ZERO),
        "left in the buckets"
    );

    // One customer, eight orders at once, a limit of one per customer:
    // whichever buckets the orders land in, one is accepted.
    let keys = create(&r, "limited", Units::new(1_000, 100), 1).await;
    let orders = (0..8)
        .map(|n| (id(format!("l{n:04}")), id("greedy".into())))
        .collect();
    let reports = place(&client, &keys, orders, 8).await;
    assert_eq!(accepted(&reports).len(), 1, "{reports:?}");
    let limited = reports
        .iter()
        .filter(|(_, r)| *r == Report::Done(Outcome::Placed(Placed::Limit)))
        .count();
    assert_eq!(limited, 7, "{reports:?}");
    let (free, held, set) = holdings(&r, &keys).await;
    assert_eq!((free.stock, held, set), (99, Units::ZERO, Units::ZERO));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flash_sale_on_three_buckets_sells_exactly_its_stock() {
    flash_sale(standalone().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flash_sale_on_three_buckets_of_a_cluster_sells_exactly_its_stock() {
    flash_sale(cluster().await).await;
}

/// With the durability gate on, a walk waits for each call's writes to
/// reach the replicas before its next call (`StepGate`): a Give another
/// bucket's Accept stands on must not be taken back by a failover (the
/// chaos suite's `--long` Cluster reshard run sold 3 units twice when the
/// gate waited only at the end of the event). Here the server has no
/// replica, so the first call's `WAIT` counts 0 of 1: the walk stops there
/// with a retryable `replicas` error, having made exactly one call, and the
/// event decided again with the gate off is accepted once.
async fn a_step_not_confirmed_stops_the_walk(r: TestRedis) {
    let client = r.pool().next().clone();
    let keys = create(&r, "gated", Units::new(100, 9), 1).await;
    let (o, c) = (id("o-gated".to_owned()), id("c-gated".to_owned()));
    let one = Units::new(1, 1);
    let gated = Buckets {
        client: &client,
        keys: keys.clone(),
        ttl_secs: 3_600,
        gate: Some(StepGate {
            replicas: 1,
            timeout: std::time::Duration::from_millis(20),
            command_timeout: std::time::Duration::from_secs(5),
        }),
    };
    let mut p = Place::new(o.clone(), c.clone(), one, K);
    let e = drive(&gated, &mut p)
        .await
        .expect_err("no replica acknowledges: the step is not durable");
    assert_eq!(e.class(), ErrorClass::Replicas, "{e}");
    // One call made, on the order's bucket: its unit set aside there (the
    // limit's reservation comes next), nothing elsewhere.
    let (free, held, set) = holdings(&r, &keys).await;
    assert_eq!(
        free + held + set,
        Units::new(100, 9),
        "nothing lost or made"
    );
    assert_eq!(set, one, "the first step (set aside at home) and no other");
    let open = Buckets {
        client: &client,
        keys: keys.clone(),
        ttl_secs: 3_600,
        gate: None,
    };
    let mut again = Place::new(o.clone(), c.clone(), one, K);
    let report = drive(&open, &mut again).await.expect("the retried walk");
    assert!(
        matches!(report, Report::Done(Outcome::Placed(Placed::Accepted(_)))),
        "{report:?}"
    );
    let mut third = Place::new(o, c, one, K);
    let report = drive(&open, &mut third).await.expect("a redelivery");
    assert!(
        matches!(report, Report::Done(Outcome::Placed(Placed::Accepted(_)))),
        "decided once, the same way: {report:?}"
    );
    let (free, held, set) = holdings(&r, &keys).await;
    assert_eq!(
        (free, held, set),
        (Units::new(99, 8), Units::ZERO, Units::ZERO),
        "one unit deducted, once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_step_the_replicas_did_not_confirm_stops_the_walk() {
    a_step_not_confirmed_stops_the_walk(standalone().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_step_the_replicas_did_not_confirm_stops_the_walk_on_a_cluster() {
    a_step_not_confirmed_stops_the_walk(cluster().await).await;
}

/// A bucket's slot being migrated (found by the chaos suite's Cluster gate
/// run: a node added and slots moved onto it while events flowed, and a
/// consumer stopped on "ERR Script attempted to access a non local key in a
/// cluster node"). lua/bucket.lua declares one key and touches others of
/// its slot, which a node checks only as each is touched: on the source of
/// a migration, a key not there (moved already, or new) was refused half-way
/// through the call, a fatal error after the call's earlier writes. Every
/// call now asks for two keys nobody writes first, refused while the slot
/// moves: the call replies TRYAGAIN (retryable) before it reads or writes
/// anything, and decides once the slot is stable again. On a Cluster of the
/// test's own, so the shared one is never left mid-migration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_call_in_a_slot_being_migrated_is_refused_before_it_writes() {
    use crate::common::redis::{settings, unique_prefix};
    use crate::common::replication::{cli, ReplicatedCluster};
    use deductor::ledger::Ledger;
    use deductor_testkit::redis_cli::slot_owner_and_another;

    let own = ReplicatedCluster::start().await;
    let url = own.url();
    let seed = own.nodes[0].port;
    let ledger = Ledger::connect(&settings(&url, &unique_prefix()))
        .await
        .expect("the test's own Cluster");
    let mut r = TestRedis::of_ledger(ledger, &url).await;
    r.cluster = true;
    let client = r.pool().next().clone();
    let keys = create(&r, "moving", Units::new(100, 9), 1).await;

    // Every bucket's slot MIGRATING from its primary to another one.
    let mut moving = Vec::new();
    for key in &keys {
        let slot: u16 = cli(seed, &["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("CLUSTER KEYSLOT");
        let (source, target) = slot_owner_and_another(seed, slot);
        let s = slot.to_string();
        let importing = ["CLUSTER", "SETSLOT", &s, "IMPORTING", &source.id];
        assert_eq!(cli(target.port, &importing), "OK");
        let migrating = ["CLUSTER", "SETSLOT", &s, "MIGRATING", &target.id];
        assert_eq!(cli(source.port, &migrating), "OK");
        moving.push((s, source.port, target.port));
    }

    let b = Buckets {
        client: &client,
        keys: keys.clone(),
        ttl_secs: 3_600,
        gate: None,
    };
    let (o, c) = (id("o-moving".to_owned()), id("c-moving".to_owned()));
    let one = Units::new(1, 1);
    let mut p = Place::new(o.clone(), c.clone(), one, K);
    let e = drive(&b, &mut p)
        .await
        .expect_err("every bucket's slot is moving");
    assert_eq!(e.class(), ErrorClass::Busy, "retryable, not fatal: {e}");
    assert!(e.to_string().contains("TRYAGAIN"), "{e}");
    assert_eq!(
        holdings(&r, &keys).await,
        (Units::new(100, 9), Units::ZERO, Units::ZERO),
        "nothing written"
    );

    // The migrations called off: the same event is decided, once.
    for (s, source, target) in &moving {
        assert_eq!(cli(*target, &["CLUSTER", "SETSLOT", s, "STABLE"]), "OK");
        assert_eq!(cli(*source, &["CLUSTER", "SETSLOT", s, "STABLE"]), "OK");
    }
    let mut again = Place::new(o, c, one, K);
    let report = drive(&b, &mut again).await.expect("the retried walk");
    assert!(
        matches!(report, Report::Done(Outcome::Placed(Placed::Accepted(_)))),
        "{report:?}"
    );
    assert_eq!(
        holdings(&r, &keys).await,
        (Units::new(99, 8), Units::ZERO, Units::ZERO),
        "one unit deducted, once"
    );
}
