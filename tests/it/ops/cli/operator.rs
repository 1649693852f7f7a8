//! The operator's tools at their edges (issue 24 items 9-14): secrets never
//! print, `check` refuses what `run` refuses, a closed pipe ends quietly,
//! `publish` exits 3 without Kafka.

use std::io::Write as _;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use super::{assert_exit, assert_one_line_error, deductor, env, free_port, stderr, stdout};
use crate::common::redis;
use crate::common::service::{self, Fixture};

/// Item 11: a value librdkafka refuses is a configuration error (exit 2)
/// naming the setting, in `check` exactly as in `run` (it was exit 0 for
/// `check` and exit 1 without the key for `run`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_run_refuse_what_librdkafka_refuses_naming_the_key() {
    let f = Fixture::new("ops-kcfg", 1).await;
    for (set, key) in [
        (
            "kafka.produce_timeout_ms=3000000000",
            "kafka.produce_timeout_ms",
        ),
        (
            "kafka.producer.compression.type=lz5",
            "kafka.producer.\"compression.type\"",
        ),
        (
            "kafka.consumer.session.timeout.ms=nope",
            "kafka.consumer.\"session.timeout.ms\"",
        ),
    ] {
        for cmd in ["check", "run"] {
            let o = deductor(&f.env(&[]), &[cmd, "--set", set]).await;
            assert_exit(&o, 2, &format!("{cmd} --set {set}"));
            assert_one_line_error(&o, key, &format!("{cmd} --set {set}"));
        }
    }
    f.cleanup().await;
}

/// Item 14: `publish` exits 3 when Kafka cannot be reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_exits_3_when_kafka_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    std::fs::write(&file, "{\"order_id\":\"o1\"}\n").unwrap();
    let brokers = format!("127.0.0.1:{}", free_port());
    let e = env(&[
        ("DEDUCTOR_KAFKA_BROKERS", &brokers),
        ("DEDUCTOR_KAFKA_PRODUCE_TIMEOUT_MS", "1500"),
        ("DEDUCTOR_LOG_LEVEL", "error"),
    ]);
    let o = deductor(&e, &["publish", file.to_str().unwrap()]).await;
    assert_exit(&o, 3, "publish without Kafka");
}

/// Item 13: output cut short by a closed pipe (`promo set ... | head -1`)
/// neither panics nor exits 101; the write was applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_to_a_closed_pipe_ends_quietly() {
    let r = redis::standalone().await;
    let e = env(&[
        ("DEDUCTOR_REDIS_URL", &r.url),
        ("DEDUCTOR_REDIS_KEY_PREFIX", &r.prefix),
        ("DEDUCTOR_LOG_LEVEL", "warn"),
    ]);
    for args in [
        vec!["promo", "set", "piped", "--stock", "5"],
        vec!["promo", "list"],
        vec!["audit"],
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let mut c = service::command(&e);
        c.args(&args).stdout(writer).stderr(Stdio::piped());
        let o = tokio::task::spawn_blocking(move || c.output().expect("running deductor"))
            .await
            .unwrap();
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_ne!(o.status.code(), Some(101), "{args:?}: {err}");
    }
    assert_eq!(r.promo_field("piped", "stock").await.as_deref(), Some("5"));
}

/// An operator command meeting a Redis that closes its connections (a
/// server going down, a Cluster failing over) exits 3 with its message; it
/// died of SIGPIPE (exit 141, nothing said) while the operator commands
/// took SIGPIPE's default for item 13. Found by the chaos suite's audits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_closing_its_connections_is_exit_3_not_sigpipe() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("redis://{}", listener.local_addr().expect("addr"));
    // Accepts and closes at once, without reading: the client's next
    // write meets a closed connection.
    std::thread::spawn(move || {
        for c in listener.incoming() {
            drop(c);
        }
    });
    let e = env(&[
        ("DEDUCTOR_REDIS_URL", &url),
        ("DEDUCTOR_REDIS_KEY_PREFIX", "sigpipe"),
        ("DEDUCTOR_LOG_LEVEL", "error"),
    ]);
    for _ in 0..8 {
        let o = deductor(&e, &["audit"]).await;
        assert_exit(&o, 3, "audit against a Redis closing its connections");
        assert!(stderr(&o).contains("redis"), "{}", stderr(&o));
    }
}

/// The process's output, with everything a run of `secs` wrote.
async fn run_for(
    e: &[(String, String)],
    args: &[&str],
    secs: u64,
    scrape: Option<String>,
) -> (Output, String) {
    let mut c = service::command(e);
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawning deductor");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut metrics = String::new();
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if let (Some(addr), true) = (&scrape, metrics.is_empty()) {
            if let Ok(body) = http_get(addr, "/metrics") {
                metrics = body;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = child.kill();
    let o = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    (o, metrics)
}

fn http_get(addr: &str, path: &str) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// Class check "secrets never print", and items 9 and 10: a known secret
/// in every secret-bearing setting, in well-formed and malformed shapes,
/// never appears in the stdout or stderr (logs at trace level) of `run`,
/// `check` and every admin command, nor in `run`'s metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_print() {
    let f = Fixture::new("ops-secrets", 1).await;
    let secret = format!("Sx{:016x}", rand::random::<u64>());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    let file = file.to_str().unwrap().to_owned();
    let redis_host = f
        .redis_url
        .split_once("://")
        .map_or("", |(_, h)| h)
        .to_owned();
    let s = secret.as_str();
    // (what, the settings that carry the secret)
    let shapes: Vec<(&str, Vec<(String, String)>)> = vec![
        (
            "url password",
            vec![(
                "redis.url".into(),
                format!("redis://admin:{s}@{redis_host}"),
            )],
        ),
        (
            "url typo //",
            vec![("redis.url".into(), format!("redis//admin:{s}@{redis_host}"))],
        ),
        (
            "url without scheme",
            vec![("redis.url".into(), format!("admin:{s}@{redis_host}"))],
        ),
        (
            "url :/",
            vec![("redis.url".into(), format!("redis:/admin:{s}@{redis_host}"))],
        ),
        (
            "url password only",
            vec![("redis.url".into(), format!("redis://:{s}@127.0.0.1:1"))],
        ),
        ("redis password", vec![("redis.password".into(), s.into())]),
        (
            "redis password file",
            vec![("redis.password_file".into(), file.clone())],
        ),
        (
            "sentinel password, not sentinel",
            vec![("redis.sentinel_password".into(), s.into())],
        ),
        (
            "sentinel password file",
            vec![("redis.sentinel_password_file".into(), file.clone())],
        ),
        (
            "sentinel url",
            vec![
                (
                    "redis.url".into(),
                    "redis-sentinel://127.0.0.1:1/deductor".into(),
                ),
                ("redis.sentinel_password".into(), s.into()),
            ],
        ),
        (
            "consumer sasl",
            vec![("kafka.consumer.sasl.password".into(), s.into())],
        ),
        (
            "producer sasl",
            vec![("kafka.producer.sasl.password".into(), s.into())],
        ),
        (
            "sasl file",
            vec![("kafka.sasl_password_file".into(), file.clone())],
        ),
        (
            "misspelled consumer",
            vec![("kafka.consumer.sasl.passwrd".into(), s.into())],
        ),
        (
            "misspelled producer",
            vec![("kafka.producer.ssl.key.pasword".into(), s.into())],
        ),
        (
            "sasl login refused",
            vec![
                (
                    "kafka.consumer.security.protocol".into(),
                    "SASL_PLAINTEXT".into(),
                ),
                ("kafka.consumer.sasl.mechanisms".into(), "PLAIN".into()),
                ("kafka.consumer.sasl.username".into(), "u".into()),
                ("kafka.consumer.sasl.password".into(), s.into()),
            ],
        ),
    ];
    let events = dir.path().join("events.jsonl");
    std::fs::write(&events, "{\"order_id\":\"o1\"}\n").unwrap();
    let events = events.to_str().unwrap().to_owned();
    let commands: Vec<Vec<&str>> = vec![
        vec!["check"],
        vec!["check", "--output", "json"],
        vec![
            "promo",
            "set",
            "sec",
            "--stock",
            "1",
            "--force",
            "--discard-outstanding",
        ],
        vec!["promo", "show", "sec"],
        vec!["promo", "list"],
        vec!["promo", "pause", "sec"],
        vec!["promo", "adjust", "sec", "--stock", "+1"],
        vec!["promo", "limit", "sec", "--per-customer", "2"],
        vec!["audit"],
        vec!["order", "show", "o1"],
        vec!["event", "show", "e1"],
        vec!["dlq", "list"],
        vec!["publish", &events],
        vec!["promo", "delete", "sec", "--force"],
    ];
    for (what, settings) in &shapes {
        let mut extra: Vec<(&str, &str)> = settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        extra.push(("log.level", "trace"));
        extra.push(("redis.connect_timeout_ms", "500"));
        extra.push(("kafka.produce_timeout_ms", "1500"));
        let mut e = f.env(&extra);
        // Pass-through properties by --set (their names hold dots).
        let mut sets: Vec<String> = Vec::new();
        e.retain(|(k, _)| {
            !k.starts_with("DEDUCTOR_KAFKA_CONSUMER_") && !k.starts_with("DEDUCTOR_KAFKA_PRODUCER_")
        });
        for (k, v) in settings
            .iter()
            .filter(|(k, _)| k.starts_with("kafka.consumer.") || k.starts_with("kafka.producer."))
        {
            sets.push("--set".into());
            sets.push(format!("{k}={v}"));
        }
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let assert_clean = |o: &Output, extra: &str, cmd: &str| {
            for (name, text) in [
                ("stdout", stdout(o)),
                ("stderr", stderr(o)),
                ("metrics", extra.to_owned()),
            ] {
                assert!(
                    !text.contains(s),
                    "{what}: `{cmd}` printed the secret on {name}: {text}"
                );
            }
        };
        // The commands of one shape at once (each waits on its own timeouts).
        let runs = commands.iter().map(|cmd| {
            let args: Vec<&str> = sets.iter().copied().chain(cmd.iter().copied()).collect();
            let e = &e;
            async move { (cmd.join(" "), run_for(e, &args, 20, None).await.0) }
        });
        for (cmd, o) in futures::future::join_all(runs).await {
            assert_clean(&o, "", &cmd);
        }
        let listen = format!("127.0.0.1:{}", free_port());
        let mut with_http = e.clone();
        with_http.push(("DEDUCTOR_HTTP_LISTEN".into(), listen.clone()));
        let args: Vec<&str> = sets.iter().copied().chain(["run"]).collect();
        let (o, metrics) = run_for(&with_http, &args, 4, Some(listen)).await;
        assert_clean(&o, &metrics, "run");
    }
    f.cleanup().await;
}
