//! Security against the real services: the pipeline over Kafka SASL/SCRAM
//! (SASL_PLAINTEXT on the dev-stack's 9094) and SASL_SSL (9095, the
//! dev-stack's own CA), configured only through the `kafka.consumer.*` /
//! `kafka.producer.*` pass-through; a wrong password is a fatal, clear error
//! that never shows the password; a least-privilege Redis ACL user the
//! service works with; Redis over TLS with a CA file.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::kafka;
use common::service::{self, Fixture};
use deductor::admin::PromoSpec;
use deductor::config::Settings;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// The SCRAM listener and its credentials (`scripts/dev-stack env`).
struct Scram {
    brokers: String,
    mechanism: String,
    username: String,
    password: String,
}

fn scram() -> Scram {
    Scram {
        brokers: env_or("DEDUCTOR_KAFKA_SASL_BROKERS", "127.0.0.1:9094"),
        mechanism: env_or("DEDUCTOR_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
        username: env_or("DEDUCTOR_KAFKA_SASL_USERNAME", "deductor"),
        password: env_or("DEDUCTOR_KAFKA_SASL_PASSWORD", "deductor-secret"),
    }
}

/// The SASL_SSL listener and the CA that signed its certificate.
fn tls_brokers() -> String {
    env_or("DEDUCTOR_KAFKA_TLS_BROKERS", "127.0.0.1:9095")
}

fn tls_ca() -> String {
    std::env::var("DEDUCTOR_KAFKA_TLS_CA").unwrap_or_else(|_| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(".stack/kafka/tls/ca.pem")
            .display()
            .to_string()
    })
}

/// `kafka.consumer.*` and `kafka.producer.*` overrides for one librdkafka
/// property set, plus the brokers.
fn kafka_overrides(brokers: &str, props: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut o = vec![("kafka.brokers".to_owned(), brokers.to_owned())];
    for client in ["consumer", "producer"] {
        for (k, v) in props {
            o.push((format!("kafka.{client}.{k}"), (*v).to_owned()));
        }
    }
    o
}

fn scram_props<'a>(s: &'a Scram, protocol: &'a str, password: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("security.protocol", protocol),
        ("sasl.mechanism", s.mechanism.as_str()),
        ("sasl.username", s.username.as_str()),
        ("sasl.password", password),
    ]
}

fn settings_with(f: &Fixture, extra: &[(String, String)]) -> Settings {
    let extra: Vec<(&str, &str)> = extra
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    f.settings(&extra)
}

fn event(kind: &str, e: &str, o: &str, lines: Value) -> Value {
    let at = if kind == "OrderPlaced" {
        "2026-11-29T10:00:00Z"
    } else {
        "2026-11-30T08:00:00Z"
    };
    json!({"type": kind, "event_id": e, "order_id": o, "customer_id": "c-1",
           "occurred_at": at, "lines": lines})
}

/// Runs the service in-process with `settings`, sends a placement, its
/// refund and an invalid event, and checks the outcomes and the dead letter:
/// the whole path (consume, Redis, produce, commit) over the configured
/// transport.
async fn round_trip(f: &Fixture, settings: Settings) {
    let ledger = f.ledger().await;
    f.promo(
        &ledger,
        "sec",
        PromoSpec {
            budget: Some(10_000),
            stock: Some(5),
            ..PromoSpec::default()
        },
    )
    .await;
    let svc = service::start(settings);
    let placed = event(
        "OrderPlaced",
        "e-p1",
        "o-1",
        json!([{"promotion_id": "sec", "budget": 700, "stock": 1}]),
    );
    let refund = event(
        "OrderRefunded",
        "e-r1",
        "o-1",
        json!([{"promotion_id": "sec"}]),
    );
    kafka::produce_events(&f.topics.input, &[placed, refund]).await;
    kafka::produce_raw(
        &f.topics.input,
        &[kafka::Raw {
            key: Some(b"o-2".to_vec()),
            payload: Some(b"{not json".to_vec()),
            ..kafka::Raw::default()
        }],
    )
    .await;
    let outcomes = kafka::read_n(&f.topics.outcome, 2, WAIT).await;
    let types: Vec<String> = outcomes
        .iter()
        .map(|r| r.json()["type"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(types, ["DeductAccepted", "RollbackApplied"], "{outcomes:?}");
    let accepted = outcomes[0].json();
    assert_eq!(
        accepted["lines"][0]["remaining"],
        json!({"budget": 9_300, "stock": 4})
    );
    let dead = kafka::read_n(&f.topics.dlq, 1, WAIT).await;
    assert_eq!(dead[0].payload.as_deref(), Some(&b"{not json"[..]));
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, f.topics.partitions, WAIT).await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");
    ledger.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_over_sasl_scram() {
    let f = Fixture::new("sec-scram", 1).await;
    let s = scram();
    let settings = settings_with(
        &f,
        &kafka_overrides(&s.brokers, &scram_props(&s, "SASL_PLAINTEXT", &s.password)),
    );
    round_trip(&f, settings).await;
    f.cleanup().await;
}

/// A password that is not the listener's and that no log would contain by
/// chance.
fn wrong_password() -> String {
    format!("not-the-secret-{:016x}", rand::random::<u64>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_scram_password_is_fatal_and_never_shown() {
    let f = Fixture::new("sec-badpw", 1).await;
    let s = scram();
    let bad = wrong_password();
    let overrides = kafka_overrides(&s.brokers, &scram_props(&s, "SASL_PLAINTEXT", &bad));

    // In-process: run() gives up with an error instead of retrying forever.
    let svc = service::start(settings_with(&f, &overrides));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !svc.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the service still runs 30 s after every login was refused"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    let text = format!("{:#}", result.expect_err("a refused login is fatal"));
    assert!(text.contains("Authentication"), "not a clear error: {text}");
    assert!(!text.contains(&bad), "the error shows the password: {text}");

    // As a process, with debug logs: exits non-zero, says why, and neither
    // the logs nor the error line show the password.
    let mut extra: Vec<(&str, &str)> = overrides
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    extra.extend([("log.level", "debug"), ("log.format", "json")]);
    let env = f.env(&extra);
    let mut child = service::spawn(&env, &["run"]);
    let status = child
        .wait(Duration::from_secs(45))
        .unwrap_or_else(|| panic!("deductor run still runs; log:\n{}", child.log_tail(20)));
    let log = std::fs::read_to_string(&child.log).unwrap();
    assert!(!status.success(), "exit status {status}; log:\n{log}");
    assert!(
        log.contains("Authentication"),
        "no clear error; log:\n{log}"
    );
    assert!(!log.contains(&bad), "the output shows the password:\n{log}");

    // `deductor check`: fails, without the password; with the right one it passes.
    let out = check(&env);
    assert!(!out.0, "check passed with a wrong password:\n{}", out.1);
    assert!(
        !out.1.contains(&bad),
        "check shows the password:\n{}",
        out.1
    );
    let good = kafka_overrides(&s.brokers, &scram_props(&s, "SASL_PLAINTEXT", &s.password));
    let good: Vec<(&str, &str)> = good.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = check(&f.env(&good));
    assert!(out.0, "check fails with the right password:\n{}", out.1);
    assert!(
        !out.1.contains(&s.password),
        "check shows the password:\n{}",
        out.1
    );
    f.cleanup().await;
}

/// `deductor check` with `env`: (passed, stdout + stderr).
fn check(env: &[(String, String)]) -> (bool, String) {
    let out = service::command(env)
        .arg("check")
        .stdin(Stdio::null())
        .output()
        .expect("running deductor check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The consumer logs in, the producer does not (a typo in one of the two
/// property maps): the service stops with the producer's error instead of
/// retrying outcomes forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_producer_password_alone_is_fatal() {
    let f = Fixture::new("sec-badprod", 1).await;
    let s = scram();
    let bad = wrong_password();
    let mut o = vec![("kafka.brokers".to_owned(), s.brokers.clone())];
    for (client, pw) in [
        ("consumer", s.password.as_str()),
        ("producer", bad.as_str()),
    ] {
        for (k, v) in scram_props(&s, "SASL_PLAINTEXT", pw) {
            o.push((format!("kafka.{client}.{k}"), v.to_owned()));
        }
    }
    let svc = service::start(settings_with(&f, &o));
    kafka::produce_events(
        &f.topics.input,
        &[event(
            "OrderPlaced",
            "e-1",
            "o-1",
            json!([{"promotion_id": "none"}]),
        )],
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !svc.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the service still runs 30 s after the producer's login was refused"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    let text = format!("{:#}", result.expect_err("a refused login is fatal"));
    assert!(text.contains("producer"), "{text}");
    assert!(text.contains("Authentication"), "{text}");
    assert!(!text.contains(&bad), "the error shows the password: {text}");
    assert!(kafka::read_all(&f.topics.outcome).await.is_empty());
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_over_sasl_ssl_with_a_private_ca() {
    let f = Fixture::new("sec-tls", 1).await;
    let s = scram();
    let ca = tls_ca();
    assert!(
        std::path::Path::new(&ca).exists(),
        "no CA file {ca}: start the dev-stack (scripts/dev-stack up) or set DEDUCTOR_KAFKA_TLS_CA"
    );
    let mut props = scram_props(&s, "SASL_SSL", &s.password);
    props.push(("ssl.ca.location", ca.as_str()));
    let settings = settings_with(&f, &kafka_overrides(&tls_brokers(), &props));
    assert_eq!(
        settings.kafka.consumer.get("ssl.ca.location"),
        Some(&ca),
        "passed through to librdkafka"
    );
    round_trip(&f, settings).await;
    f.cleanup().await;
}
