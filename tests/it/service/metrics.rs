//! The live HTTP endpoints of a real `deductor run` process: `/readyz` once
//! partitions are assigned, `/healthz`, and `/metrics` after one valid and
//! one invalid event: the main metric families are there and the whole
//! exposition passes `promtool check metrics` (Prometheus's own parser and
//! linter; `scripts/install-deps` installs it from Debian's `prometheus`
//! package). And a partition revoked from an instance no longer shows its
//! old lag there.

use std::time::{Duration, Instant};

use crate::common::kafka;
use crate::common::service::{self, Fixture};
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
    deductor::admin::healthcheck::fetch(&format!("http://{addr}{path}"))
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
                "cannot run {} ({e}): install promtool (scripts/install-deps extracts it from \
                 Debian's prometheus package to /usr/local/bin) or set DEDUCTOR_PROMTOOL",
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
    // The placement line went through deduct_batch.lua (redis.batch_max_lines
    // above 1, the default) or deduct.lua (one call per line).
    assert!(
        metrics.contains(r#"deductor_script_duration_seconds_count{script="deduct_batch"}"#)
            || metrics.contains(r#"deductor_script_duration_seconds_count{script="deduct"}"#),
        "no deduct script timing:\n{metrics}"
    );
    // The labels name the version, the commit of the build and its date.
    let build_info = metrics
        .lines()
        .find(|l| l.starts_with("deductor_build_info{"))
        .unwrap_or_else(|| panic!("no deductor_build_info series:\n{metrics}"));
    let commit = build_info
        .split_once(r#"commit=""#)
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(c, _)| c)
        .unwrap_or_else(|| panic!("no commit label: {build_info}"));
    crate::common::assert_build_commit(commit);
    assert!(
        build_info.contains(&format!(r#"version="{}""#, env!("CARGO_PKG_VERSION")))
            && build_info.contains(r#"build_date="20"#)
            && build_info.ends_with("} 1"),
        "{build_info}"
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

/// The lag gauges of an exposition: partition -> value.
fn lags(exposition: &str) -> std::collections::BTreeMap<i32, f64> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix(r#"deductor_consumer_lag{partition=""#))
        .filter_map(|l| {
            let (p, rest) = l.split_once('"')?;
            let v = rest.rsplit(' ').next()?;
            Some((p.parse().ok()?, v.parse().ok()?))
        })
        .collect()
}

/// A TCP proxy to Redis that can be frozen: while frozen it holds every
/// byte, so each command of a client behind it hangs until its timeout and
/// the events in flight cannot finish (nor their offsets be committed).
struct FreezableProxy {
    addr: String,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl FreezableProxy {
    async fn start(target: String) -> FreezableProxy {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the proxy");
        let addr = listener.local_addr().unwrap().to_string();
        let frozen = Arc::new(AtomicBool::new(false));
        let f = frozen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(Self::pipe(cr, sw, f.clone()));
                tokio::spawn(Self::pipe(sr, cw, f.clone()));
            }
        });
        FreezableProxy { addr, frozen }
    }

    async fn pipe(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            while frozen.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The `host:port` of a `redis://[auth@]host:port[/db]` url.
fn redis_host(url: &str) -> String {
    let rest = url
        .strip_prefix("redis://")
        .unwrap_or_else(|| panic!("this test proxies a redis:// url, not {url}"));
    let host_and_path = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    host_and_path
        .split(['/', '?'])
        .next()
        .unwrap_or(host_and_path)
        .to_owned()
}

/// Issue 10: a partition revoked while it had lag kept its last lag value on
/// the old owner (librdkafka goes on reporting it, stale), which held up the
/// group lag and could page `DeductorStalled` falsely. Instance A holds both
/// partitions with 3 events of lag each that it cannot finish (its Redis is
/// frozen); B joins and takes one partition; A's series of that partition
/// must read 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_partition_lag_reads_zero_on_the_old_owner() {
    let f = Fixture::new("lagrevoke", 2).await;
    let ledger = f.ledger().await;
    f.promo(
        &ledger,
        "lag1",
        PromoSpec {
            budget: Some(1_000),
            stock: Some(100),
            ..PromoSpec::default()
        },
    )
    .await;
    let target = redis_host(&f.redis_url);
    let proxy = FreezableProxy::start(target.clone()).await;
    let proxied_url = f.redis_url.replacen(&target, &proxy.addr, 1);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let env_a = f.env(&[
        ("http.listen", addr.as_str()),
        ("kafka.consumer.statistics.interval.ms", "1000"),
        ("redis.url", proxied_url.as_str()),
        ("redis.command_timeout_ms", "500"),
    ]);
    let mut a = service::spawn(&env_a, &["run"]);

    let event = |n: u32, partition: i32| kafka::Raw {
        key: Some(format!("o-lag-{n}").into_bytes()),
        payload: Some(
            serde_json::to_vec(
                &json!({"type": "OrderPlaced", "event_id": format!("e-lag-{n}"),
                "order_id": format!("o-lag-{n}"), "customer_id": "c-1",
                "occurred_at": "2026-11-29T10:00:00Z",
                "lines": [{"promotion_id": "lag1", "budget": 1, "stock": 1}]}),
            )
            .unwrap(),
        ),
        partition: Some(partition),
        ..kafka::Raw::default()
    };
    // One event per partition, processed and committed: A knows a committed
    // offset on both, so librdkafka can compute their lag.
    kafka::produce_raw(&f.topics.input, &[event(0, 0), event(1, 1)]).await;
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 2, WAIT).await;

    // Redis frozen for A: 3 more events per partition stay in flight.
    proxy.freeze();
    let more: Vec<kafka::Raw> = (2..8).map(|n| event(n, (n % 2) as i32)).collect();
    kafka::produce_raw(&f.topics.input, &more).await;
    let deadline = Instant::now() + WAIT;
    loop {
        a.assert_running();
        let (_, body) = get(&addr, "/metrics").await.expect("GET /metrics");
        let l = lags(&body);
        if l.get(&0) == Some(&3.0) && l.get(&1) == Some(&3.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "lag never 3 on both partitions: {l:?}\n{body}\nlog:\n{}",
            a.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // B joins (with a working Redis) and takes one of the two partitions.
    let mut b = service::spawn(&f.env(&[]), &["run"]);
    let deadline = Instant::now() + WAIT;
    let (held, body) = loop {
        a.assert_running();
        b.assert_running();
        let (_, body) = get(&addr, "/metrics").await.expect("GET /metrics");
        let l = lags(&body);
        let held: Vec<i32> = l
            .iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|(p, _)| *p)
            .collect();
        if body.contains("deductor_assigned_partitions 1") && l.len() == 2 && held.len() == 1 {
            break (held[0], body);
        }
        assert!(
            Instant::now() < deadline,
            "A still reports lag on a partition it no longer holds: {l:?}\n{body}\nA's log:\n{}",
            a.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let revoked = 1 - held;
    assert!(
        body.contains(&format!(
            r#"deductor_consumer_lag{{partition="{revoked}"}} 0"#
        )),
        "{body}"
    );
    // The new owner processes the revoked partition's 3 events.
    let outcomes = kafka::read_n(&f.topics.outcome, 5, WAIT).await;
    assert_eq!(outcomes.len(), 5, "2 before the freeze, 3 by B");

    a.kill();
    let status = b.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "B exit status {status}; log:\n{}",
        b.log_tail(30)
    );
    ledger.quit().await;
    f.cleanup().await;
}

/// The HTTP server starts first, so an http.listen that cannot be bound
/// stops `run` at once with the address in its error, instead of a service
/// that runs without its probes (which the kubelet would then restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_stops_when_http_listen_cannot_be_bound() {
    let f = Fixture::new("listen-taken", 1).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut child = service::spawn(&f.env(&[("http.listen", addr.as_str())]), &["run"]);
    let status = child
        .wait(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("still running; log:\n{}", child.log_tail(30)));
    assert!(!status.success(), "exit status {status}");
    let log = child.log_tail(30);
    assert!(log.contains(&format!("http.listen {addr}")), "{log}");
    drop(taken);
    f.cleanup().await;
}
