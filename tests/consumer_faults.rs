//! Faults against the real Kafka and Redis: a child `deductor run` killed
//! before it committed, a crash loop of SIGKILLs while events flow, and a
//! consumer that leaves and rejoins its group mid-stream. After each: every
//! event has an outcome (or dead letter), one decision per event, and the
//! Redis counters equal what the decisions add up to (no double deduction).

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::kafka;
use common::service::{self, Fixture};
use common::workload::{self, Shape};
use rand::Rng;

const WAIT: Duration = Duration::from_secs(120);

/// Waits until the group committed the whole input, stops the child with
/// SIGTERM (exit 0 expected), and reads both output topics.
async fn finish(
    f: &Fixture,
    mut child: service::ChildService,
) -> (Vec<kafka::Record>, Vec<kafka::Record>) {
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, f.topics.partitions, WAIT).await;
    child.assert_running();
    let status = tokio::task::spawn_blocking(move || child.terminate(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(
        status.success(),
        "deductor run exits 0 on SIGTERM: {status}"
    );
    (
        kafka::read_all(&f.topics.outcome).await,
        kafka::read_all(&f.topics.dlq).await,
    )
}

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
    let (outcomes, dlq) = finish(&f, child).await;
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
    let (outcomes, dlq) = finish(&f, child).await;
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
