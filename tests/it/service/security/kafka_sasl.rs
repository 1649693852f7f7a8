//! Kafka with authentication: the pipeline over SASL/SCRAM and over
//! SASL_SSL with the dev stack's CA, through the `kafka.consumer.*` /
//! `kafka.producer.*` pass-through; a wrong password is fatal and never
//! shown.

use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::common::kafka;
use crate::common::service::{self, Fixture};
use serde_json::json;

/// The SCRAM listener and its credentials (`scripts/dev-stack env`).
pub(super) struct Scram {
    pub(super) brokers: String,
    pub(super) mechanism: String,
    pub(super) username: String,
    pub(super) password: String,
}

pub(super) fn scram() -> Scram {
    Scram {
        brokers: env_or("DEDUCTOR_KAFKA_SASL_BROKERS", "127.0.0.1:9094"),
        mechanism: env_or("DEDUCTOR_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
        username: env_or("DEDUCTOR_KAFKA_SASL_USERNAME", "deductor"),
        password: env_or("DEDUCTOR_KAFKA_SASL_PASSWORD", "deductor-secret"),
    }
}

/// The SASL_SSL listener and the CA that signed its certificate.
pub(super) fn tls_brokers() -> String {
    env_or("DEDUCTOR_KAFKA_TLS_BROKERS", "127.0.0.1:9095")
}

pub(super) fn tls_ca() -> String {
    std::env::var("DEDUCTOR_KAFKA_TLS_CA").unwrap_or_else(|_| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(".stack/kafka/tls/ca.pem")
            .display()
            .to_string()
    })
}

/// `kafka.consumer.*` and `kafka.producer.*` overrides for one librdkafka
/// property set, plus the brokers.
pub(super) fn kafka_overrides(brokers: &str, props: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut o = vec![("kafka.brokers".to_owned(), brokers.to_owned())];
    for client in ["consumer", "producer"] {
        for (k, v) in props {
            o.push((format!("kafka.{client}.{k}"), (*v).to_owned()));
        }
    }
    o
}

pub(super) fn scram_props<'a>(
    s: &'a Scram,
    protocol: &'a str,
    password: &'a str,
) -> Vec<(&'a str, &'a str)> {
    vec![
        ("security.protocol", protocol),
        ("sasl.mechanism", s.mechanism.as_str()),
        ("sasl.username", s.username.as_str()),
        ("sasl.password", password),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn pipeline_over_sasl_scram() {
    let f = Fixture::new("sec-scram", 1).await;
    let s = scram();
    let settings = settings_with(
        &f,
        &kafka_overrides(&s.brokers, &scram_props(&s, "SASL_PLAINTEXT", &s.password)),
    );
    round_trip(&f, settings).await;
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn wrong_scram_password_is_fatal_and_never_shown() {
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
        out.1.contains("refused the login") && out.1.contains("Authentication"),
        "check does not say the login was refused:\n{}",
        out.1
    );
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

/// The consumer logs in, the producer does not (a typo in one of the two
/// property maps): the service stops with the producer's error instead of
/// retrying outcomes forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn wrong_producer_password_alone_is_fatal() {
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
pub(super) async fn pipeline_over_sasl_ssl_with_a_private_ca() {
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
