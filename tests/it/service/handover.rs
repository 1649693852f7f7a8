//! The premise of the lane hand-over in `pipeline/routing.rs` (issue 23,
//! found on paper): a message pulled from a partition's own queue for a
//! lane that a revoke and a re-assignment of the same partition replaced
//! is handed to the new lane (at_least_once). That is in offset order, and
//! the watermark never passes an unfinished event, only if such a message
//! is never one fetched before the revoke: were it offset k, prefetched
//! before the revoke, the new lane would start k ahead of the offsets from
//! the committed one up to k, which the new assignment fetches again, and
//! with k done first its watermark would be k + 1 while they are not.
//!
//! Why it cannot be: the pipeline's pulls and the rebalance callbacks run
//! on one task, and a pull's take and its hand-over have no await between
//! them; so a message handed to a replaced lane was taken after the revoke
//! callback returned. The revoke callback unassigns (`rd_kafka_assign(NULL)`
//! or `incremental_unassign`, synchronous), which stops the partition's
//! fetcher and bumps its version barrier before it returns; every message
//! fetched before carries the old version and is discarded when popped. So
//! the first message popped after a revoke and a re-assignment is the first
//! of the new fetch, at the committed offset. This test holds librdkafka to
//! that, with the service's own consumer configuration and queue split.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::message::Message;
use rdkafka::statistics::Statistics;
use rdkafka::{Offset, TopicPartitionList};

use crate::common::kafka;
use crate::common::service::Fixture;

/// Records the rebalances (after librdkafka applied them) and the
/// partition's fetch queue length from the statistics.
struct Watch {
    topic: String,
    rebalances: Mutex<Vec<&'static str>>,
    fetchq: AtomicI64,
}

impl ClientContext for Watch {
    fn stats(&self, stats: Statistics) {
        if let Some(p) = stats
            .topics
            .get(&self.topic)
            .and_then(|t| t.partitions.get(&0))
        {
            self.fetchq.store(p.fetchq_cnt, Ordering::Relaxed);
        }
    }
}

impl ConsumerContext for Watch {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let what = match rebalance {
            Rebalance::Assign(_) => "assigned",
            Rebalance::Revoke(_) => "revoked",
            Rebalance::Error(_) => "error",
        };
        self.rebalances.lock().unwrap().push(what);
    }
}

async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ok() {
        assert!(Instant::now() < deadline, "waited 60 s for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How the partition is revoked and assigned back to the same member.
#[derive(Debug, Clone, Copy)]
enum Trigger {
    /// Eager assignor (the default): a second member joins the group for
    /// another topic, and the rebalance revokes everything and assigns the
    /// input partition back.
    SecondMember,
    /// Cooperative-sticky (allowed in at_least_once): the member leaves and
    /// joins again, as after a lost assignment (`incremental_unassign`).
    Rejoin,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_taken_after_an_eager_revoke_and_reassignment_is_the_first_of_the_new_fetch() {
    handover("handover-eager", None, Trigger::SecondMember).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_taken_after_a_cooperative_revoke_and_reassignment_is_the_first_of_the_new_fetch()
{
    handover("handover-coop", Some("cooperative-sticky"), Trigger::Rejoin).await;
}

async fn handover(label: &str, assignor: Option<&str>, trigger: Trigger) {
    let f = Fixture::new(label, 1).await;
    let records: Vec<kafka::Raw> = (0..300)
        .map(|i| kafka::Raw {
            key: Some(format!("o-{i}").into_bytes()),
            payload: Some(format!("event {i}").into_bytes()),
            partition: Some(0),
            ..kafka::Raw::default()
        })
        .collect();
    kafka::produce_raw(&f.topics.input, &records).await;

    // The service's consumer (`kafka::consumer::consumer_config`: the
    // default, eager assignor), its input partition on its own queue.
    let settings = f.settings(&[]);
    let mut config = deductor::kafka::consumer::consumer_config(&settings.kafka, None);
    config.set("statistics.interval.ms", "100");
    if let Some(a) = assignor {
        config.set("partition.assignment.strategy", a);
    }
    let watch = Watch {
        topic: f.topics.input.clone(),
        rebalances: Mutex::new(Vec::new()),
        fetchq: AtomicI64::new(0),
    };
    let consumer: Arc<StreamConsumer<Watch>> =
        Arc::new(config.create_with_context(watch).expect("the consumer"));
    consumer.subscribe(&[&f.topics.input]).unwrap();
    let queue = consumer
        .split_partition_queue(&f.topics.input, 0)
        .expect("its own queue");
    // The main queue serves the rebalances (and gets no message).
    let main = {
        let c = consumer.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(m) = c.recv().await {
                    panic!("a message on the main queue: {}", m.offset());
                }
            }
        })
    };
    let rebalances = || consumer.context().rebalances.lock().unwrap().clone();
    wait_for("the assignment", || rebalances() == ["assigned"]).await;

    let take = || async {
        let m = tokio::time::timeout(Duration::from_secs(30), queue.recv())
            .await
            .expect("a message within 30 s")
            .expect("no consumer error");
        m.offset()
    };
    for want in 0..10 {
        assert_eq!(take().await, want);
    }
    // More is fetched ahead, waiting in the partition's queue.
    wait_for("messages fetched ahead", || {
        consumer.context().fetchq.load(Ordering::Relaxed) > 0
    })
    .await;
    // 5..9 "in flight": the watermark is 5, as a revoke would commit it.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&f.topics.input, 0, Offset::Offset(5))
        .unwrap();
    consumer.commit(&tpl, CommitMode::Sync).unwrap();

    let other_task = match trigger {
        // A second member of the group, subscribed to another topic: the
        // eager rebalance revokes the input partition and assigns it back.
        Trigger::SecondMember => {
            let other: Arc<StreamConsumer> = Arc::new(kafka::group_member(&f.topics.group, 45_000));
            other.subscribe(&[&f.topics.outcome]).unwrap();
            Some(tokio::spawn(async move {
                loop {
                    let _ = other.recv().await;
                }
            }))
        }
        Trigger::Rejoin => {
            consumer.unsubscribe();
            wait_for("the revoke", || rebalances() == ["assigned", "revoked"]).await;
            consumer.subscribe(&[&f.topics.input]).unwrap();
            None
        }
    };
    wait_for("a revoke and the same partition assigned again", || {
        rebalances() == ["assigned", "revoked", "assigned"]
    })
    .await;
    assert!(
        consumer
            .assignment()
            .unwrap()
            .find_partition(&f.topics.input, 0)
            .is_some(),
        "the input partition is assigned here again"
    );

    // Never 10 (fetched before the revoke): the committed offset, then on.
    for want in 5..40 {
        assert_eq!(
            take().await,
            want,
            "after the re-assignment, the partition's queue starts at the committed offset"
        );
    }

    if let Some(t) = other_task {
        t.abort();
    }
    main.abort();
    drop(queue);
    f.cleanup().await;
}

/// The service itself through the hand-over, many times: every lane full
/// (one event in flight per partition, its queue held back), while a second
/// member joins and leaves the group over and over, so each eager rebalance
/// revokes every partition and assigns it straight back with messages
/// pulled and queued for the old lanes. Meanwhile the group's committed
/// offsets are sampled: every input offset below a committed one must
/// already have its outcome or dead letter, produced before the sample
/// (the record's create time); and at the end each event has one decision
/// and the Redis counters add up (`workload::verify`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_replaced_again_and_again_commit_only_finished_events() {
    use crate::common::service;
    use crate::common::workload::{self, Shape};
    const PARTITIONS: i32 = 4;
    const WAIT: Duration = Duration::from_secs(180);
    let f = Fixture::new("handover-churn", PARTITIONS).await;
    let ledger = f.ledger().await;
    let w = workload::generate(
        "hc",
        &Shape {
            orders: 3000,
            customers: 800,
            stock: 250,
            seed: 23,
            ..Shape::default()
        },
    );
    w.seed(&f, &ledger).await;
    w.produce(&f.topics.input, 0..w.items.len()).await;
    let total = w.items.len() as u64;

    let a = service::start(f.settings(&[
        ("pipeline.max_in_flight_per_partition", "1"),
        ("pipeline.max_in_flight", "4"),
        ("pipeline.commit_interval_ms", "50"),
    ]));

    // The committed offsets, sampled with the time each was seen at.
    let stop_sampling = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (group, topic, stop) = (
            f.topics.group.clone(),
            f.topics.input.clone(),
            stop_sampling.clone(),
        );
        tokio::spawn(async move {
            let mut samples: Vec<(i64, i32, i64)> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let committed = kafka::committed(&group, &topic, PARTITIONS).await;
                let seen_at = chrono::Utc::now().timestamp_millis();
                for (p, o) in committed {
                    if let Some(o) = o {
                        samples.push((seen_at, p, o));
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            samples
        })
    };

    // A second member joins (for another topic) and leaves, again and
    // again, while the backlog lasts.
    let done = || a.status.events_done.load(Ordering::Relaxed) as u64;
    let mut cycles = 0;
    while cycles < 6 && done() < total * 3 / 4 {
        let other: Arc<StreamConsumer> = Arc::new(kafka::group_member(&f.topics.group, 6000));
        other.subscribe(&[&f.topics.outcome]).unwrap();
        let polling = {
            let c = other.clone();
            tokio::spawn(async move {
                loop {
                    let _ = c.recv().await;
                }
            })
        };
        wait_for("the second member's assignment", || {
            other.assignment().is_ok_and(|a| a.count() > 0)
        })
        .await;
        polling.abort();
        let _ = polling.await;
        // Closing leaves the group (a blocking call).
        tokio::task::spawn_blocking(move || drop(other))
            .await
            .unwrap();
        assert!(!a.is_finished(), "the service keeps running");
        cycles += 1;
    }
    assert!(cycles >= 2, "rebalances while events were queued: {cycles}");

    w.wait_done(&f, WAIT).await;
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, PARTITIONS, WAIT).await;
    let (r, _) = a.stop(Duration::from_secs(30)).await;
    r.expect("the service stops cleanly");
    stop_sampling.store(true, Ordering::Relaxed);
    let samples = sampler.await.unwrap();

    let outcomes = kafka::read_all(&f.topics.outcome).await;
    let dlq = kafka::read_all(&f.topics.dlq).await;
    // When each input offset first had its answer produced.
    let mut answered: std::collections::BTreeMap<(i32, i64), i64> = Default::default();
    let mut note = |at: (i32, i64), ts: Option<i64>| {
        let ts = ts.expect("records carry their create time");
        let e = answered.entry(at).or_insert(ts);
        *e = (*e).min(ts);
    };
    for r in &outcomes {
        let v = r.json();
        let at = (
            v["source"]["partition"].as_i64().unwrap() as i32,
            v["source"]["offset"].as_i64().unwrap(),
        );
        note(at, r.timestamp);
    }
    for r in &dlq {
        let p = r.headers["deductor.source.partition"].parse().unwrap();
        let o = r.headers["deductor.source.offset"].parse().unwrap();
        note((p, o), r.timestamp);
    }
    let mut checked = 0usize;
    for (seen_at, p, committed) in &samples {
        for o in 0..*committed {
            let when = answered.get(&(*p, o)).copied();
            assert!(
                when.is_some_and(|t| t <= *seen_at),
                "offset {p}@{o} was committed past (to {committed}, seen at {seen_at} ms) \
                 before its answer was produced (at {when:?})"
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "some commits were sampled mid-run");
    println!(
        "hand-over churn: {cycles} join/leave cycles, {} commit samples, {checked} offsets checked",
        samples.len()
    );
    workload::verify("hand-over churn", &w, &outcomes, &dlq, &ledger).await;
    ledger.quit().await;
    f.cleanup().await;
}
