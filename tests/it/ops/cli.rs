//! The `deductor` binary as an operator uses it: configuration errors name
//! the key in one line, `promo set/show`, `publish`, `check` and
//! `healthcheck` against the real Kafka and Redis.

use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::kafka;
use crate::common::service::{self, Fixture};

/// Runs `deductor <args>` with exactly `env` (inherited `DEDUCTOR_*` removed).
async fn deductor(env: &[(String, String)], args: &[&str]) -> Output {
    let mut c = service::command(env);
    c.args(args);
    tokio::task::spawn_blocking(move || c.output().expect("running deductor"))
        .await
        .unwrap()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit non-zero with one line on stderr that contains `needle`.
fn assert_one_line_error(o: &Output, needle: &str, what: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "{what}: exits non-zero; stderr: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{what}: one line on stderr: {err:?}"
    );
    assert!(err.contains(needle), "{what}: names {needle:?}: {err}");
}

/// A TCP port nothing listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_errors_name_the_key_in_one_line() {
    let none = env(&[]);
    for cmd in ["check", "run"] {
        let o = deductor(&none, &[cmd, "--set", "redis.pool=3"]).await;
        assert_one_line_error(&o, "redis.pool", &format!("{cmd} --set redis.pool=3"));

        let o = deductor(&env(&[("DEDUCTOR_REDIS_POOL_SIZE", "many")]), &[cmd]).await;
        assert_one_line_error(
            &o,
            "redis.pool_size",
            &format!("{cmd} with DEDUCTOR_REDIS_POOL_SIZE=many"),
        );

        let o = deductor(&none, &[cmd, "--set", "redis.url=http://x"]).await;
        assert_one_line_error(&o, "redis.url", &format!("{cmd} --set redis.url=http://x"));

        let o = deductor(&none, &[cmd, "--set", "pipeline.commit_interval_ms=0"]).await;
        assert_one_line_error(
            &o,
            "pipeline.commit_interval_ms",
            &format!("{cmd} --set pipeline.commit_interval_ms=0"),
        );

        let o = deductor(&none, &[cmd, "--config", "/nonexistent/deductor.toml"]).await;
        assert_one_line_error(
            &o,
            "/nonexistent/deductor.toml",
            &format!("{cmd} --config missing"),
        );
    }
    // Errors are reported before anything is reached: no service is needed.
    let o = deductor(
        &env(&[("DEDUCTOR_KAFKA_BROKERS", "127.0.0.1:1")]),
        &["run", "--set", "kafka.input_topic=bad topic"],
    )
    .await;
    assert_one_line_error(&o, "kafka.input_topic", "run with a bad topic name");
    // A TTL of 16 digits made every deduct fail BADARG at run time; now
    // refused at start (`check` with nothing reachable: the old code failed
    // there too, but not on the key).
    let o = deductor(
        &env(&[
            ("DEDUCTOR_KAFKA_BROKERS", "127.0.0.1:1"),
            ("DEDUCTOR_REDIS_URL", "redis://127.0.0.1:1"),
        ]),
        &["check", "--set", "redis.record_ttl_secs=9999999999999999"],
    )
    .await;
    assert_one_line_error(&o, "redis.record_ttl_secs", "check with a 16-digit TTL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promo_set_refuses_to_overwrite_without_force_and_show_reads_it() {
    // A prefix of its own, whose keys are deleted when the test passes.
    let r = crate::common::redis::standalone().await;
    let e = env(&[
        ("DEDUCTOR_REDIS_URL", &r.url),
        ("DEDUCTOR_REDIS_KEY_PREFIX", &r.prefix),
        ("DEDUCTOR_LOG_LEVEL", "warn"),
    ]);
    let set = [
        "promo",
        "set",
        "flash-1",
        "--budget",
        "1500",
        "--stock",
        "10",
        "--per-customer",
        "1",
    ];
    let o = deductor(&e, &set).await;
    assert!(o.status.success(), "first promo set: {}", stderr(&o));
    assert!(
        stdout(&o).contains("promotion flash-1 created"),
        "{}",
        stdout(&o)
    );

    let o = deductor(&e, &set).await;
    assert_one_line_error(&o, "--force", "promo set of an existing promotion");

    let o = deductor(
        &e,
        &["promo", "set", "flash-1", "--budget", "900", "--force"],
    )
    .await;
    assert!(o.status.success(), "promo set --force: {}", stderr(&o));
    assert!(
        stdout(&o).contains("promotion flash-1 replaced"),
        "{}",
        stdout(&o)
    );

    let o = deductor(&e, &["promo", "show", "flash-1"]).await;
    assert!(o.status.success(), "promo show: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("budget: 900 remaining of 900"), "{out}");
    assert!(
        out.contains("stock: unlimited"),
        "--force replaced the whole promotion: {out}"
    );

    let o = deductor(&e, &["promo", "show", "no-such-promo"]).await;
    assert_one_line_error(&o, "no-such-promo", "promo show of a missing promotion");

    let o = deductor(&e, &["promo", "show", "bad:id"]).await;
    assert_one_line_error(&o, "bad:id", "promo show of an invalid id");
    assert_eq!(
        r.promo_field("flash-1", "budget").await.as_deref(),
        Some("900")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_produces_each_line_keyed_by_order_id() {
    let f = Fixture::new("publish", 3).await;
    let lines = [
        r#"{"type":"OrderPlaced","event_id":"e1","order_id":"o-1","customer_id":"c","occurred_at":"2026-11-29T10:00:00Z","lines":[{"promotion_id":"p"}]}"#,
        r#"{"type":"OrderRefunded","event_id":"e2","order_id":"o-2","customer_id":"c","occurred_at":"2026-11-29T10:00:00Z","lines":[{"promotion_id":"p"}]}"#,
        "not json, sent as it is",
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    std::fs::write(
        &file,
        format!("{}\n\n{}\n{}\n", lines[0], lines[1], lines[2]),
    )
    .unwrap();
    let o = deductor(&f.env(&[]), &["publish", file.to_str().unwrap()]).await;
    assert!(o.status.success(), "publish: {}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("published 3 events to {}", f.topics.input)),
        "{}",
        stdout(&o)
    );

    let got = kafka::read_n(&f.topics.input, 3, Duration::from_secs(30)).await;
    let mut got: Vec<(Option<String>, String)> = got
        .iter()
        .map(|r| {
            (
                r.key_str(),
                String::from_utf8(r.payload.clone().unwrap()).unwrap(),
            )
        })
        .collect();
    got.sort_by(|a, b| a.1.cmp(&b.1));
    let mut want = vec![
        (Some("o-1".to_owned()), lines[0].to_owned()),
        (Some("o-2".to_owned()), lines[1].to_owned()),
        (None, lines[2].to_owned()),
    ];
    want.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(got, want, "each line, unchanged, keyed by its order_id");

    // --topic names another topic.
    let o = deductor(
        &f.env(&[]),
        &["publish", file.to_str().unwrap(), "--topic", &f.topics.dlq],
    )
    .await;
    assert!(o.status.success(), "publish --topic: {}", stderr(&o));
    kafka::read_n(&f.topics.dlq, 3, Duration::from_secs(30)).await;
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_against_the_real_stack_and_fails_without_redis_or_topic() {
    let f = Fixture::new("check", 3).await;
    let o = deductor(&f.env(&[]), &["check"]).await;
    let out = stdout(&o);
    assert!(o.status.success(), "check: {out}{}", stderr(&o));
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.iter().all(|l| l.starts_with("ok ")),
        "every line ok: {out}"
    );
    for name in ["config", "kafka", "redis", "scripts"] {
        assert!(
            lines
                .iter()
                .any(|l| l.split_whitespace().nth(1) == Some(&format!("{name}:"))),
            "a line for {name}: {out}"
        );
    }
    for t in [&f.topics.input, &f.topics.outcome, &f.topics.dlq] {
        assert!(
            out.contains(&format!("{t} (3 partitions)")),
            "topic {t}: {out}"
        );
    }

    let o = deductor(&f.env(&[("redis.url", "redis://127.0.0.1:1")]), &["check"]).await;
    let out = stdout(&o);
    assert!(
        !o.status.success(),
        "check with Redis unreachable exits non-zero: {out}"
    );
    assert!(out.lines().any(|l| l.starts_with("FAIL  redis")), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("ok    kafka")),
        "Kafka still checked: {out}"
    );

    let o = deductor(
        &f.env(&[("kafka.input_topic", "t-no-such-topic-here")]),
        &["check"],
    )
    .await;
    let out = stdout(&o);
    assert!(
        !o.status.success(),
        "check with a missing topic exits non-zero: {out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("FAIL  kafka") && l.contains("t-no-such-topic-here")),
        "{out}"
    );
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_answers_for_a_running_service_and_sigterm_exits_zero() {
    let f = Fixture::new("health", 3).await;
    let port = free_port();
    // A wildcard address, as in the image: the probe asks it on loopback.
    let listen = format!("0.0.0.0:{port}");
    let mut child = service::spawn(&f.env(&[("http.listen", &listen)]), &["run"]);
    let url = format!("http://127.0.0.1:{port}/healthz");
    let probe_env = env(&[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let o = deductor(&probe_env, &["healthcheck", "--url", &url]).await;
        if o.status.success() {
            break;
        }
        child.assert_running();
        assert!(
            Instant::now() < deadline,
            "healthcheck never passed: {}\n{}",
            stderr(&o),
            child.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Without --url: the port of http.listen, from the environment (as the
    // image's HEALTHCHECK sees it) or from a flag.
    let o = deductor(&env(&[("DEDUCTOR_HTTP_LISTEN", &listen)]), &["healthcheck"]).await;
    assert!(
        o.status.success(),
        "healthcheck with DEDUCTOR_HTTP_LISTEN={listen}: {}",
        stderr(&o)
    );
    let flag = format!("http.listen=127.0.0.1:{port}");
    let o = deductor(&probe_env, &["healthcheck", "--set", &flag]).await;
    assert!(
        o.status.success(),
        "healthcheck --set {flag}: {}",
        stderr(&o)
    );
    let o = deductor(&probe_env, &["healthcheck", "--set", "http.listen="]).await;
    assert_one_line_error(&o, "http.listen", "healthcheck with http.listen empty");

    let closed_port = free_port();
    let closed = format!("http://127.0.0.1:{closed_port}/healthz");
    let o = deductor(&probe_env, &["healthcheck", "--url", &closed]).await;
    assert_one_line_error(&o, "127.0.0.1", "healthcheck against a closed port");
    let o = deductor(
        &env(&[("DEDUCTOR_HTTP_LISTEN", &format!("0.0.0.0:{closed_port}"))]),
        &["healthcheck"],
    )
    .await;
    assert_one_line_error(
        &o,
        &format!("127.0.0.1:{closed_port}"),
        "healthcheck of an http.listen nothing serves",
    );

    let status = tokio::task::spawn_blocking(move || child.terminate(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(
        status.success(),
        "deductor run exits 0 on SIGTERM: {status}"
    );
    let o = deductor(&probe_env, &["healthcheck", "--url", &url]).await;
    assert!(
        !o.status.success(),
        "healthcheck fails once the service is gone"
    );
    f.cleanup().await;
}

/// G3 at startup: `run` started while Redis is unreachable waits it out with
/// backoff (instead of exiting) and works once Redis arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_waits_for_redis_at_startup_and_then_works() {
    let mut f = Fixture::new("late-redis", 1).await;
    let port = free_port();
    f.redis_url = format!("redis://127.0.0.1:{port}");
    let mut child = service::spawn(&f.env(&[]), &["run"]);
    child
        .wait_for_log("redis unreachable at startup", Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    child.assert_running();

    let dir = tempfile::tempdir().unwrap();
    let mut redis = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting redis-server");
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !service::listening(&addr) {
        assert!(Instant::now() < deadline, "redis-server did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ledger = f.ledger().await;
    f.promo(
        &ledger,
        "late",
        deductor::admin::PromoSpec {
            stock: Some(5),
            ..Default::default()
        },
    )
    .await;
    let event = serde_json::json!({"type": "OrderPlaced", "event_id": "e-late", "order_id": "o-late",
        "customer_id": "c-1", "occurred_at": "2026-11-29T10:00:00Z",
        "lines": [{"promotion_id": "late", "stock": 1}]});
    kafka::produce_events(&f.topics.input, &[event]).await;
    let out = kafka::read_n(&f.topics.outcome, 1, Duration::from_secs(60)).await;
    assert_eq!(
        out.len(),
        1,
        "one outcome once Redis is up: {}",
        child.log_tail(30)
    );
    assert_eq!(out[0].json()["type"], "DeductAccepted");

    let status = tokio::task::spawn_blocking(move || child.terminate(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(status.success(), "exits 0 on SIGTERM: {status}");
    f.cleanup().await;
    let _ = redis.kill();
    let _ = redis.wait();
}

/// `deductor <args>` under a test Redis's prefix.
async fn admin(r: &crate::common::redis::TestRedis, args: &[&str]) -> Output {
    let e = env(&[
        ("DEDUCTOR_REDIS_URL", &r.url),
        ("DEDUCTOR_REDIS_KEY_PREFIX", &r.prefix),
        ("DEDUCTOR_LOG_LEVEL", "warn"),
    ]);
    deductor(&e, args).await
}

fn json_of(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}{}", stdout(o), stderr(o)))
}

fn assert_exit(o: &Output, code: i32, what: &str) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "{what}: exit code; stdout {} stderr {}",
        stdout(o),
        stderr(o)
    );
}

/// Issue 11: pause, resume, adjust, limit, list and delete change a promotion
/// in place; deductions made in between are kept and `audit` stays clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promo_pause_resume_adjust_limit_list_and_delete_change_it_in_place() {
    use crate::common::redis::{placed, refunded};
    use deductor::domain::decision::{PlaceDecision, Reason};
    let r = crate::common::redis::standalone().await;
    let o = admin(
        &r,
        &[
            "promo",
            "set",
            "flash",
            "--stock",
            "10",
            "--budget",
            "1000",
            "--per-customer",
            "1",
        ],
    )
    .await;
    assert_exit(&o, 0, "promo set");
    let t = 1_800_000_000;
    let accepted = |d: &PlaceDecision| matches!(d, PlaceDecision::Accepted { .. });
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c1", t, &[("flash", 100, 1)]))
        .await
        .unwrap();
    assert!(accepted(&d), "{d:?}");

    // pause / resume: only the status changes.
    assert_exit(&admin(&r, &["promo", "pause", "flash"]).await, 0, "pause");
    let o = admin(&r, &["promo", "show", "flash", "--output", "json"]).await;
    assert_exit(&o, 0, "promo show --output json");
    let v = json_of(&o);
    assert_eq!(v["status"], "paused", "{v}");
    assert_eq!(
        (v["stock"].as_u64(), v["initial_stock"].as_u64()),
        (Some(9), Some(10)),
        "{v}"
    );
    let d = r
        .ledger
        .place(&placed("e2", "o2", "c2", t, &[("flash", 100, 1)]))
        .await
        .unwrap();
    assert!(
        matches!(
            d,
            PlaceDecision::Rejected {
                reason: Reason::PromotionInactive,
                ..
            }
        ),
        "{d:?}"
    );
    let o = admin(&r, &["promo", "pause", "flash"]).await;
    assert_exit(&o, 0, "pause again");
    assert!(stdout(&o).contains("already paused"), "{}", stdout(&o));
    assert_exit(&admin(&r, &["promo", "resume", "flash"]).await, 0, "resume");
    let d = r
        .ledger
        .place(&placed("e3", "o3", "c3", t, &[("flash", 100, 1)]))
        .await
        .unwrap();
    assert!(accepted(&d), "{d:?}");

    // adjust: remaining and initial move together.
    let o = admin(
        &r,
        &[
            "promo", "adjust", "flash", "--stock", "+5", "--budget", "-100",
        ],
    )
    .await;
    assert_exit(&o, 0, "adjust");
    assert_eq!(r.promo_field("flash", "stock").await.as_deref(), Some("13"));
    assert_eq!(
        r.promo_field("flash", "initial_stock").await.as_deref(),
        Some("15")
    );
    assert_eq!(
        r.promo_field("flash", "budget").await.as_deref(),
        Some("700")
    );
    assert_eq!(
        r.promo_field("flash", "initial_budget").await.as_deref(),
        Some("900")
    );
    let o = admin(
        &r,
        &[
            "promo", "adjust", "flash", "--stock", "-14", "--budget", "+1",
        ],
    )
    .await;
    assert_exit(&o, 1, "adjust below zero");
    assert_one_line_error(&o, "below 0", "adjust below zero");
    let o = admin(
        &r,
        &["promo", "adjust", "flash", "--budget", "+999999999999999"],
    )
    .await;
    assert_exit(&o, 1, "adjust above the bound");
    assert_one_line_error(&o, "999999999999999", "adjust above the bound");
    assert_eq!(
        r.promo_field("flash", "stock").await.as_deref(),
        Some("13"),
        "nothing written"
    );
    assert_eq!(
        r.promo_field("flash", "budget").await.as_deref(),
        Some("700"),
        "nothing written"
    );
    assert_exit(
        &admin(&r, &["promo", "adjust", "flash"]).await,
        2,
        "adjust with no delta",
    );

    // limit: set and remove per_customer only.
    assert_exit(
        &admin(&r, &["promo", "limit", "flash", "--per-customer", "none"]).await,
        0,
        "limit none",
    );
    assert_eq!(r.promo_field("flash", "per_customer").await, None);
    assert_exit(
        &admin(&r, &["promo", "limit", "flash", "--per-customer", "3"]).await,
        0,
        "limit 3",
    );
    assert_eq!(
        r.promo_field("flash", "per_customer").await.as_deref(),
        Some("3")
    );
    // Lowering a limit below what customers hold is done, with a note.
    let o = admin(&r, &["promo", "limit", "flash", "--per-customer", "0"]).await;
    assert_exit(&o, 0, "limit 0");
    assert!(
        stdout(&o).contains("2 customer(s) already hold more than 0 counted order(s)"),
        "{}",
        stdout(&o)
    );
    assert_exit(
        &admin(&r, &["promo", "limit", "flash", "--per-customer", "3"]).await,
        0,
        "limit 3 again",
    );
    assert_eq!(r.promo_field("flash", "stock").await.as_deref(), Some("13"));

    let o = admin(&r, &["audit", "flash"]).await;
    assert_exit(&o, 0, "audit after the changes");

    // An unlimited dimension cannot be adjusted.
    assert_exit(
        &admin(&r, &["promo", "set", "open", "--budget", "50"]).await,
        0,
        "promo set open",
    );
    let o = admin(&r, &["promo", "adjust", "open", "--stock", "+1"]).await;
    assert_one_line_error(&o, "unlimited", "adjust an unlimited stock");
    assert_exit(&o, 1, "adjust an unlimited stock");

    // list: pages sorted by id, JSON.
    let o = admin(&r, &["promo", "list", "--output", "json"]).await;
    assert_exit(&o, 0, "promo list");
    let ids: Vec<String> = json_of(&o)
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["promotion_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["flash", "open"]);
    let o = admin(&r, &["promo", "list", "--limit", "1"]).await;
    assert!(stdout(&o).contains("--after flash"), "{}", stdout(&o));
    let o = admin(&r, &["promo", "list", "--after", "flash"]).await;
    let out = stdout(&o);
    assert!(out.starts_with("open  active"), "{out}");
    assert!(!out.contains("flash "), "{out}");

    // delete and set --force refuse while orders hold deductions.
    let o = admin(&r, &["promo", "delete", "flash"]).await;
    assert_one_line_error(&o, "outstanding", "delete with outstanding orders");
    assert_exit(&o, 1, "delete with outstanding orders");
    assert!(stderr(&o).contains("stock 2"), "{}", stderr(&o));
    let o = admin(&r, &["promo", "set", "flash", "--stock", "5", "--force"]).await;
    assert_one_line_error(
        &o,
        "--discard-outstanding",
        "set --force with outstanding orders",
    );
    assert_eq!(
        r.promo_field("flash", "stock").await.as_deref(),
        Some("13"),
        "not replaced"
    );
    for (e, order, c) in [("r1", "o1", "c1"), ("r3", "o3", "c3")] {
        r.ledger
            .refund(&refunded(e, order, c, &[("flash", None, None)]))
            .await
            .unwrap();
    }
    assert_exit(
        &admin(&r, &["audit", "flash"]).await,
        0,
        "audit after refunds",
    );
    assert_exit(
        &admin(&r, &["promo", "delete", "flash"]).await,
        0,
        "delete once refunded",
    );
    assert_eq!(r.promo_field("flash", "stock").await, None);
    let o = admin(&r, &["promo", "delete", "flash"]).await;
    assert_exit(&o, 1, "delete a missing promotion");
    assert_one_line_error(&o, "does not exist", "delete a missing promotion");

    // Without initial_* the records are counted; --force deletes anyway.
    r.seed("legacy", &[("stock", "4")]).await;
    let d = r
        .ledger
        .place(&placed("e9", "o9", "c9", t, &[("legacy", 0, 1)]))
        .await
        .unwrap();
    assert!(accepted(&d), "{d:?}");
    let o = admin(&r, &["promo", "delete", "legacy"]).await;
    assert_one_line_error(&o, "1 order(s) still deducted", "delete a legacy promotion");
    let o = admin(
        &r,
        &[
            "promo",
            "set",
            "legacy",
            "--stock",
            "4",
            "--force",
            "--discard-outstanding",
        ],
    )
    .await;
    assert_exit(&o, 0, "set --force --discard-outstanding");
    assert_exit(
        &admin(&r, &["promo", "delete", "legacy", "--force"]).await,
        0,
        "delete --force",
    );

    // Exit codes: usage 2, unreachable 3.
    assert_exit(
        &admin(&r, &["promo", "pause", "bad:id"]).await,
        2,
        "an invalid id",
    );
    assert_exit(
        &admin(&r, &["promo", "limit", "x", "--per-customer", "many"]).await,
        2,
        "a bad flag",
    );
    let down = env(&[
        ("DEDUCTOR_REDIS_URL", "redis://127.0.0.1:1"),
        ("DEDUCTOR_LOG_LEVEL", "error"),
    ]);
    let o = deductor(&down, &["promo", "show", "flash"]).await;
    assert_exit(&o, 3, "Redis unreachable");
}

/// Issue 11: `check --output json` and its warnings (a first start that
/// would replay records; Redis without AOF and with an evicting policy), and
/// the exit codes of `check` and `audit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_audit_speak_json_warn_and_exit_with_documented_codes() {
    let f = Fixture::new("check-json", 2).await;
    let events: Vec<serde_json::Value> = (0..3)
        .map(|i| {
            serde_json::json!({"type": "OrderPlaced", "event_id": format!("e{i}"),
                "order_id": format!("o{i}"), "customer_id": "c", "occurred_at": "2026-11-29T10:00:00Z",
                "lines": [{"promotion_id": "p"}]})
        })
        .collect();
    kafka::produce_events(&f.topics.input, &events).await;
    let o = deductor(&f.env(&[]), &["check", "--output", "json"]).await;
    assert_exit(&o, 0, "check passes with a warning");
    let v = json_of(&o);
    assert_eq!(v["passed"], true, "{v:#}");
    let checks = v["checks"].as_array().unwrap();
    let offsets = checks
        .iter()
        .find(|c| c["name"] == "offsets")
        .expect("an offsets check");
    assert_eq!(offsets["status"], "warn", "{v:#}");
    let detail = offsets["detail"].as_str().unwrap();
    assert!(detail.contains("replays 3 record(s)"), "{detail}");
    assert!(
        checks
            .iter()
            .any(|c| c["name"] == "durability" && c["status"] == "ok"),
        "the dev stack's Redis is durable: {v:#}"
    );

    // A Redis without AOF and with an evicting policy: a warning, exit 0.
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let mut redis = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--maxmemory-policy", "allkeys-lru"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting redis-server");
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !service::listening(&addr) {
        assert!(Instant::now() < deadline, "redis-server did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let url = format!("redis://{addr}");
    let o = deductor(&f.env(&[("redis.url", &url)]), &["check"]).await;
    let _ = redis.kill();
    let _ = redis.wait();
    assert_exit(&o, 0, "check against a non-durable Redis");
    let out = stdout(&o);
    let line = out
        .lines()
        .find(|l| l.starts_with("WARN  durability"))
        .unwrap_or_else(|| panic!("a durability warning: {out}"));
    assert!(
        line.contains("AOF is off") && line.contains("allkeys-lru"),
        "{line}"
    );

    // Failures: 3 when a dependency cannot be reached, 1 otherwise.
    let o = deductor(&f.env(&[("redis.url", "redis://127.0.0.1:1")]), &["check"]).await;
    assert_exit(&o, 3, "check with Redis unreachable");
    let o = deductor(
        &f.env(&[("kafka.input_topic", "t-no-such-topic-here")]),
        &["check"],
    )
    .await;
    assert_exit(&o, 1, "check with a missing topic");
    let o = deductor(&f.env(&[]), &["check", "--output", "yaml"]).await;
    assert_exit(&o, 2, "an unknown output format");

    // audit --output json: a breach exits 1 and is named.
    let r = crate::common::redis::standalone().await;
    r.seed(
        "leaky",
        &[
            ("stock", "5"),
            ("initial_stock", "10"),
            ("status", "active"),
        ],
    )
    .await;
    assert_exit(
        &admin(&r, &["promo", "set", "tidy", "--stock", "3"]).await,
        0,
        "promo set",
    );
    let o = admin(&r, &["audit", "--output", "json"]).await;
    assert_exit(&o, 1, "audit finds the breach");
    let v = json_of(&o);
    assert_eq!(v["clean"], false, "{v:#}");
    assert_eq!(v["audited"], 2, "{v:#}");
    let leaky = &v["promotions"][0];
    assert_eq!(leaky["promotion_id"], "leaky", "{v:#}");
    assert_eq!(leaky["breaches"].as_array().unwrap().len(), 1, "{v:#}");
    assert_eq!(
        v["promotions"][1]["breaches"],
        serde_json::json!([]),
        "{v:#}"
    );
    let o = admin(&r, &["audit", "tidy", "--output", "json"]).await;
    assert_exit(&o, 0, "audit of a clean promotion");
    assert_eq!(json_of(&o)["clean"], true);
    f.cleanup().await;
}

/// Issue 11: support staff answer "why was order O rejected?" with `order
/// show` and `event show`, in words and in JSON, with or without
/// `--promotion`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_and_event_show_print_records_memos_and_refund_results() {
    use crate::common::redis::{placed, refunded};
    let r = crate::common::redis::standalone().await;
    for (p, budget) in [("p1", "1000"), ("p2", "1000"), ("tight", "10")] {
        let o = admin(
            &r,
            &["promo", "set", p, "--budget", budget, "--stock", "10"],
        )
        .await;
        assert_exit(&o, 0, "promo set");
    }
    let t = 1_800_000_000;
    r.ledger
        .place(&placed(
            "e1",
            "o1",
            "c1",
            t,
            &[("p1", 100, 1), ("p2", 50, 2)],
        ))
        .await
        .unwrap();
    r.ledger
        .refund(&refunded("r1", "o1", "c1", &[("p1", Some(40), Some(0))]))
        .await
        .unwrap();
    // Rejected on its second line: the first line is released.
    r.ledger
        .place(&placed(
            "e2",
            "o2",
            "c2",
            t,
            &[("p1", 5, 1), ("tight", 500, 1)],
        ))
        .await
        .unwrap();

    let o = admin(&r, &["order", "show", "o1"]).await;
    assert_exit(&o, 0, "order show");
    let out = stdout(&o);
    assert!(out.contains("p1: deducted by event e1"), "{out}");
    assert!(
        out.contains("holds budget 60 of 100, stock 1 of 1"),
        "{out}"
    );
    assert!(out.contains("p2: deducted by event e1"), "{out}");
    let o = admin(
        &r,
        &[
            "order",
            "show",
            "o1",
            "--promotion",
            "p2",
            "--output",
            "json",
        ],
    )
    .await;
    let v = json_of(&o);
    let recs = v["records"].as_array().unwrap();
    assert_eq!(recs.len(), 1, "{v:#}");
    assert_eq!(
        (recs[0]["promotion_id"].as_str(), recs[0]["stock"].as_u64()),
        (Some("p2"), Some(2))
    );

    let o = admin(&r, &["order", "show", "o2"]).await;
    assert!(stdout(&o).contains("no record"), "{}", stdout(&o));

    let o = admin(&r, &["event", "show", "e2"]).await;
    assert_exit(&o, 0, "event show");
    let out = stdout(&o);
    assert!(out.contains("tight: rejected: budget_exceeded"), "{out}");
    assert!(out.contains("p1: rejected on another promotion"), "{out}");
    let v = json_of(&admin(&r, &["event", "show", "e2", "--output", "json"]).await);
    let reasons: Vec<_> = v["placements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["promotion_id"].as_str().unwrap(),
                m["decision"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [("p1", "released"), ("tight", "rejected")],
        "{v:#}"
    );

    // A refund's result, wherever the ledger keeps it (record field or memo key).
    let v = json_of(&admin(&r, &["event", "show", "r1", "--output", "json"]).await);
    let refunds = v["refunds"].as_array().unwrap();
    assert_eq!(refunds.len(), 1, "{v:#}");
    assert_eq!(refunds[0]["promotion_id"], "p1");
    assert_eq!(refunds[0]["result"], "applied");
    assert_eq!(
        (refunds[0]["budget"].as_u64(), refunds[0]["stock"].as_u64()),
        (Some(40), Some(0))
    );

    let v = json_of(
        &admin(
            &r,
            &[
                "event",
                "show",
                "e1",
                "--promotion",
                "p1",
                "--output",
                "json",
            ],
        )
        .await,
    );
    assert_eq!(v["records"][0]["order_id"], "o1", "{v:#}");
    // A forced replace starts a new incarnation: the order's record is from the old one.
    let o = admin(
        &r,
        &[
            "promo",
            "set",
            "p2",
            "--stock",
            "10",
            "--force",
            "--discard-outstanding",
        ],
    )
    .await;
    assert_exit(&o, 0, "promo set --force --discard-outstanding");
    let o = admin(&r, &["order", "show", "o1", "--promotion", "p2"]).await;
    assert!(
        stdout(&o).contains("taken from a replaced incarnation"),
        "{}",
        stdout(&o)
    );
    let o = admin(&r, &["event", "show", "never-seen"]).await;
    assert!(stdout(&o).contains("nothing stored"), "{}", stdout(&o));
    assert_exit(
        &admin(&r, &["order", "show", "bad:id"]).await,
        2,
        "an invalid order id",
    );
}

/// Produces one record with headers to `partition` of `topic`.
async fn produce_with_headers(
    topic: &str,
    partition: i32,
    key: &str,
    payload: &str,
    headers: &[(&str, &str)],
) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::FutureRecord;
    let mut h = OwnedHeaders::new();
    for (k, v) in headers {
        h = h.insert(Header {
            key: k,
            value: Some(v.as_bytes()),
        });
    }
    let record = FutureRecord::to(topic)
        .partition(partition)
        .key(key)
        .payload(payload)
        .headers(h);
    kafka::producer()
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .expect("producing a dead letter");
}

/// Issue 11: `dlq list | show | replay`. A dead letter that parses now is
/// redriven to the input topic (key and headers kept, provenance added,
/// counted in a metric) and then decided by the running service; a still
/// invalid one is skipped; --dry-run sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_redriven_with_provenance_and_then_decided() {
    let f = Fixture::new("redrive", 2).await;
    let ledger = f.ledger().await;
    f.promo(
        &ledger,
        "rd",
        deductor::admin::PromoSpec {
            stock: Some(5),
            ..Default::default()
        },
    )
    .await;
    let valid = serde_json::json!({"type": "OrderPlaced", "event_id": "e-rd", "order_id": "o-rd",
        "customer_id": "c-1", "occurred_at": "2026-11-29T10:00:00Z",
        "lines": [{"promotion_id": "rd", "stock": 1}]})
    .to_string();
    let input = f.topics.input.clone();
    let dead = |kind: &'static str| {
        vec![
            ("deductor.error", kind),
            ("deductor.error.kind", kind),
            ("deductor.source.topic", input.as_str()),
            ("deductor.source.partition", "0"),
            ("deductor.source.offset", "41"),
            ("x-original", "keep-me"),
        ]
    };
    // Dead-lettered by an older, stricter parser: it parses now.
    produce_with_headers(&f.topics.dlq, 0, "o-rd", &valid, &dead("missing_field")).await;
    produce_with_headers(&f.topics.dlq, 0, "o-bad", "not json", &dead("not_json")).await;

    let o = deductor(&f.env(&[]), &["dlq", "list", "--output", "json"]).await;
    assert_exit(&o, 0, "dlq list");
    let all = json_of(&o);
    assert_eq!(all.as_array().unwrap().len(), 2, "{all:#}");
    assert_eq!(all[0]["offset"], 0);
    assert_eq!(all[0]["parse"]["valid"], true, "{all:#}");
    assert_eq!(all[1]["kind"], "not_json");
    let o = deductor(&f.env(&[]), &["dlq", "list", "--kind", "not_json"]).await;
    let out = stdout(&o);
    assert!(out.contains("0@1") && !out.contains("0@0"), "{out}");
    let o = deductor(
        &f.env(&[]),
        &[
            "dlq",
            "list",
            "--partition",
            "0",
            "--from-offset",
            "1",
            "--to-offset",
            "1",
            "--output",
            "json",
        ],
    )
    .await;
    assert_eq!(json_of(&o).as_array().unwrap().len(), 1);
    let o = deductor(
        &f.env(&[]),
        &[
            "dlq",
            "list",
            "--since",
            "2000-01-01T00:00:00Z",
            "--until",
            "2001-01-01T00:00:00Z",
            "--output",
            "json",
        ],
    )
    .await;
    assert_eq!(
        json_of(&o).as_array().unwrap().len(),
        0,
        "a time range before the records"
    );
    let hour_ago = (chrono::Utc::now().timestamp() - 3600).to_string();
    let o = deductor(
        &f.env(&[]),
        &["dlq", "list", "--since", &hour_ago, "--output", "json"],
    )
    .await;
    assert_eq!(
        json_of(&o).as_array().unwrap().len(),
        2,
        "a time range around the records"
    );
    let o = deductor(
        &f.env(&[]),
        &["dlq", "show", "--partition", "0", "--offset", "0"],
    )
    .await;
    assert_exit(&o, 0, "dlq show");
    assert!(
        stdout(&o).contains("parses now: OrderPlaced e-rd of order o-rd"),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("header x-original: keep-me"),
        "{}",
        stdout(&o)
    );

    let o = deductor(&f.env(&[]), &["dlq", "replay"]).await;
    assert_exit(&o, 2, "replay without a filter or --all");
    let o = deductor(
        &f.env(&[]),
        &["dlq", "replay", "--all", "--dry-run", "--output", "json"],
    )
    .await;
    assert_exit(&o, 0, "dry run");
    let v = json_of(&o);
    assert_eq!(
        (
            v["would_redrive"].as_u64(),
            v["skipped"].as_u64(),
            v["redriven"].as_u64()
        ),
        (Some(1), Some(1), Some(0)),
        "{v:#}"
    );
    assert!(
        kafka::end_offsets(&f.topics.input)
            .await
            .values()
            .all(|o| *o == 0),
        "a dry run sends nothing"
    );

    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("dlq.prom");
    let o = deductor(
        &f.env(&[]),
        &[
            "dlq",
            "replay",
            "--all",
            "--metrics-file",
            metrics.to_str().unwrap(),
        ],
    )
    .await;
    assert_exit(&o, 0, "replay");
    let out = stdout(&o);
    assert!(out.contains("0@0 key o-rd: redriven to"), "{out}");
    assert!(
        out.contains("0@1 key o-bad: skipped, still invalid: not_json"),
        "{out}"
    );
    let prom = std::fs::read_to_string(&metrics).unwrap();
    for line in [
        "deductor_dlq_redrives_total{result=\"redriven\"} 1",
        "deductor_dlq_redrives_total{result=\"skipped\"} 1",
    ] {
        assert!(prom.contains(line), "{line} in {prom}");
    }
    let redriven = kafka::read_n(&f.topics.input, 1, Duration::from_secs(30)).await;
    let r = &redriven[0];
    assert_eq!(r.key_str().as_deref(), Some("o-rd"));
    assert_eq!(r.json()["event_id"], "e-rd");
    for (k, v) in [
        ("x-original", "keep-me"),
        ("deductor.error.kind", "missing_field"),
        ("deductor.redrive.topic", f.topics.dlq.as_str()),
        ("deductor.redrive.partition", "0"),
        ("deductor.redrive.offset", "0"),
    ] {
        assert_eq!(
            r.headers.get(k).map(String::as_str),
            Some(v),
            "header {k}: {:?}",
            r.headers
        );
    }
    assert!(
        r.headers.contains_key("deductor.redrive.time"),
        "{:?}",
        r.headers
    );

    // The running service decides it.
    let svc = service::start(f.settings(&[]));
    let out = kafka::read_n(&f.topics.outcome, 1, Duration::from_secs(60)).await;
    assert_eq!(
        out[0].json()["type"],
        "DeductAccepted",
        "{:?}",
        out[0].json()
    );
    assert_eq!(out[0].json()["event_id"], "e-rd");
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");
    assert_eq!(
        deductor::admin::promo_show(&ledger, &deductor::domain::event::Id::parse("rd").unwrap())
            .await
            .unwrap()
            .unwrap()
            .stock,
        Some(4)
    );
    f.cleanup().await;
}

/// Waits for the outcome of event `id` and returns it.
async fn outcome_of(f: &Fixture, id: &str) -> serde_json::Value {
    let found = |r: &kafka::Record| {
        serde_json::from_slice::<serde_json::Value>(r.payload.as_deref().unwrap_or_default())
            .ok()
            .filter(|v| v["event_id"] == id)
    };
    let rs = kafka::read_until(&f.topics.outcome, Duration::from_secs(90), |rs| {
        rs.iter().any(|r| found(r).is_some())
    })
    .await;
    rs.iter().find_map(found).unwrap()
}

/// Issue 11, "done when": pause, resume, adjust and limit run while the
/// service processes a burst of events, and nothing is lost: every event is
/// decided, initial - remaining == outstanding on every promotion, Redis
/// agrees with the decisions (accepted - refunded), and `audit` is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_changes_during_a_burst_lose_nothing_and_audit_stays_clean() {
    use crate::common::workload::{self, Shape, PLACED_AT};
    let f = Fixture::new("live-sale", 3).await;
    let ledger = f.ledger().await;
    let shape = Shape {
        orders: 400,
        customers: 150,
        promotions: 2,
        stock: 120,
        budget: 60_000,
        per_customer: Some(1),
        ..Shape::default()
    };
    let w = workload::generate("ls", &shape);
    w.seed(&f, &ledger).await;
    let svc = service::start(f.settings(&[]));
    let producer = {
        let w = w.clone();
        let topic = f.topics.input.clone();
        tokio::spawn(async move { w.produce_paced(topic, 20, Duration::from_millis(150)).await })
    };
    let cli = |args: &'static [&'static str]| {
        let e = f.env(&[("log.level", "warn")]);
        async move { deductor(&e, args).await }
    };
    // A marker placement on p0 by a customer of its own, decided in between.
    let marker = |n: u32| {
        serde_json::json!({"type": "OrderPlaced", "event_id": format!("m-e{n}"),
            "order_id": format!("m-o{n}"), "customer_id": format!("m-c{n}"),
            "occurred_at": PLACED_AT, "lines": [{"promotion_id": "p0", "budget": 10, "stock": 1}]})
    };

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_exit(&cli(&["promo", "pause", "p0"]).await, 0, "pause");
    kafka::produce_events(&f.topics.input, &[marker(1)]).await;
    let v = outcome_of(&f, "m-e1").await;
    assert_eq!(v["reason"], "promotion_inactive", "paused: {v}");
    assert_exit(&cli(&["promo", "resume", "p0"]).await, 0, "resume");
    kafka::produce_events(&f.topics.input, &[marker(2)]).await;
    let v = outcome_of(&f, "m-e2").await;
    assert_eq!(v["type"], "DeductAccepted", "resumed: {v}");

    assert_exit(
        &cli(&[
            "promo", "adjust", "p0", "--stock", "+30", "--budget", "+5000",
        ])
        .await,
        0,
        "adjust up",
    );
    assert_exit(
        &cli(&["promo", "limit", "p1", "--per-customer", "2"]).await,
        0,
        "limit 2",
    );
    // Taking back may meet a promotion already sold out: then it is refused
    // and nothing is written.
    let o = cli(&["promo", "adjust", "p1", "--stock", "-3"]).await;
    if o.status.code() != Some(0) {
        assert_exit(&o, 1, "adjust down refused");
        assert!(stderr(&o).contains("below 0"), "{}", stderr(&o));
    }
    assert_exit(
        &cli(&["promo", "limit", "p0", "--per-customer", "none"]).await,
        0,
        "limit none",
    );
    assert_exit(
        &cli(&["promo", "adjust", "p1", "--budget", "-100"]).await,
        0,
        "adjust budget down",
    );
    assert_exit(
        &cli(&["promo", "limit", "p0", "--per-customer", "3"]).await,
        0,
        "limit 3",
    );

    producer.await.unwrap();
    let (outcomes, _dlq) = w.wait_done(&f, Duration::from_secs(180)).await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");

    // Every event decided once; the decisions add up to what Redis holds.
    let mut first: std::collections::BTreeMap<String, serde_json::Value> = Default::default();
    for r in &outcomes {
        let v = r.json();
        if let Some(id) = v["event_id"].as_str() {
            first.entry(id.to_owned()).or_insert(v);
        }
    }
    for id in w.event_ids() {
        assert!(first.contains_key(&id), "event {id} has no outcome");
    }
    let mut held: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
    for v in first.values() {
        let sign = match v["type"].as_str() {
            Some("DeductAccepted") => 1,
            Some("RollbackApplied") => -1,
            _ => continue,
        };
        for l in v["lines"].as_array().unwrap() {
            if sign < 0 && l["status"] != "applied" {
                continue;
            }
            let e = held
                .entry(l["promotion_id"].as_str().unwrap().to_owned())
                .or_default();
            e.0 += sign * l["budget"].as_i64().unwrap();
            e.1 += sign * l["stock"].as_i64().unwrap();
        }
    }
    for p in ["p0", "p1"] {
        let id = deductor::domain::event::Id::parse(p).unwrap();
        let view = deductor::admin::promo_show(&ledger, &id)
            .await
            .unwrap()
            .unwrap();
        let report = deductor::audit::audit_one(&ledger, &id).await.unwrap();
        let (ib, b) = (
            view.initial_budget.unwrap() as i64,
            view.budget.unwrap() as i64,
        );
        let (is, s) = (
            view.initial_stock.unwrap() as i64,
            view.stock.unwrap() as i64,
        );
        assert_eq!(
            (ib - b, is - s),
            (report.outstanding_budget, report.outstanding_stock),
            "{p}: initial - remaining == outstanding"
        );
        assert_eq!(
            (ib - b, is - s),
            held.get(p).copied().unwrap_or_default(),
            "{p}: initial - remaining == accepted - refunded"
        );
        assert!(report.breaches.is_empty(), "{p}: {:?}", report.breaches);
    }
    let o = cli(&["audit", "--output", "json"]).await;
    assert_exit(&o, 0, "audit after the burst");
    assert_eq!(json_of(&o)["clean"], true);
    f.cleanup().await;
}

/// The promo_* scripts validate before they write: a malformed argument
/// (BADARG) or corrupt stored data (CORRUPT) is an error reply and nothing
/// changes; `adjust` refuses both dimensions when one fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promo_scripts_refuse_bad_arguments_and_corrupt_data_writing_nothing() {
    use deductor::admin::promo::{self, Adjustment};
    use deductor::admin::AdminError;
    use deductor::ledger::scripts;
    let r = crate::common::redis::standalone().await;
    let key = r.keys().promotion(&crate::common::redis::id("p"));
    r.seed(
        "p",
        &[
            ("stock", "5"),
            ("initial_stock", "9"),
            ("budget", "10"),
            ("initial_budget", "10"),
        ],
    )
    .await;
    let before = r.dump().await;
    for (script, args) in [
        (&scripts::PROMO_STATUS, vec!["stopped"]),
        (&scripts::PROMO_ADJUST, vec!["", ""]),
        (&scripts::PROMO_ADJUST, vec!["+1", ""]),
        (&scripts::PROMO_ADJUST, vec!["-0", ""]),
        (&scripts::PROMO_ADJUST, vec!["1e3", ""]),
        (&scripts::PROMO_LIMIT, vec!["-1"]),
        (&scripts::PROMO_LIMIT, vec!["01"]),
        (&scripts::PROMO_DELETE, vec!["maybe"]),
    ] {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let e = r
            .eval(script.body, vec![key.clone()], args.clone())
            .await
            .expect_err("a BADARG error reply");
        assert!(
            e.details().starts_with("BADARG"),
            "{} {args:?}: {e}",
            script.name
        );
    }
    // A refusal of one dimension writes neither.
    let p = crate::common::redis::id("p");
    let e = promo::adjust(
        &r.ledger,
        &p,
        Adjustment {
            budget: Some(5),
            stock: Some(-6),
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(e, AdminError::Refused(_)), "{e}");
    assert!(e.to_string().contains("below 0"), "{e}");
    r.assert_unchanged(&before, "nothing written").await;

    // Corrupt data is named, not overwritten.
    r.seed(
        "p",
        &[
            ("stock", "5x"),
            ("status", "sleeping"),
            ("per_customer", "-1"),
        ],
    )
    .await;
    let before = r.dump().await;
    for result in [
        promo::adjust(
            &r.ledger,
            &p,
            Adjustment {
                budget: None,
                stock: Some(1),
            },
        )
        .await
        .map(drop),
        promo::set_paused(&r.ledger, &p, true).await.map(drop),
        promo::limit(&r.ledger, &p, Some(2)).await.map(drop),
    ] {
        let e = result.unwrap_err();
        assert!(e.to_string().contains("CORRUPT"), "{e}");
    }
    r.assert_unchanged(&before, "nothing written").await;
    // promo list names an unreadable promotion and goes on.
    let o = admin(&r, &["promo", "list"]).await;
    assert_exit(&o, 0, "promo list with a corrupt promotion");
    assert!(
        stdout(&o).contains("p  UNREADABLE: field "),
        "{}",
        stdout(&o)
    );
    // delete --force removes even a corrupt hash.
    promo::delete(&r.ledger, &p, true).await.unwrap();
    assert_eq!(r.promo_field("p", "stock").await, None);
}

/// scripts/dev-stack (behind the README's commands) formats Kafka's storage
/// with a random cluster id; one starting with '-' (1 draw in 64) was read as
/// an option and the format failed. 500 ids from its own generator: each a
/// 22-character URL-safe base64 id that does not start with '-'.
#[test]
fn dev_stack_cluster_ids_never_start_with_a_dash() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/dev-stack");
    let out = std::process::Command::new("bash")
        .args([
            "-c",
            r#"source "$1" && for _ in $(seq 500); do kafka_cluster_id; done"#,
            "bash",
            script,
        ])
        .output()
        .expect("running bash");
    assert!(
        out.status.success(),
        "sourcing {script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(ids.lines().count(), 500, "{ids}");
    for id in ids.lines() {
        assert_eq!(id.len(), 22, "{id:?}");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "{id:?}"
        );
        assert!(!id.starts_with('-'), "{id:?} starts with '-'");
    }
}
