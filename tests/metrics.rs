//! The live HTTP endpoints of a real `deductor run` process: `/readyz` once
//! partitions are assigned, `/healthz`, and `/metrics` after one valid and
//! one invalid event: the main metric families are there and the whole
//! exposition passes `promtool check metrics` (Prometheus's own parser and
//! linter; `.ci/run` installs it from Debian's `prometheus` package).

mod common;

use std::time::{Duration, Instant};

use common::kafka;
use common::service::{self, Fixture};
use deductor::admin::PromoSpec;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// The metric families an operator's dashboards and alerts rely on.
const FAMILIES: [&str; 6] = [
    "deductor_events_total",
    "deductor_dead_letters_total",
    "deductor_script_duration_seconds",
    "deductor_assigned_partitions",
    "deductor_build_info",
    "deductor_consumer_lag",
];

/// `DEDUCTOR_PROMTOOL`, or `promtool` on the PATH.
fn promtool() -> String {
    std::env::var("DEDUCTOR_PROMTOOL").unwrap_or_else(|_| "promtool".to_owned())
}

/// A GET through the service's own HTTP/1.0 client: (status code, body).
async fn get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    deductor::ops::http::fetch(&format!("http://{addr}{path}"))
        .await
        .map(|r| (r.status, r.body))
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// The metric family names declared by `# TYPE` lines.
fn families(exposition: &str) -> Vec<&str> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

/// Runs `promtool check metrics` on `exposition`: (passed, its output).
fn promtool_check(exposition: &str) -> (bool, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}): install promtool (Debian package prometheus; .ci/run \
                 extracts it to /usr/local/bin) or set DEDUCTOR_PROMTOOL",
                promtool()
            )
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_metrics_parse_and_probes_answer() {
    let f = Fixture::new("metrics", 2).await;
    let ledger = f.ledger().await;
    f.promo(
        &ledger,
        "m1",
        PromoSpec {
            budget: Some(1_000),
            stock: Some(10),
            ..PromoSpec::default()
        },
    )
    .await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    // Statistics (consumer lag) every second instead of every 5 s.
    let env = f.env(&[
        ("http.listen", addr.as_str()),
        ("kafka.consumer.statistics.interval.ms", "1000"),
    ]);
    let mut child = service::spawn(&env, &["run"]);

    // Readiness: 200 once partitions are assigned (and Redis answers).
    let deadline = Instant::now() + WAIT;
    loop {
        child.assert_running();
        if let Ok((200, body)) = get(&addr, "/readyz").await {
            assert!(body.contains("ready"), "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz not 200 after {WAIT:?}; log:\n{}",
            child.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, body) = get(&addr, "/healthz").await.expect("GET /healthz");
    assert_eq!(status, 200, "/healthz: {body}");

    // One valid and one invalid event.
    let placed = json!({"type": "OrderPlaced", "event_id": "e-m1", "order_id": "o-m1",
        "customer_id": "c-1", "occurred_at": "2026-11-29T10:00:00Z",
        "lines": [{"promotion_id": "m1", "budget": 100, "stock": 1}]});
    kafka::produce_events(&f.topics.input, &[placed]).await;
    kafka::produce_raw(
        &f.topics.input,
        &[kafka::Raw {
            key: Some(b"o-m2".to_vec()),
            payload: Some(b"not json at all".to_vec()),
            ..kafka::Raw::default()
        }],
    )
    .await;
    kafka::read_n(&f.topics.outcome, 1, WAIT).await;
    kafka::read_n(&f.topics.dlq, 1, WAIT).await;

    // /metrics: wait until the counters of both events and the lag from the
    // statistics callback are in, then check the families and the format.
    let deadline = Instant::now() + WAIT;
    let metrics = loop {
        child.assert_running();
        let (status, body) = get(&addr, "/metrics").await.expect("GET /metrics");
        assert_eq!(status, 200, "/metrics: {body}");
        let complete = body
            .contains(r#"deductor_events_total{type="OrderPlaced",outcome="DeductAccepted"} 1"#)
            && body.contains(r#"deductor_dead_letters_total{kind="not_json"} 1"#)
            && body.contains("deductor_consumer_lag{");
        if complete {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "/metrics incomplete after {WAIT:?}:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let declared = families(&metrics);
    for family in FAMILIES {
        assert!(
            declared.contains(&family),
            "no # TYPE line for {family} in:\n{metrics}"
        );
    }
    assert!(
        metrics.contains(r#"deductor_script_duration_seconds_count{script="deduct"}"#),
        "no deduct script timing:\n{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            r#"deductor_build_info{{version="{}"}} 1"#,
            env!("CARGO_PKG_VERSION")
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("deductor_assigned_partitions 2"),
        "both partitions assigned:\n{metrics}"
    );
    let (ok, report) = promtool_check(&metrics);
    assert!(
        ok,
        "promtool check metrics:\n{report}\n--- exposition:\n{metrics}"
    );

    // SIGTERM: a clean exit.
    let status = child.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        child.log_tail(30)
    );
    ledger.quit().await;
    f.cleanup().await;
}
