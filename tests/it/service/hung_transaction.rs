//! exactly_once: a transaction call that never returns (docs/reliability.md
//! finding 7; librdkafka #5456, #5511: its transaction calls can ignore
//! their timeout when the coordinator goes away).
//!
//! The broker of the dev stack is restarted advertising a proxy
//! (testkit's `kafka_wedge`) as its PLAINTEXT listener. Once armed, the
//! proxy wedges the service's transactional producer at its next boundary:
//! every connection that carries a transactional request of that producer
//! (its id, at its epoch or an older one) holds every byte for good, so its
//! `send_offsets_to_transaction`, its abort and any epoch bump of its own
//! never get an answer, however often librdkafka reconnects; every other
//! client, and a new producer under the same `transactional.id` (a higher
//! epoch), flow. The service must renew its producer (the new one's
//! `init_transactions` fences the wedged one and aborts its transaction),
//! keep deciding events without exiting, and in the end every event has
//! one outcome as a read_committed reader sees it, with the group committed
//! to the end. Before the renewal, the boundary waited for the wedged
//! producer without end and the service exited 1 after
//! `2 x transaction.timeout.ms + 30 s`.
//!
//! It restarts the shared broker: it holds the stack exclusively.

use std::time::{Duration, Instant};

use deductor_testkit::kafka_wedge::KafkaWedge;

use super::outages;
use crate::common::kafka;
use crate::common::service;
use crate::common::workload;

const WAIT: Duration = Duration::from_secs(240);
const TXN_SECS: u64 = 10;

/// The dev stack's broker restarted with its PLAINTEXT listener advertised
/// on `port`; restarted as before when dropped (also when the test fails).
struct Readvertised;

impl Readvertised {
    fn new(port: u16) -> Readvertised {
        restart_broker(Some(port));
        Readvertised
    }
}

impl Drop for Readvertised {
    fn drop(&mut self) {
        restart_broker(None);
    }
}

fn restart_broker(advertised: Option<u16>) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/dev-stack");
    let run = |verb: &str| {
        let mut c = std::process::Command::new(script);
        c.arg(verb);
        match advertised {
            Some(p) => c.env("DEDUCTOR_KAFKA_ADVERTISED_PORT", p.to_string()),
            None => c.env_remove("DEDUCTOR_KAFKA_ADVERTISED_PORT"),
        };
        c.output()
    };
    let _ = run("kill-kafka");
    let out = run("start-kafka");
    // No panic while unwinding (the drop of a failed test).
    if !std::thread::panicking() {
        let out = out.expect("running scripts/dev-stack start-kafka");
        assert!(
            out.status.success(),
            "scripts/dev-stack start-kafka failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_call_that_never_returns_renews_the_producer_and_the_service_goes_on() {
    let exclusive = crate::common::stack_exclusive().await;
    let label = "hung-transaction-call";
    let brokers = kafka::brokers();
    let port: u16 = outages::host_port(brokers.split(',').next().unwrap_or(&brokers))
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("the broker's port in DEDUCTOR_KAFKA_BROKERS");
    let wedge = KafkaWedge::start(port)
        .await
        .expect("the kafka wedge proxy");
    let readvertised = Readvertised::new(wedge.port);

    let f = outages::within(&exclusive, label).await;
    let (f, w, ledger) = outages::seeded(f, label, 61).await;
    let env = f.env(&[
        ("kafka.delivery", "exactly_once"),
        ("kafka.transaction_interval_ms", "500"),
        (
            "kafka.producer.transaction.timeout.ms",
            &(TXN_SECS * 1000).to_string(),
        ),
        ("kafka.produce_timeout_ms", "3000"),
    ]);
    let (mut child, producer) = outages::run_paced(&env, &f, &w, 50).await;

    // The next boundary's producer is wedged for good.
    wedge.arm();
    let armed = Instant::now();
    while wedge.victim().is_none() {
        child.assert_running();
        assert!(
            armed.elapsed() < Duration::from_secs(60),
            "{label}: no transactional request through the proxy within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("{label}: producer {:?} wedged", wedge.victim());
    // Renewed before the "has not returned" exit (2 x 10 + 30 s after the
    // boundary started), with no exit in between.
    child
        .wait_for_log(
            "kafka producer replaced",
            Duration::from_secs(2 * TXN_SECS + 60),
        )
        .await;
    eprintln!(
        "{label}: renewed {:?} after the wedge ({} connections wedged)",
        armed.elapsed(),
        wedge.wedged_connections()
    );

    // Everything decided, by the same process: one outcome per event as a
    // read_committed reader sees it, the group committed to the end.
    producer.await.unwrap();
    w.wait_done(&f, WAIT).await;
    let (outcomes, dlq) = service::finish_child(&f, child, WAIT).await;
    let fig = workload::verify(label, &w, &outcomes, &dlq, &ledger).await;
    assert_eq!(
        fig.duplicate_outcomes, 0,
        "{label}: exactly_once publishes one outcome per event: {fig}"
    );
    ledger.quit().await;
    f.cleanup().await;
    drop(readvertised);
}
