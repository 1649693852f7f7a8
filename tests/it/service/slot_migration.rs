//! A Cluster slot migration while events flow (issue 25, item 1): the slot
//! of the hot promotion is held MIGRATING / IMPORTING for seconds while its
//! keys move one chunk at a time, as `redis-cli --cluster reshard` does for
//! a slot holding many keys. The service must wait the migration out (the
//! hot promotion's calls meet `ASK` and `TRYAGAIN`), never exit, keep
//! deciding the other promotions, and decide every event exactly once.
//!
//! Before the fix, fred followed the `ASK` itself: it sent `ASKING` on a
//! pooled connection and read the reply that belonged to the next command,
//! after which the pool's replies were shifted and every call on it timed
//! out until a restart (the service stayed up, deciding nothing). The
//! ledger now has fred follow no redirection (`max_redirections = 0`): a
//! `MOVED` re-reads the slot map and the call is retried by the ledger's own
//! backoff, and an `ASK` is retried until the migration ends.
//!
//! On a Redis Cluster of the test's own (3 primaries, 3 replicas), so the
//! shared dev-stack Cluster is never resharded under other tests.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::replication::{cli, ReplicatedCluster};
use crate::common::{kafka, service};
use deductor::admin::PromoSpec;
use deductor::domain::event::Id;
use deductor_testkit::redis_cli::{cluster_primaries, slot_owner_and_another};
use serde_json::{json, Value};

const AT: &str = "2026-11-29T10:00:00Z";
const PROMOS: [&str; 4] = ["hot", "p2", "p3", "p4"];

/// The primaries' `(node id, port)`.
fn primaries(port: u16) -> Vec<(String, u16)> {
    cluster_primaries(port)
        .into_iter()
        .map(|p| (p.id, p.port))
        .collect()
}

fn placed(n: usize) -> Value {
    let promo = PROMOS[n % PROMOS.len()];
    json!({"type": "OrderPlaced", "event_id": format!("e{n}"), "order_id": format!("o{n}"),
        "customer_id": format!("c{}", n % 50), "occurred_at": AT,
        "lines": [{"promotion_id": promo, "budget": 1, "stock": 1}]})
}

async fn produce(topic: &str, range: std::ops::Range<usize>) {
    let events: Vec<Value> = range.map(placed).collect();
    kafka::produce_events(topic, &events).await;
}

/// Event id -> its outcomes' types, read until `n` distinct events have one.
async fn decided(topic: &str, n: usize, within: Duration) -> BTreeMap<String, Vec<String>> {
    let records = kafka::read_until(topic, within, |rs| {
        rs.iter()
            .filter_map(|r| r.json()["event_id"].as_str().map(str::to_owned))
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            >= n
    })
    .await;
    let mut by_event: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &records {
        let o = r.json();
        let e = o["event_id"].as_str().unwrap_or("?").to_owned();
        let t = o["type"].as_str().unwrap_or("?").to_owned();
        by_event.entry(e).or_default().push(t);
    }
    by_event
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_of_the_hot_promotion_is_waited_out() {
    let cluster = ReplicatedCluster::start().await;
    let seed_port = cluster.nodes[0].port;
    let mut f = service::Fixture::new("slot-migration", 3).await;
    f.redis_url = cluster.url();
    let ledger = f.ledger().await;
    let spec = PromoSpec {
        budget: Some(1_000_000),
        stock: Some(100_000),
        ..PromoSpec::default()
    };
    for p in PROMOS {
        f.promo(&ledger, p, spec.clone()).await;
    }
    let hot_key = ledger.keys().promotion(&Id::parse("hot").expect("id"));
    let slot: u16 = cli(seed_port, &["CLUSTER", "KEYSLOT", &hot_key])
        .parse()
        .expect("CLUSTER KEYSLOT");
    let (owner, other) = slot_owner_and_another(seed_port, slot);
    let (source_id, source) = (owner.id, owner.port);
    let (target_id, target) = (other.id, other.port);

    let settings = f.settings(&[
        ("retry.initial_interval_ms", "50"),
        ("retry.max_interval_ms", "500"),
        ("redis.command_timeout_ms", "2000"),
    ]);
    let mut svc = service::start(settings);

    // 200 events decided before the migration: the slot holds many keys.
    produce(&f.topics.input, 0..200).await;
    let before = decided(&f.topics.outcome, 200, Duration::from_secs(60)).await;
    assert_eq!(before.len(), 200);

    // The migration: the slot held MIGRATING / IMPORTING while its keys
    // move in chunks over about 6 s, with events for every promotion
    // arriving meanwhile.
    assert_eq!(
        cli(
            target,
            &[
                "CLUSTER",
                "SETSLOT",
                &slot.to_string(),
                "IMPORTING",
                &source_id
            ]
        ),
        "OK"
    );
    assert_eq!(
        cli(
            source,
            &[
                "CLUSTER",
                "SETSLOT",
                &slot.to_string(),
                "MIGRATING",
                &target_id
            ]
        ),
        "OK"
    );
    let start = Instant::now();
    let mut next = 200;
    let mut moved = 0usize;
    loop {
        let keys = cli(
            source,
            &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "20"],
        );
        let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
        if keys.is_empty() && start.elapsed() > Duration::from_secs(6) {
            break;
        }
        if next < 500 {
            produce(&f.topics.input, next..next + 20).await;
            next += 20;
        }
        for k in keys.iter().take(8) {
            let reply = cli(
                source,
                &["MIGRATE", "127.0.0.1", &target.to_string(), k, "0", "5000"],
            );
            assert!(reply == "OK" || reply == "NOKEY", "MIGRATE {k}: {reply:?}");
            moved += 1;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the migration did not end: {} keys left",
            keys.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The slot is the target's: on the target first, then everywhere.
    for (_, port) in [(target_id.clone(), target), (source_id.clone(), source)] {
        assert_eq!(
            cli(
                port,
                &["CLUSTER", "SETSLOT", &slot.to_string(), "NODE", &target_id]
            ),
            "OK"
        );
    }
    for (_, port) in primaries(seed_port) {
        cli(
            port,
            &["CLUSTER", "SETSLOT", &slot.to_string(), "NODE", &target_id],
        );
    }
    assert!(moved > 0, "the slot held no keys to move");
    if next < 500 {
        produce(&f.topics.input, next..500).await;
    }
    // And events after it.
    produce(&f.topics.input, 500..600).await;

    let all = decided(&f.topics.outcome, 600, Duration::from_secs(90)).await;
    svc.assert_running().await;
    let missing: Vec<String> = (0..600)
        .map(|n| format!("e{n}"))
        .filter(|e| !all.contains_key(e))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of 600 events undecided 90 s after the migration (e.g. {:?})",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    for (e, types) in &all {
        assert_eq!(types, &["DeductAccepted"], "{e}: one acceptance");
    }
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 3, Duration::from_secs(30))
        .await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");

    // Each promotion's stock fell by exactly its events.
    for (i, p) in PROMOS.iter().enumerate() {
        let key = ledger.keys().promotion(&Id::parse(p).expect("id"));
        // The test's pool still has the old slot map: its first call meets
        // MOVED (fred re-reads the map and, following no redirection, fails
        // it); the next goes to the new owner.
        let mut stock: Option<String> = None;
        for attempt in 0..5 {
            match fred::prelude::HashesInterface::hget(ledger.pool(), &key, "stock").await {
                Ok(v) => {
                    stock = v;
                    break;
                }
                Err(e) if attempt < 4 => {
                    eprintln!("hget {key}: {e}; again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("hget {key}: {e}"),
            }
        }
        let events = (0..600).filter(|n| n % PROMOS.len() == i).count() as u64;
        assert_eq!(
            stock.as_deref(),
            Some((100_000 - events).to_string().as_str()),
            "{p}: one deduction per event"
        );
    }
    ledger.quit().await;
    drop(cluster);
}
