//! Issue 27 item 6: the consumer's prefetch is one budget over all the
//! partitions of the input topic (`kafka.prefetch_budget_kib`), not 1 MiB
//! per partition. A real `deductor run` on a 64-partition topic with a
//! backlog of about 13 MB, slowed to one event at a time so that its
//! queues stay full: librdkafka's own statistics (`fetchq_size` of every
//! partition held, exported as `deductor_prefetch_bytes`) never show more
//! read ahead than the budget plus one small producer batch per partition.
//! With today's fixed bounds (1 MiB per partition) the whole backlog was
//! read ahead.
//!
//! The second test is the floor that per-partition bounds cannot hold: a
//! broker returns a partition's first batch whole, so with producers that
//! write 1 MB batches every partition fetched holds one. Fetch turns pause
//! the partitions the budget does not cover and rotate them in: the
//! read-ahead stays within the budget plus one batch, and every event still
//! gets exactly one outcome.

use std::time::{Duration, Instant};

use crate::common::kafka::{self, Raw};
use crate::common::service::{self, Fixture};
use rdkafka::config::ClientConfig;
use rdkafka::producer::FutureProducer;

const PARTITIONS: i32 = 64;
const EVENTS: usize = 40_000;
const BUDGET_KIB: u64 = 2048;
/// The producer's batches, the one floor outside any budget (a broker
/// returns a partition's first batch whole).
const BATCH_BYTES: u64 = 4096;

fn metric(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// An idempotent producer whose record batches grow to `batch_size`.
fn batching_producer(linger_ms: &str, batch_size: u64) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", kafka::brokers())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", linger_ms)
        .set("batch.size", batch_size.to_string())
        .set("message.timeout.ms", "120000")
        .create()
        .expect("creating a Kafka producer")
}

/// `n` placements of the promotion `promotion` that does not exist: each is
/// decided by a script call (promotion_not_found). `note` pads each event.
fn placements(tag: &str, promotion: &str, n: usize, note: usize) -> Vec<Raw> {
    (0..n)
        .map(|i| {
            let payload = serde_json::json!({"type": "OrderPlaced", "event_id": format!("e-{tag}-{i}"),
                "order_id": format!("o-{tag}-{i}"), "customer_id": format!("c-{}", i % 977),
                "occurred_at": "2026-11-29T10:00:00Z",
                "lines": [{"promotion_id": promotion, "budget": 100, "stock": 1}],
                "note": "x".repeat(note)});
            Raw {
                key: Some(format!("o-{tag}-{i}").into_bytes()),
                payload: Some(payload.to_string().into_bytes()),
                ..Raw::default()
            }
        })
        .collect()
}

fn payload_bytes(records: &[Raw]) -> u64 {
    records
        .iter()
        .map(|r| r.payload.as_ref().map_or(0, Vec::len) as u64)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefetch_stays_within_one_budget_over_all_partitions() {
    let f = Fixture::new("prefetch", PARTITIONS).await;
    let producer = batching_producer("5", BATCH_BYTES);
    // About 330 bytes each.
    let records = placements("pf", "pf-none", EVENTS, 120);
    let backlog = payload_bytes(&records);
    for chunk in records.chunks(5_000) {
        kafka::produce_raw_with(&producer, &f.topics.input, chunk).await;
    }

    let addr = service::free_local_addr();
    let budget = BUDGET_KIB.to_string();
    let env = f.env(&[
        ("http.listen", addr.as_str()),
        ("kafka.prefetch_budget_kib", budget.as_str()),
        ("kafka.consumer.statistics.interval.ms", "200"),
        ("pipeline.max_in_flight", "1"),
        ("pipeline.max_in_flight_per_partition", "1"),
    ]);
    let mut child = service::spawn(&env, &["run"]);
    let mut seen: Vec<f64> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // Samples over 15 s once the first statistics are in.
    let mut until: Option<Instant> = None;
    while until.is_none_or(|u| Instant::now() < u) {
        child.assert_running();
        assert!(
            Instant::now() < deadline,
            "no prefetch statistics after 60 s; log:\n{}",
            child.log_tail(30)
        );
        if let Some((200, body)) = service::http_get(&addr, "/metrics").await {
            if let Some(v) = metric(&body, "deductor_prefetch_bytes") {
                if v > 0.0 {
                    until.get_or_insert_with(|| Instant::now() + Duration::from_secs(15));
                    seen.push(v);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = child.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "exit {status}; log:\n{}",
        child.log_tail(30)
    );
    f.cleanup().await;

    let max = seen.iter().copied().fold(0.0, f64::max);
    let bound = (BUDGET_KIB * 1024 + PARTITIONS as u64 * BATCH_BYTES) as f64;
    // The run engaged the budget: the queues were well filled (else the
    // bound proves nothing) and the backlog was far larger than the bound.
    assert!(backlog as f64 > 4.0 * bound, "backlog {backlog} B");
    assert!(
        max > bound / 4.0,
        "the prefetch never filled ({max} B at most in {} samples): the test proves nothing",
        seen.len()
    );
    assert!(
        max <= bound,
        "the prefetch reached {max} B, over the budget of {BUDGET_KIB} KiB plus one {BATCH_BYTES}-byte \
         batch per partition ({bound} B); samples: {seen:?}"
    );
}

const TURN_PARTITIONS: i32 = 16;
const TURN_EVENTS: usize = 24_000;
const TURN_BUDGET_KIB: u64 = 2048;
/// librdkafka's largest `batch.size`, and a broker's default
/// `message.max.bytes`: the largest batch a partition can be handed.
const LARGE_BATCH: u64 = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_producer_batches_take_fetch_turns_within_the_budget() {
    let f = Fixture::new("prefetch-turns", TURN_PARTITIONS).await;
    let producer = batching_producer("1000", LARGE_BATCH);
    let records = placements("pt", "pt-none", TURN_EVENTS, 700);
    let backlog = payload_bytes(&records);
    kafka::produce_raw_with(&producer, &f.topics.input, &records).await;

    let addr = service::free_local_addr();
    let budget = TURN_BUDGET_KIB.to_string();
    let mut env = f.env(&[
        ("http.listen", addr.as_str()),
        ("kafka.prefetch_budget_kib", budget.as_str()),
        ("pipeline.max_in_flight", "8"),
        ("pipeline.max_in_flight_per_partition", "8"),
    ]);
    env.push((
        "RUST_LOG".into(),
        "info,deductor::pipeline::routing=debug".into(),
    ));
    let mut child = service::spawn(&env, &["run"]);
    let ends = kafka::end_offsets(&f.topics.input).await;
    let (mut prefetched, mut waiting, mut pauses, mut dropped) = (Vec::new(), 0.0f64, 0.0, 0.0);
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut last_check = Instant::now();
    loop {
        if let Some((200, body)) = service::http_get(&addr, "/metrics").await {
            if let Some(v) = metric(&body, "deductor_prefetch_bytes") {
                prefetched.push(v);
            }
            waiting =
                waiting.max(metric(&body, "deductor_prefetch_waiting_partitions").unwrap_or(0.0));
            pauses = metric(&body, "deductor_prefetch_pauses_total").unwrap_or(pauses);
            dropped = metric(&body, "deductor_prefetch_dropped_bytes_total").unwrap_or(dropped);
        }
        if last_check.elapsed() > Duration::from_secs(1) {
            last_check = Instant::now();
            child.assert_running();
            let c = kafka::committed(&f.topics.group, &f.topics.input, TURN_PARTITIONS).await;
            if kafka::committed_to(&ends, &c) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the backlog was not committed within 240 s: committed {c:?}, ends {ends:?}; log:\n{}",
                child.log_tail(60)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (outcomes, dead) = service::finish_child(&f, child, Duration::from_secs(30)).await;
    f.cleanup().await;

    // Every event has exactly one outcome: pausing drops only what
    // librdkafka fetches again.
    let by_event = kafka::by_field(&outcomes, "event_id");
    assert!(dead.is_empty(), "{} dead letters", dead.len());
    assert_eq!(by_event.len(), TURN_EVENTS, "events with an outcome");
    assert_eq!(outcomes.len(), TURN_EVENTS, "outcomes");

    let max = prefetched.iter().copied().fold(0.0, f64::max);
    let budget_bytes = (TURN_BUDGET_KIB * 1024) as f64;
    let bound = budget_bytes + LARGE_BATCH as f64;
    eprintln!(
        "fetch turns: backlog {backlog} B, read-ahead at most {max} B over {} samples, \
         at most {waiting} partitions waiting, {pauses} pauses dropped {dropped} B ({:.3} of the backlog)",
        prefetched.len(),
        dropped / backlog as f64
    );
    // Without turns each of the 16 partitions held one batch of about 1 MB.
    assert!(
        TURN_PARTITIONS as f64 * LARGE_BATCH as f64 > 4.0 * bound,
        "the floor this test shows"
    );
    assert!(
        waiting > 0.0 && pauses > 0.0,
        "the budget never paused a partition"
    );
    assert!(
        max > budget_bytes / 4.0,
        "the prefetch never filled ({max} B at most): the test proves nothing"
    );
    assert!(
        max <= bound,
        "the read-ahead reached {max} B, over the budget of {TURN_BUDGET_KIB} KiB plus one batch \
         ({bound} B); samples: {prefetched:?}"
    );
}
