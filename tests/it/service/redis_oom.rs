//! Redis out of memory, end to end (issue 25, item 2): under `maxmemory`
//! with `noeviction` every script write is refused with `OOM`. The service
//! must wait with backoff (no outcome, no commit past the events) and not
//! exit, then decide each event once when memory is released. Before the
//! fix the refund's OOM came back as `ERR OOM ... script: ...`, classed
//! `other` (fatal): the service exited 1, and every restart the same.
//!
//! A refund always runs rollback.lua on its own, and a placement does with
//! `redis.batch_max_lines = 1` (the durability gate's and a Cluster's
//! path): both are covered. A redis-server of the test's own (its memory is
//! squeezed), started like tests/it/common/replication.rs's nodes.

use std::time::Duration;

use crate::common::replication::{cli, eventually, free_port, redis};
use crate::common::{kafka, service};
use deductor::admin::PromoSpec;
use deductor::domain::event::Id;
use serde_json::json;

const AT: &str = "2026-11-29T10:00:00Z";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_is_waited_out_and_each_event_decided_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = redis(
        dir.path(),
        free_port(),
        &["--maxmemory-policy", "noeviction"],
    );
    let port = node.port;
    eventually(20, "redis answers", || {
        cli(port, &["PING"]).ends_with("PONG")
    })
    .await;
    let mut f = service::Fixture::new("redis-oom", 1).await;
    f.redis_url = format!("redis://127.0.0.1:{port}");
    let ledger = f.ledger().await;
    let spec = PromoSpec {
        budget: Some(100),
        stock: Some(10),
        ..PromoSpec::default()
    };
    f.promo(&ledger, "flash", spec).await;
    let placed = |e: &str, o: &str| {
        json!({"type": "OrderPlaced", "event_id": e, "order_id": o, "customer_id": "c1",
            "occurred_at": AT, "lines": [{"promotion_id": "flash", "budget": 10, "stock": 1}]})
    };
    // o1 is placed and decided before memory runs out.
    kafka::produce_events(&f.topics.input, &[placed("e1", "o1")]).await;
    let settings = f.settings(&[
        ("redis.batch_max_lines", "1"),
        ("retry.initial_interval_ms", "50"),
        ("retry.max_interval_ms", "300"),
    ]);
    let mut svc = service::start(settings);
    kafka::read_n(&f.topics.outcome, 1, Duration::from_secs(60)).await;

    // Memory runs out; a refund of o1 and a placement of o2 arrive.
    assert_eq!(cli(port, &["CONFIG", "SET", "maxmemory", "1"]), "OK");
    let refund = json!({"type": "OrderRefunded", "event_id": "e2", "order_id": "o1",
        "customer_id": "c1", "occurred_at": AT, "lines": [{"promotion_id": "flash"}]});
    kafka::produce_events(&f.topics.input, &[refund, placed("e3", "o2")]).await;
    // Both are attempted and refused for seconds: the service waits.
    eventually(60, "scripts refused with OOM", || {
        cli(port, &["INFO", "errorstats"])
            .lines()
            .any(|l| l.starts_with("errorstat_OOM:"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    svc.assert_running().await;
    let early = kafka::read_all(&f.topics.outcome).await;
    assert_eq!(
        early.len(),
        1,
        "an outcome while Redis refused every write: {:?}",
        early.iter().map(|r| r.json()).collect::<Vec<_>>()
    );
    let committed = kafka::committed(&f.topics.group, &f.topics.input, 1).await;
    assert!(
        committed.get(&0).copied().flatten().unwrap_or(0) <= 1,
        "committed past the refused events: {committed:?}"
    );

    // Memory is released: each event is decided once.
    assert_eq!(cli(port, &["CONFIG", "SET", "maxmemory", "0"]), "OK");
    let outcomes =
        kafka::read_until(&f.topics.outcome, Duration::from_secs(60), |r| r.len() >= 3).await;
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 1, Duration::from_secs(30))
        .await;
    svc.assert_running().await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");
    // Two orders: their outcomes may come in either order.
    let mut types: Vec<String> = outcomes
        .iter()
        .map(|r| {
            let o = r.json();
            format!(
                "{} {}",
                o["event_id"].as_str().unwrap(),
                o["type"].as_str().unwrap()
            )
        })
        .collect();
    types.sort();
    assert_eq!(
        types,
        [
            "e1 DeductAccepted",
            "e2 RollbackApplied",
            "e3 DeductAccepted"
        ],
        "one outcome each"
    );
    let stock: Option<String> = fred::prelude::HashesInterface::hget(
        ledger.pool(),
        ledger.keys().promotion(&Id::parse("flash").unwrap()),
        "stock",
    )
    .await
    .unwrap();
    assert_eq!(stock.as_deref(), Some("9"), "o1 refunded, o2 deducted");
    ledger.quit().await;
    f.cleanup().await;
}

/// exactly_once, a shutdown while Redis refuses writes: one event of the
/// open transaction waits (OOM), the events around it in its partition
/// finish (invalid ones: dead letters, no Redis). The boundary waiting for
/// the gate must not commit once the shutdown cancels the waiting event:
/// the transaction holds the dead letter of an offset above the one the
/// watermark stops at, so committing it publishes that dead letter twice
/// (once now, once when the next owner redoes the offsets after the hole).
/// Before the fix the boundary committed it: two dead letters of `eB`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_shutdown_during_oom_commits_nothing_above_an_unfinished_event() {
    let dir = tempfile::tempdir().unwrap();
    let node = redis(
        dir.path(),
        free_port(),
        &["--maxmemory-policy", "noeviction"],
    );
    let port = node.port;
    eventually(20, "redis answers", || {
        cli(port, &["PING"]).ends_with("PONG")
    })
    .await;
    let mut f = service::Fixture::new("redis-oom-eos", 1).await;
    f.redis_url = format!("redis://127.0.0.1:{port}");
    let ledger = f.ledger().await;
    let spec = PromoSpec {
        budget: Some(100),
        stock: Some(10),
        ..PromoSpec::default()
    };
    f.promo(&ledger, "flash", spec).await;
    let placed = |e: &str, o: &str| {
        json!({"type": "OrderPlaced", "event_id": e, "order_id": o, "customer_id": "c1",
            "occurred_at": AT, "lines": [{"promotion_id": "flash", "budget": 10, "stock": 1}]})
    };
    // Invalid (no lines): dead-lettered without a Redis call.
    let invalid = |e: &str, o: &str| json!({"type": "OrderPlaced", "event_id": e, "order_id": o});
    let settings = || {
        f.settings(&[
            ("kafka.delivery", "exactly_once"),
            ("kafka.transaction_interval_ms", "1000"),
            ("redis.batch_max_lines", "1"),
            ("retry.initial_interval_ms", "50"),
            ("retry.max_interval_ms", "300"),
            ("pipeline.drain_timeout_secs", "2"),
        ])
    };
    kafka::produce_events(&f.topics.input, &[placed("e1", "o1")]).await;
    let svc = service::start(settings());
    kafka::read_n(&f.topics.outcome, 1, Duration::from_secs(60)).await;
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 1, Duration::from_secs(30))
        .await;

    // Offsets 1..=3 start together: eA finishes, e2 waits out the OOM, eB
    // finishes behind it. The next boundary then waits for e2.
    assert_eq!(cli(port, &["CONFIG", "SET", "maxmemory", "1"]), "OK");
    kafka::produce_events(
        &f.topics.input,
        &[invalid("eA", "oA"), placed("e2", "o2"), invalid("eB", "oB")],
    )
    .await;
    eventually(60, "e2 refused with OOM", || {
        cli(port, &["INFO", "errorstats"])
            .lines()
            .any(|l| l.starts_with("errorstat_OOM:"))
    })
    .await;
    // Past two boundary ticks: one is waiting for the gate.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");

    // Memory back; the next run redoes what was not committed.
    assert_eq!(cli(port, &["CONFIG", "SET", "maxmemory", "0"]), "OK");
    let svc = service::start(settings());
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 1, Duration::from_secs(60))
        .await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the second run stops cleanly");

    let dlq = kafka::read_all(&f.topics.dlq).await;
    let mut dead: Vec<String> = dlq
        .iter()
        .map(|r| r.json()["event_id"].as_str().unwrap_or("?").to_owned())
        .collect();
    dead.sort();
    assert_eq!(
        dead,
        ["eA", "eB"],
        "one dead letter per invalid event (read_committed)"
    );
    // Invalid events have an outcome too (invalid_event): each event one.
    let mut decided = std::collections::BTreeMap::<String, usize>::new();
    for r in kafka::read_all(&f.topics.outcome).await {
        let e = r.json()["event_id"].as_str().unwrap_or("?").to_owned();
        *decided.entry(e).or_default() += 1;
    }
    assert!(
        decided.contains_key("e1") && decided.contains_key("e2"),
        "both placements decided: {decided:?}"
    );
    assert!(
        decided.values().all(|n| *n == 1),
        "one outcome per event (read_committed): {decided:?}"
    );
    ledger.quit().await;
    f.cleanup().await;
}
