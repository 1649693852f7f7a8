//! Shutdown under every fault (issue 23 defect 5): SIGTERM while the broker
//! is down, while Redis is down and while Redis is frozen (SIGSTOP), in both
//! delivery modes. `deductor run` must exit within `drain_timeout_secs`
//! plus the documented bound (docs/operations.md, "Shutdown"): 0, or 1 with
//! a line saying that unfinished work was abandoned; and the next start must
//! lose nothing (every event decided once, the group committed to the end).
//!
//! These take the shared Kafka or Redis down: they hold the stack
//! exclusively, like `service::outages`.

use std::time::{Duration, Instant};

use super::outages::{self, Down};
use crate::common::service::{self};
use crate::common::workload;

/// `pipeline.drain_timeout_secs` of these runs.
const DRAIN_SECS: u64 = 5;
/// The documented bound past the drain timeout (docs/operations.md).
const BOUND_SECS: u64 = 15;
/// Slack for the process's start of the shutdown and its exit.
const SLACK_SECS: u64 = 5;
const WAIT: Duration = Duration::from_secs(240);

#[derive(Debug, Clone, Copy)]
enum Fault {
    BrokerDown,
    RedisDown,
    RedisFrozen,
}

/// Redis of the dev stack frozen with SIGSTOP; SIGCONT when dropped.
struct Frozen(i32);

impl Frozen {
    fn new() -> Frozen {
        let dir = std::env::var("DEDUCTOR_STACK_DIR")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/.stack").to_owned());
        let pidfile = format!("{dir}/redis/redis.pid");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap_or_else(|e| panic!("{pidfile}: {e}"))
            .trim()
            .parse()
            .expect("a pid");
        signal(pid, "-STOP");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(pid: i32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill {sig} {pid}");
}

enum Held {
    Down(Down),
    Frozen(Frozen),
}

async fn sigterm_during(fault: Fault, mode: &str, seed: u64) {
    let exclusive = crate::common::stack_exclusive().await;
    let label = format!("sigterm-{fault:?}-{mode}").to_lowercase();
    let (f, w, ledger) = outages::seeded(&exclusive, &label, seed).await;
    let env = f.env(&[
        ("kafka.delivery", mode),
        ("pipeline.drain_timeout_secs", &DRAIN_SECS.to_string()),
        ("kafka.transaction_interval_ms", "500"),
        ("kafka.produce_timeout_ms", "5000"),
        ("redis.command_timeout_ms", "2000"),
    ]);
    let (mut child, producer) = outages::run_paced(&env, &f, &w, 50).await;

    let held = match fault {
        Fault::BrokerDown => {
            let addr = outages::host_port(&f.brokers);
            Held::Down(Down::new("kill-kafka", "start-kafka", &addr).await)
        }
        Fault::RedisDown => {
            let addr = outages::host_port(&f.redis_url);
            Held::Down(Down::new("kill-redis", "start-redis", &addr).await)
        }
        Fault::RedisFrozen => Held::Frozen(Frozen::new()),
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    child.assert_running();
    let bound = Duration::from_secs(DRAIN_SECS + BOUND_SECS + SLACK_SECS);
    let signalled = Instant::now();
    let status = tokio::task::block_in_place(|| child.terminate(bound));
    let took = signalled.elapsed();
    let log = std::fs::read_to_string(&child.log).unwrap_or_default();
    match status.code() {
        Some(0) => {}
        Some(1) => assert!(
            log.contains("abandoned"),
            "{label}: exit 1 without a line saying what was abandoned; log:\n{}",
            child.log_tail(30)
        ),
        _ => panic!(
            "{label}: exit {status} after {took:?}; log:\n{}",
            child.log_tail(30)
        ),
    }
    eprintln!("{label}: exited {status} {took:?} after SIGTERM");
    match held {
        Held::Down(d) => d.start(),
        Held::Frozen(z) => drop(z),
    }
    drop(child);

    // The next start loses nothing.
    producer.await.unwrap();
    let child = service::spawn(&env, &["run"]);
    w.wait_done(&f, WAIT).await;
    let (outcomes, dlq) = service::finish_child(&f, child, WAIT).await;
    workload::verify(&label, &w, &outcomes, &dlq, &ledger).await;
    ledger.quit().await;
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_broker_outage_at_least_once() {
    sigterm_during(Fault::BrokerDown, "at_least_once", 51).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_broker_outage_exactly_once() {
    sigterm_during(Fault::BrokerDown, "exactly_once", 52).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_redis_outage_at_least_once() {
    sigterm_during(Fault::RedisDown, "at_least_once", 53).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_redis_outage_exactly_once() {
    sigterm_during(Fault::RedisDown, "exactly_once", 54).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_redis_stall_at_least_once() {
    sigterm_during(Fault::RedisFrozen, "at_least_once", 55).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_redis_stall_exactly_once() {
    sigterm_during(Fault::RedisFrozen, "exactly_once", 56).await;
}
