//! Shutdown under every fault (issue 23 defect 5): SIGTERM while the broker
//! is down, while Redis is down and while Redis is frozen (SIGSTOP), in both
//! delivery modes. `deductor run` must exit within `drain_timeout_secs`
//! plus the documented bound (docs/operations.md, "Shutdown"): 0, or 1 with
//! a line saying that unfinished work was abandoned; and the next start must
//! lose nothing (every event decided once, the group committed to the end).
//!
//! The broker outages take the shared Kafka down: they hold the stack
//! exclusively, like `service::outages`. The Redis outages and stalls kill
//! or freeze a Redis of the test's own ([`OwnRedis`]) beside the others.

use std::time::{Duration, Instant};

use super::outages::{self, Down};
use crate::common::own_redis::OwnRedis;
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

/// What a run holds for its fault: the whole stack (the broker outage;
/// its `Down` once the broker is killed), or a Redis of its own.
enum Held {
    Stack(crate::common::Exclusive, Option<Down>),
    Own(OwnRedis),
}

async fn sigterm_during(fault: Fault, mode: &str, seed: u64) {
    let label = format!("sigterm-{fault:?}-{mode}").to_lowercase();
    let mut held = match fault {
        Fault::BrokerDown => Held::Stack(crate::common::stack_exclusive().await, None),
        Fault::RedisDown | Fault::RedisFrozen => Held::Own(OwnRedis::start().await),
    };
    let f = match &held {
        Held::Stack(exclusive, _) => outages::within(exclusive, &label).await,
        Held::Own(own) => outages::on_own_redis(own, &label).await,
    };
    let (f, w, ledger) = outages::seeded(f, &label, seed).await;
    let env = f.env(&[
        ("kafka.delivery", mode),
        ("pipeline.drain_timeout_secs", &DRAIN_SECS.to_string()),
        ("kafka.transaction_interval_ms", "500"),
        ("kafka.produce_timeout_ms", "5000"),
        ("redis.command_timeout_ms", "2000"),
    ]);
    let (mut child, producer) = outages::run_paced(&env, &f, &w, 50).await;

    match &mut held {
        Held::Stack(_, down) => {
            let addr = outages::host_port(&f.brokers);
            *down = Some(Down::new("kill-kafka", "start-kafka", &addr).await);
        }
        Held::Own(own) if matches!(fault, Fault::RedisFrozen) => own.freeze(),
        Held::Own(own) => own.kill().await,
    }
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
    match &mut held {
        Held::Stack(_, down) => {
            if let Some(down) = down {
                down.start();
            }
        }
        Held::Own(own) if matches!(fault, Fault::RedisFrozen) => own.thaw(),
        Held::Own(own) => own.restart().await,
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
    drop(held);
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
