//! Liveness that sees a wedged Redis client (issue 25, item 3): the pool's
//! calls keep timing out while Redis answers a new connection's `PING`.
//! That is not an outage, and waiting does not end it. The service must
//! reconnect its pool, and when that does not help within the bound, fail
//! `/healthz` so that Kubernetes restarts the pod, while `/readyz` says
//! which it is. When the calls answer again, `/healthz` is 200 again and
//! every event is decided once.
//!
//! The wedge: a proxy in front of a Redis of the test's own holds every
//! connection's bytes from its first script call on (new connections too),
//! so a fresh connection's handshake and `PING` answer and every script
//! call times out, also after the pool reconnects. Before the watchdog,
//! `/healthz` stayed 200 however long this lasted.

use std::time::{Duration, Instant};

use crate::common::replication::{cli, eventually, free_port, redis};
use crate::common::{kafka, service};
use deductor::admin::PromoSpec;
use deductor_testkit::wedge_proxy::WedgeProxy;
use serde_json::json;

const AT: &str = "2026-11-29T10:00:00Z";

fn placed(n: usize) -> serde_json::Value {
    json!({"type": "OrderPlaced", "event_id": format!("e{n}"), "order_id": format!("o{n}"),
        "customer_id": "c1", "occurred_at": AT,
        "lines": [{"promotion_id": "flash", "budget": 1, "stock": 1}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_client_is_reconnected_then_fails_liveness_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let node = redis(dir.path(), free_port(), &[]);
    let port = node.port;
    eventually(20, "redis answers", || {
        cli(port, &["PING"]).ends_with("PONG")
    })
    .await;
    let proxy = WedgeProxy::start(port).await.expect("wedge proxy");
    let mut f = service::Fixture::new("wedged-client", 1).await;
    f.redis_url = format!("redis://127.0.0.1:{}", proxy.port);
    let ledger = f.ledger().await;
    let spec = PromoSpec {
        budget: Some(1000),
        stock: Some(100),
        ..PromoSpec::default()
    };
    f.promo(&ledger, "flash", spec).await;
    let key = ledger
        .keys()
        .promotion(&deductor::domain::event::Id::parse("flash").expect("id"));
    ledger.quit().await;
    let http = service::free_local_addr();
    let env = f.env(&[
        ("http.listen", http.as_str()),
        // The liveness bound after a reconnection is this, when shorter
        // than 60 s (src/ledger/wedge.rs).
        ("http.stall_timeout_secs", "10"),
        ("redis.command_timeout_ms", "500"),
        ("retry.initial_interval_ms", "100"),
        ("retry.max_interval_ms", "500"),
    ]);
    let mut svc = service::spawn(&env, &["run"]);
    kafka::produce_events(&f.topics.input, &[placed(1)]).await;
    kafka::read_n(&f.topics.outcome, 1, Duration::from_secs(60)).await;
    service::wait_probe(
        &mut svc,
        &http,
        "/healthz",
        Duration::from_secs(10),
        |c, _| c == 200,
    )
    .await;

    // The wedge: the next event's calls time out; a new connection answers.
    proxy.wedge_scripts();
    let wedged_at = Instant::now();
    kafka::produce_events(&f.topics.input, &[placed(2)]).await;
    let (_, ready) = service::wait_probe(
        &mut svc,
        &http,
        "/readyz",
        Duration::from_secs(30),
        |c, b| c == 503 && b.contains("wedged client"),
    )
    .await;
    assert!(ready.contains("redis"), "{ready}");
    let (_, why) = service::wait_probe(
        &mut svc,
        &http,
        "/healthz",
        Duration::from_secs(60),
        |c, _| c == 503,
    )
    .await;
    assert!(why.contains("wedged"), "{why}");
    let took = wedged_at.elapsed();
    // Suspected after 5 s, reconnected, then 10 s more: never at once.
    assert!(
        took >= Duration::from_secs(10),
        "/healthz failed after only {took:?}"
    );
    let (_, metrics) = service::wait_probe(
        &mut svc,
        &http,
        "/metrics",
        Duration::from_secs(5),
        |c, _| c == 200,
    )
    .await;
    let reconnects: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("deductor_redis_pool_reconnects_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(
        reconnects >= 1.0,
        "the pool was reconnected before liveness failed:\n{metrics}"
    );
    assert_eq!(
        kafka::read_all(&f.topics.outcome).await.len(),
        1,
        "no outcome while every call timed out"
    );

    // The calls answer again: alive, and the event decided once.
    proxy.flow();
    service::wait_probe(
        &mut svc,
        &http,
        "/healthz",
        Duration::from_secs(60),
        |c, _| c == 200,
    )
    .await;
    let outcomes =
        kafka::read_until(&f.topics.outcome, Duration::from_secs(60), |r| r.len() >= 2).await;
    let (_, dlq) = service::finish_child(&f, svc, Duration::from_secs(30)).await;
    assert!(dlq.is_empty());
    let events: Vec<String> = outcomes
        .iter()
        .map(|r| {
            let o = r.json();
            format!(
                "{} {}",
                o["event_id"].as_str().unwrap_or("?"),
                o["type"].as_str().unwrap_or("?")
            )
        })
        .collect();
    assert_eq!(events, ["e1 DeductAccepted", "e2 DeductAccepted"]);
    assert_eq!(cli(port, &["HGET", &key, "stock"]), "98", "two deductions");
    drop(node);
}
