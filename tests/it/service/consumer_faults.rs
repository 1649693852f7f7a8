//! Faults against the real Kafka and Redis: a child `deductor run` killed
//! before it committed, a crash loop of SIGKILLs while events flow, and a
//! consumer that leaves and rejoins its group mid-stream. After each: every
//! event has an outcome (or dead letter), one decision per event, and the
//! Redis counters equal what the decisions add up to (no double deduction).
//! Then records too large for Kafka to dead-letter whole, which must not
//! stop the service on their offset.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::kafka;
use crate::common::service::{self, Fixture};
use crate::common::workload::{self, Shape};
use rand::Rng;

const WAIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_before_commit_then_restarted_every_event_has_one_decision() {
    let f = Fixture::new("redeliver", 3).await;
    let ledger = f.ledger().await;
    let w = workload::generate(
        "rd",
        &Shape {
            orders: 400,
            customers: 150,
            stock: 60,
            seed: 4,
            ..Shape::default()
        },
    );
    w.seed(&f, &ledger).await;
    w.produce(&f.topics.input, 0..w.items.len()).await;

    // The first process never reaches its commit timer: killed after some
    // outcomes were published, it leaves all of them uncommitted.
    let env = f.env(&[("pipeline.commit_interval_ms", "3600000")]);
    let mut child = service::spawn(&env, &["run"]);
    kafka::read_until(&f.topics.outcome, WAIT, |rs| rs.len() >= 100).await;
    child.assert_running();
    child.kill();
    // (kept until the end: a failed test keeps its log)
    let _first = child;
    let committed = kafka::committed(&f.topics.group, &f.topics.input, 3).await;
    assert!(
        committed.values().all(Option::is_none),
        "nothing committed before the kill: {committed:?}"
    );
    let published = kafka::read_all(&f.topics.outcome).await.len();

    let child = service::spawn(&f.env(&[]), &["run"]);
    w.wait_done(&f, WAIT).await;
    let (outcomes, dlq) = service::finish_child(&f, child, WAIT).await;
    let fig = workload::verify("redelivery", &w, &outcomes, &dlq, &ledger).await;
    println!("redelivery: {published} outcomes published before the kill");
    assert!(
        fig.duplicate_outcomes > 0,
        "the restart redelivered the uncommitted events"
    );
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_loop_of_sigkills_loses_nothing_and_decides_once() {
    const KILLS: usize = 5;
    let f = Fixture::new("crash", 3).await;
    let ledger = f.ledger().await;
    let w = workload::generate(
        "cl",
        &Shape {
            orders: 2500,
            customers: 600,
            promotions: 4,
            stock: 150,
            seed: 11,
            ..Shape::default()
        },
    );
    w.seed(&f, &ledger).await;
    // Commits once a second, so every kill leaves work to redo.
    let env = f.env(&[("pipeline.commit_interval_ms", "1000")]);
    let topic = f.topics.input.clone();
    let stream = w.clone();
    let producer = tokio::spawn(async move {
        stream
            .produce_paced(topic, 100, Duration::from_millis(700))
            .await
    });

    let started = Instant::now();
    let mut rng = rand::rng();
    let mut kill_at = Vec::new();
    // Killed processes are kept until the end: a failed test keeps their logs.
    let mut killed = Vec::new();
    for _ in 0..KILLS {
        let mut child = service::spawn(&env, &["run"]);
        // Kill a consumer that owns partitions, at a random moment of its work.
        child
            .wait_for_log("partitions assigned", Duration::from_secs(60))
            .await;
        let after = Duration::from_millis(rng.random_range(100..3000));
        tokio::time::sleep(after).await;
        child.assert_running();
        child.kill();
        kill_at.push(format!(
            "{:.1}s (+{}ms after assignment)",
            started.elapsed().as_secs_f64(),
            after.as_millis()
        ));
        killed.push(child);
    }
    let child = service::spawn(&env, &["run"]);
    producer.await.unwrap();
    w.wait_done(&f, WAIT).await;
    let (outcomes, dlq) = service::finish_child(&f, child, WAIT).await;
    let fig = workload::verify("crash loop", &w, &outcomes, &dlq, &ledger).await;
    println!(
        "crash loop figures: events {} (records {}), kills {KILLS} at {kill_at:?}, lost {}, split decisions {}, duplicate outcomes {}, applied twice {}, dead letters {}, accepted {}, rejected {:?}, took {:.0}s",
        fig.events,
        fig.records,
        fig.lost,
        fig.split_decisions,
        fig.duplicate_outcomes,
        fig.applied_twice,
        fig.dead_letters,
        fig.accepted,
        fig.rejected,
        started.elapsed().as_secs_f64()
    );
    assert!(
        fig.rejected.contains_key("stock_insufficient"),
        "the promotions ran out of stock, as intended"
    );
    f.cleanup().await;
}

/// SIGTERM while the group waits out a member killed with SIGKILL: the new
/// member's join (and so its leave) waits on the broker for the dead
/// member's session. It owns nothing and has nothing uncommitted, so it
/// stops with 0 within the bound, whether or not the leave finished (a leave
/// left unfinished is a warning: the group moves on after the session
/// timeout). On Kafka 3.9 this exited 1 ("leaving the consumer group ...
/// abandoned").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_joining_behind_a_dead_member_exits_0() {
    let f = Fixture::new("join-term", 2).await;
    let env = f.env(&[
        ("pipeline.drain_timeout_secs", "2"),
        ("kafka.consumer.session.timeout.ms", "45000"),
    ]);
    let mut first = service::spawn(&env, &["run"]);
    first
        .wait_for_log("partitions assigned", Duration::from_secs(60))
        .await;
    first.kill();
    let mut second = service::spawn(&env, &["run"]);
    second
        .wait_for_log("consuming", Duration::from_secs(60))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    second.assert_running();
    let started = Instant::now();
    let (status, tail) = tokio::task::spawn_blocking(move || {
        // drain 2 s + the documented 15 s, and slack for the exit.
        let status = second.terminate(Duration::from_secs(25));
        (status, second.log_tail(30))
    })
    .await
    .unwrap();
    assert!(
        status.success(),
        "SIGTERM while joining: {status} after {:?}; log:\n{tail}",
        started.elapsed()
    );
    drop(first);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_leaves_and_rejoins_mid_stream() {
    let f = Fixture::new("rebalance", 6).await;
    let ledger = f.ledger().await;
    let w = workload::generate(
        "rb",
        &Shape {
            orders: 1500,
            customers: 400,
            stock: 120,
            seed: 21,
            ..Shape::default()
        },
    );
    w.seed(&f, &ledger).await;
    let topic = f.topics.input.clone();
    let stream = w.clone();
    let producer = tokio::spawn(async move {
        stream
            .produce_paced(topic, 60, Duration::from_millis(300))
            .await
    });

    let settings = f.settings(&[]);
    let a = service::start(settings.clone());
    let b = service::start(settings.clone());
    let done = |s: &service::InProcess| s.status.events_done.load(Ordering::Relaxed);
    let deadline = Instant::now() + WAIT;
    while done(&a) + done(&b) < 300 || done(&b) == 0 {
        assert!(Instant::now() < deadline, "no progress");
        assert!(!a.is_finished() && !b.is_finished(), "a consumer stopped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b_first = done(&b);
    let (r, _) = b.stop(Duration::from_secs(30)).await;
    r.expect("b leaves cleanly");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let b = service::start(settings);

    producer.await.unwrap();
    w.wait_done(&f, WAIT).await;
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 6, WAIT).await;
    let (a_done, b_done) = (done(&a), done(&b));
    let (ra, _) = a.stop(Duration::from_secs(30)).await;
    let (rb, _) = b.stop(Duration::from_secs(30)).await;
    ra.expect("a stops cleanly");
    rb.expect("b stops cleanly");
    assert!(
        b_done > 0,
        "the rejoined consumer got partitions and worked"
    );
    println!("rebalance: a did {a_done}, b did {b_first} then {b_done} after rejoining");

    let outcomes = kafka::read_all(&f.topics.outcome).await;
    let dlq = kafka::read_all(&f.topics.dlq).await;
    workload::verify("rebalance", &w, &outcomes, &dlq, &ledger).await;
    f.cleanup().await;
}

/// Rebalances while every lane is full (backpressure: its partition held
/// back or paused): a partition revoked and assigned back to the same
/// consumer must resume (librdkafka keeps an application pause across a
/// rebalance), and nothing is lost or decided twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_while_partitions_are_paused_for_backpressure() {
    let f = Fixture::new("paused", 4).await;
    let ledger = f.ledger().await;
    let w = workload::generate(
        "bp",
        &Shape {
            orders: 4000,
            customers: 1000,
            stock: 300,
            seed: 5,
            ..Shape::default()
        },
    );
    w.seed(&f, &ledger).await;
    w.produce(&f.topics.input, 0..w.items.len()).await;

    // One event in flight per partition and a lane queue of one: with this
    // backlog every lane is full all the time.
    let settings = f.settings(&[
        ("pipeline.max_in_flight_per_partition", "1"),
        ("pipeline.max_in_flight", "4"),
    ]);
    let a = service::start(settings.clone());
    let done = |s: &service::InProcess| s.status.events_done.load(Ordering::Relaxed);
    let deadline = Instant::now() + WAIT;
    while done(&a) < 300 {
        assert!(
            Instant::now() < deadline && !a.is_finished(),
            "a makes no progress"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // b joins (a is revoked and assigned part back), works, leaves (a gets
    // everything back).
    let b = service::start(settings);
    while done(&b) < 100 {
        assert!(
            Instant::now() < deadline && !b.is_finished(),
            "b makes no progress"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (r, _) = b.stop(Duration::from_secs(30)).await;
    r.expect("b leaves cleanly");

    w.wait_done(&f, WAIT).await;
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 4, WAIT).await;
    let (r, _) = a.stop(Duration::from_secs(30)).await;
    r.expect("a stops cleanly");
    let outcomes = kafka::read_all(&f.topics.outcome).await;
    let dlq = kafka::read_all(&f.topics.dlq).await;
    workload::verify("paused rebalance", &w, &outcomes, &dlq, &ledger).await;
    f.cleanup().await;
}

/// The value of a JSON event of `order_id` padded to exactly `size` bytes:
/// far above the contract's limit, so it is dead-lettered as `too_large`,
/// yet readable enough for an `invalid_event` rejection.
fn padded_event(order_id: &str, size: usize) -> Vec<u8> {
    let mut v = event(order_id);
    v["pad"] = serde_json::json!("");
    let bare = serde_json::to_vec(&v).unwrap().len();
    v["pad"] = serde_json::json!("x".repeat(size - bare));
    let out = serde_json::to_vec(&v).unwrap();
    assert_eq!(out.len(), size);
    out
}

fn event(order_id: &str) -> serde_json::Value {
    serde_json::json!({"type": "OrderPlaced", "event_id": format!("e-{order_id}"),
        "order_id": order_id, "customer_id": "c-1", "occurred_at": "2026-11-29T10:00:00Z",
        "lines": [{"promotion_id": "flash-42", "budget": 1500}]})
}

/// Records as large as the input topic accepts (its `max.message.bytes` is
/// 2 MiB here; the dead-letter topic keeps the broker default of 1,048,588)
/// are dead-lettered, whole when the producer and the dead-letter topic
/// take them, else truncated with headers saying so, and the partition
/// moves on: the events after them are decided and everything is committed.
/// `extra`: the service's settings (its producer's `message.max.bytes`,
/// its delivery mode).
async fn oversized_records_are_dead_lettered(label: &str, extra: &[(&str, &str)]) {
    const WHOLE: usize = 1_040_000;
    const CUT: usize = 1_500_000;
    let f = Fixture::new(label, 1).await;
    kafka::set_topic_config(&f.topics.input, &[("max.message.bytes", "2097152")]).await;
    let records: Vec<(&str, Vec<u8>)> = vec![
        ("o-a", serde_json::to_vec(&event("o-a")).unwrap()),
        ("o-big-1", padded_event("o-big-1", WHOLE)),
        ("o-b", serde_json::to_vec(&event("o-b")).unwrap()),
        ("o-big-2", padded_event("o-big-2", CUT)),
        ("o-c", serde_json::to_vec(&event("o-c")).unwrap()),
    ];
    let raws: Vec<kafka::Raw> = records
        .iter()
        .map(|(k, v)| kafka::Raw {
            key: Some(k.as_bytes().to_vec()),
            payload: Some(v.clone()),
            ..kafka::Raw::default()
        })
        .collect();
    kafka::produce_raw_with(&kafka::large_producer(), &f.topics.input, &raws).await;

    let mut svc = service::start(f.settings(extra));
    let alive = |s: &service::InProcess| assert!(!s.is_finished(), "the service stopped");
    // Every event has an outcome: the valid ones a decision, the big ones an
    // invalid_event rejection.
    let outcomes = kafka::read_until(&f.topics.outcome, WAIT, |r| {
        alive(&svc);
        r.len() >= records.len()
    })
    .await;
    let dead = kafka::read_until(&f.topics.dlq, WAIT, |r| {
        alive(&svc);
        r.len() >= 2
    })
    .await;
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 1, WAIT).await;
    svc.assert_running().await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");

    let by_order = kafka::by_field(&outcomes, "order_id");
    for (order, _) in &records {
        assert_eq!(
            by_order.get(*order).map(Vec::len),
            Some(1),
            "one outcome for {order}: {by_order:?}"
        );
    }
    for order in ["o-big-1", "o-big-2"] {
        assert_eq!(by_order[order][0]["reason"], "invalid_event", "{order}");
    }
    assert_eq!(dead.len(), 2, "one dead letter per big record");
    let letter = |offset: i64| {
        dead.iter()
            .find(|d| d.headers.get("deductor.source.offset") == Some(&offset.to_string()))
            .unwrap_or_else(|| panic!("no dead letter for offset {offset}"))
    };
    let h = |d: &kafka::Record, name: &str| d.headers.get(name).cloned();

    // 1,040,000 bytes fit the service's producer and the default topic.
    let whole = letter(1);
    assert_eq!(whole.key_str().as_deref(), Some("o-big-1"), "key kept");
    assert_eq!(
        h(whole, "deductor.error.kind").as_deref(),
        Some("too_large")
    );
    assert_eq!(
        whole.payload.as_deref(),
        Some(records[1].1.as_slice()),
        "whole"
    );
    assert_eq!(h(whole, "deductor.truncated"), None);
    assert_eq!(h(whole, "deductor.original.size"), None);

    // 1,500,000 bytes fit neither: cut to 64 KiB.
    let cut = letter(3);
    assert_eq!(cut.key_str().as_deref(), Some("o-big-2"), "key kept");
    assert_eq!(h(cut, "deductor.error.kind").as_deref(), Some("too_large"));
    assert_eq!(h(cut, "deductor.truncated").as_deref(), Some("true"));
    assert_eq!(
        h(cut, "deductor.original.size"),
        Some(CUT.to_string()),
        "original size"
    );
    assert_eq!(h(cut, "deductor.original.key.size"), None, "key not cut");
    assert_eq!(
        cut.payload.as_deref(),
        Some(&records[3].1[..65536]),
        "the first 64 KiB"
    );
    for name in [
        "deductor.error",
        "deductor.source.topic",
        "deductor.source.partition",
        "deductor.source.timestamp",
        "deductor.consumer.group",
    ] {
        assert!(h(cut, name).is_some_and(|v| !v.is_empty()), "{name}");
    }
    f.cleanup().await;
}

/// The 1.5 MB record is refused by librdkafka before it is sent (above the
/// producer's `message.max.bytes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_above_the_producer_limit_are_dead_lettered_and_the_partition_moves_on() {
    oversized_records_are_dead_lettered("bigrec", &[]).await;
}

/// The service's producer takes 4 MB: the 1.5 MB record is refused by the
/// broker (above the dead-letter topic's `max.message.bytes`), and the
/// idempotent producer goes on after that refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_the_dead_letter_topic_refuses_are_dead_lettered_truncated() {
    oversized_records_are_dead_lettered(
        "bigrecbroker",
        &[("kafka.producer.message.max.bytes", "4000000")],
    )
    .await;
}

/// The same in `exactly_once` mode: the broker's refusal comes after the
/// whole dead letter was queued in the transaction, which is aborted; the
/// redo after the rewind must send it truncated (before the fix every redo
/// was refused again and the partition never moved on). The readers are
/// `read_committed`: one outcome per record, one dead letter per big one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_dead_letters_the_topic_refuses_are_sent_truncated_on_the_redo() {
    oversized_records_are_dead_lettered(
        "bigreceos",
        &[
            ("kafka.producer.message.max.bytes", "4000000"),
            ("kafka.delivery", "exactly_once"),
            ("kafka.transaction_interval_ms", "100"),
        ],
    )
    .await;
}

/// `kafka.delivery = "exactly_once"`: the crash loop of SIGKILLs again, with
/// a second consumer joining and leaving (two rebalances) in the middle.
/// A `read_committed` reader sees exactly one outcome per input record: the
/// outcomes of the killed processes' open transactions are aborted (or
/// never committed), the offsets commit with the outcomes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_crash_loop_and_rebalances_publish_each_outcome_once() {
    const KILLS: usize = 4;
    let f = Fixture::new("eos", 3).await;
    let ledger = f.ledger().await;
    let w = workload::generate(
        "eo",
        &Shape {
            orders: 1500,
            customers: 500,
            promotions: 4,
            stock: 120,
            seed: 13,
            ..Shape::default()
        },
    );
    w.seed(&f, &ledger).await;
    let eos = [
        ("kafka.delivery", "exactly_once"),
        ("kafka.transaction_interval_ms", "200"),
    ];
    let env = f.env(&eos);
    let topic = f.topics.input.clone();
    let stream = w.clone();
    let producer = tokio::spawn(async move {
        stream
            .produce_paced(topic, 100, Duration::from_millis(500))
            .await
    });

    let mut rng = rand::rng();
    let mut killed = Vec::new();
    for i in 0..KILLS {
        let mut child = service::spawn(&env, &["run"]);
        child
            .wait_for_log("partitions assigned", Duration::from_secs(60))
            .await;
        if i == 1 {
            // A second member joins and leaves: two eager rebalances, each
            // aborting the open transaction of both.
            let mut other = service::spawn(&env, &["run"]);
            other
                .wait_for_log("partitions assigned", Duration::from_secs(60))
                .await;
            tokio::time::sleep(Duration::from_millis(rng.random_range(300..1500))).await;
            let status =
                tokio::task::spawn_blocking(move || other.terminate(Duration::from_secs(30)))
                    .await
                    .unwrap();
            assert!(
                status.success(),
                "the second member exits 0 on SIGTERM: {status}"
            );
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..2500))).await;
        child.assert_running();
        child.kill();
        killed.push(child);
    }
    let child = service::spawn(&env, &["run"]);
    producer.await.unwrap();
    w.wait_done(&f, WAIT).await;
    let (outcomes, dlq) = service::finish_child(&f, child, WAIT).await;
    let fig = workload::verify("exactly once", &w, &outcomes, &dlq, &ledger).await;
    println!("exactly once figures: {fig}");
    assert_eq!(
        fig.duplicate_outcomes, 0,
        "a read_committed reader sees one outcome per input record"
    );
    let mut sources = std::collections::HashSet::new();
    for d in &dlq {
        let at = (
            d.headers.get("deductor.source.partition").cloned(),
            d.headers.get("deductor.source.offset").cloned(),
        );
        assert!(
            sources.insert(at.clone()),
            "one dead letter per invalid record: {at:?} twice"
        );
    }
    f.cleanup().await;
}
