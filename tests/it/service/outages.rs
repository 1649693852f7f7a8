//! Outages of the shared services while the service works: Redis killed
//! (SIGKILL) and restarted with its data (AOF, fsync always), the Kafka
//! broker killed and restarted. The service must wait them out by itself:
//! nothing lost, nothing skipped, one decision per event.
//!
//! The Kafka outages stop the broker every other test uses, so those tests
//! hold the stack exclusively ([`crate::common::stack_exclusive`]): no other
//! test runs meanwhile. The Redis outages kill and restart a Redis of the
//! test's own ([`OwnRedis`]) and hold the stack shared, beside the others.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::kafka;
use crate::common::own_redis::OwnRedis;
use crate::common::service::{self, Fixture, InProcess};
use crate::common::workload::{self, Shape, Workload};

const WAIT: Duration = Duration::from_secs(180);

pub(super) fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest).to_owned()
}

async fn wait_done_events(svc: &InProcess, n: u64) {
    let deadline = Instant::now() + WAIT;
    while svc.status.events_done.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "fewer than {n} events done");
        assert!(!svc.is_finished(), "the service stopped by itself");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A stopped service of the dev stack, started again when dropped (also
/// when the test fails, so the other tests get their service back).
pub(super) struct Down {
    start_verb: &'static str,
    started: bool,
}

impl Down {
    /// Runs `kill_verb` and waits until nothing answers at `addr`.
    pub(super) async fn new(kill_verb: &'static str, start_verb: &'static str, addr: &str) -> Down {
        let down = Down {
            start_verb,
            started: false,
        };
        service::dev_stack(kill_verb);
        service::wait_closed(addr, &format!("`dev-stack {kill_verb}`")).await;
        down
    }

    pub(super) fn start(&mut self) {
        self.started = true;
        service::dev_stack(self.start_verb);
    }
}

impl Drop for Down {
    fn drop(&mut self) {
        if !self.started {
            // No panic here: this may run while a failed test unwinds.
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/dev-stack");
            let _ = std::process::Command::new(script)
                .arg(self.start_verb)
                .status();
        }
    }
}

struct Run {
    f: Fixture,
    w: Workload,
    ledger: deductor::ledger::Ledger,
    svc: InProcess,
    producer: tokio::task::JoinHandle<()>,
}

/// The outage tests' fixture (3 partitions) on the dev stack, which the
/// test holds exclusively.
pub(super) async fn within(exclusive: &crate::common::Exclusive, label: &str) -> Fixture {
    Fixture::within(exclusive, label, 3).await
}

/// The outage tests' fixture (3 partitions) on the dev stack's Kafka and
/// the test's own Redis.
pub(super) async fn on_own_redis(own: &OwnRedis, label: &str) -> Fixture {
    Fixture::on_redis(label, 3, own.url()).await
}

/// `f` with the outage tests' workload seeded.
pub(super) async fn seeded(
    f: Fixture,
    label: &str,
    seed: u64,
) -> (Fixture, Workload, deductor::ledger::Ledger) {
    let ledger = f.ledger().await;
    let w = workload::generate(
        label,
        &Shape {
            orders: 1500,
            customers: 400,
            stock: 120,
            seed,
            ..Shape::default()
        },
    );
    w.seed(&f, &ledger).await;
    (f, w, ledger)
}

/// Produces `w` to the input topic, 50 records every 150 ms.
pub(super) fn produce_paced(f: &Fixture, w: &Workload) -> tokio::task::JoinHandle<()> {
    let (topic, stream) = (f.topics.input.clone(), w.clone());
    tokio::spawn(async move {
        stream
            .produce_paced(topic, 50, Duration::from_millis(150))
            .await
    })
}

/// Spawns `deductor run` with `env`, starts a paced producer once the
/// service holds its partitions, and waits until `outcomes` outcomes are
/// readable (a first transaction committed, in exactly_once).
pub(super) async fn run_paced(
    env: &[(String, String)],
    f: &Fixture,
    w: &Workload,
    outcomes: usize,
) -> (service::ChildService, tokio::task::JoinHandle<()>) {
    let mut child = service::spawn(env, &["run"]);
    child
        .wait_for_log("partitions assigned", Duration::from_secs(60))
        .await;
    let producer = produce_paced(f, w);
    kafka::read_until(&f.topics.outcome, Duration::from_secs(60), |r| {
        r.len() >= outcomes
    })
    .await;
    (child, producer)
}

/// Seeds, starts the service and a paced producer, waits for some progress.
async fn start(f: Fixture, label: &str, seed: u64) -> Run {
    let (f, w, ledger) = seeded(f, label, seed).await;
    let svc = service::start(f.settings(&[]));
    let producer = produce_paced(&f, &w);
    wait_done_events(&svc, 200).await;
    Run {
        f,
        w,
        ledger,
        svc,
        producer,
    }
}

/// Waits for every outcome with the same service instance (it was never
/// restarted), stops it, and checks the run.
async fn finish(label: &str, mut r: Run) {
    r.producer.await.unwrap();
    r.svc.assert_running().await;
    r.w.wait_done(&r.f, WAIT).await;
    kafka::wait_committed_to_end(&r.f.topics.group, &r.f.topics.input, 3, WAIT).await;
    let (result, _) = r.svc.stop(Duration::from_secs(30)).await;
    result.expect("run returns Ok after the outage");
    let outcomes = kafka::read_all(&r.f.topics.outcome).await;
    let dlq = kafka::read_all(&r.f.topics.dlq).await;
    workload::verify(label, &r.w, &outcomes, &dlq, &r.ledger).await;
    r.ledger.quit().await;
    r.f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_mid_stream() {
    let mut own = OwnRedis::start().await;
    let r = start(on_own_redis(&own, "redis-out").await, "redis-out", 31).await;

    own.kill().await;
    let down_at = r.svc.status.events_done.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !r.svc.is_finished(),
        "the service gave up during the Redis outage"
    );
    own.restart().await;

    // It resumes by itself.
    wait_done_events(&r.svc, down_at + 200).await;
    finish("redis outage", r).await;
}

/// `exactly_once`, and a Redis outage longer than the transaction timeout.
/// The events it catches hold the open transaction (a boundary waits for
/// every started event), so the broker aborts that transaction when it
/// times out and bumps the producer's epoch: the producer's next
/// transactional call fails with a fatal error ("fenced"; librdkafka: the
/// instance cannot be used again). The service must go on by itself with a
/// new producer, from the committed offsets: it never exits, nothing is
/// lost, and a read_committed reader sees one outcome per input record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_redis_outage_longer_than_the_transaction_timeout() {
    let mut own = OwnRedis::start().await;
    let f = on_own_redis(&own, "eos-redis-out").await;
    let (f, w, ledger) = seeded(f, "eos-redis-out", 41).await;
    // Transactions of 2 s that time out after 6 s; the broker looks for
    // timed-out ones every 10 s
    // (transaction.abort.timed.out.transaction.cleanup.interval.ms), so an
    // outage of 6 + 10 s and a margin outlives the open one for sure. The
    // outage starts while events flow: the transaction open then holds
    // outcomes (the kill would have to fall in the first milliseconds
    // after a commit to meet an empty one).
    let env = f.env(&[
        ("kafka.delivery", "exactly_once"),
        ("kafka.transaction_interval_ms", "2000"),
        ("kafka.producer.transaction.timeout.ms", "6000"),
        ("kafka.produce_timeout_ms", "5000"),
    ]);
    // A first transaction committed (its outcomes are readable), and the
    // events keep coming.
    let (mut child, producer) = run_paced(&env, &f, &w, 1).await;
    tokio::time::sleep(Duration::from_millis(700)).await;

    own.kill().await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    child.assert_running();
    own.restart().await;

    // The first boundary after the outage meets the fenced producer and
    // replaces it (a service that stops instead fails here, with its log).
    child
        .wait_for_log("kafka producer replaced", Duration::from_secs(60))
        .await;
    producer.await.unwrap();
    w.wait_done(&f, WAIT).await;
    let (outcomes, dlq) = service::finish_child(&f, child, WAIT).await;
    let figures = workload::verify("exactly_once redis outage", &w, &outcomes, &dlq, &ledger).await;
    assert_eq!(
        figures.duplicate_outcomes, 0,
        "a read_committed reader sees one outcome per input record"
    );
    ledger.quit().await;
    f.cleanup().await;
}

/// A dependency down at start is waited out, and the probes say so: the
/// HTTP server is up before anything else, `/healthz` is 200 however long
/// the wait (past `http.stall_timeout_secs`: a liveness probe must not
/// restart a pod that waits), `/readyz` is 503 naming the dependency.
/// When the dependency is back, the service proceeds and becomes ready.
/// Redis: the test's own server, killed before the service starts; Kafka:
/// the dev stack's broker, so the test holds the stack exclusively.
async fn probes_while_down_at_start(label: &str, dependency: &str, extra: &[(&str, &str)]) {
    enum Outage {
        Own(OwnRedis),
        Shared(crate::common::Exclusive, Down),
    }
    let (f, mut outage, down_addr) = if dependency == "redis" {
        let mut own = OwnRedis::start().await;
        let f = Fixture::on_redis(label, 2, own.url()).await;
        own.kill().await;
        let addr = own.addr();
        (f, Outage::Own(own), addr)
    } else {
        let exclusive = crate::common::stack_exclusive().await;
        let f = Fixture::within(&exclusive, label, 2).await;
        let addr = f.brokers.split(',').next().unwrap_or_default().to_owned();
        let down = Down::new("kill-kafka", "start-kafka", &addr).await;
        (f, Outage::Shared(exclusive, down), addr)
    };
    let addr = service::free_local_addr();
    let mut settings = vec![
        ("http.listen", addr.as_str()),
        ("http.stall_timeout_secs", "1"),
    ];
    settings.extend_from_slice(extra);
    let env = f.env(&settings);
    let mut child = service::spawn(&env, &["run"]);

    let waiting = format!("waiting for {dependency}");
    let (_, body) = service::wait_probe(&mut child, &addr, "/readyz", WAIT, |code, body| {
        code == 503 && body.contains(&waiting)
    })
    .await;
    assert!(body.contains(dependency), "/readyz: {body}");
    // Well past the stall timeout, the wait is still alive.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (code, body) = service::http_get(&addr, "/healthz")
        .await
        .expect("GET /healthz");
    assert_eq!(code, 200, "/healthz while waiting: {body}");
    assert!(body.contains(&waiting), "/healthz: {body}");
    let (code, body) = service::http_get(&addr, "/readyz")
        .await
        .expect("GET /readyz");
    assert_eq!(code, 503, "/readyz while waiting: {body}");
    assert!(
        body.contains(dependency),
        "/readyz names {dependency}: {body}"
    );

    match &mut outage {
        Outage::Own(own) => own.restart().await,
        Outage::Shared(_, down) => down.start(),
    }
    assert!(service::listening(&down_addr), "{down_addr} is back");
    let (_, body) =
        service::wait_probe(&mut child, &addr, "/readyz", WAIT, |code, _| code == 200).await;
    assert!(body.contains("ready"), "{body}");
    let (code, body) = service::http_get(&addr, "/healthz")
        .await
        .expect("GET /healthz");
    assert_eq!(code, 200, "/healthz once running: {body}");
    let status = child.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit after SIGTERM: {status}");
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_at_start_is_alive_not_ready_then_proceeds() {
    probes_while_down_at_start("redis-down-start", "redis", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_with_kafka_down_at_start_is_alive_not_ready_then_proceeds() {
    probes_while_down_at_start(
        "kafka-down-start",
        "kafka",
        &[
            ("kafka.delivery", "exactly_once"),
            ("kafka.produce_timeout_ms", "5000"),
        ],
    )
    .await;
}
