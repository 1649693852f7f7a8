//! Settings that weaken security are warned about by `check` (and counted
//! in its JSON) and by `run`; `check` tests the producer's own settings;
//! the same failure gives the same exit code from `check`, `run` and the
//! admin commands (docs/operations.md, "Exit codes").

use std::time::{Duration, Instant};

use super::kafka_sasl::{kafka_overrides, scram, scram_props, tls_brokers, tls_ca};
use super::redis_tls::private_redis;
use super::*;
use crate::common::service::{self, Fixture};

fn env_of(f: &Fixture, o: &[(String, String)]) -> Vec<(String, String)> {
    let extra: Vec<(&str, &str)> = o.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    f.env(&extra)
}

fn push(o: &mut Vec<(String, String)>, k: &str, v: &str) {
    o.push((k.to_owned(), v.to_owned()));
}

/// `deductor <args>` with `env`: (exit code, stdout + stderr).
fn deductor(env: &[(String, String)], args: &[&str]) -> (i32, String) {
    let out = service::command(env)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running deductor");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// `deductor run` with `env`: its exit code within `within`, and its log.
fn run_exit(env: &[(String, String)], within: Duration) -> (i32, String) {
    let mut child = service::spawn(env, &["run"]);
    let status = child.wait(within).unwrap_or_else(|| {
        panic!(
            "deductor run still runs after {within:?}; log:\n{}",
            child.log_tail(30)
        )
    });
    let log = std::fs::read_to_string(&child.log).unwrap_or_default();
    (status.code().unwrap_or(-1), log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_run_warn_about_every_weakened_setting() {
    let f = Fixture::new("sec-weak", 1).await;
    let redis = private_redis(true).await;
    let s = scram();
    let ca = tls_ca();
    let mut props = scram_props(&s, "SASL_SSL", &s.password);
    props.push(("ssl.ca.location", ca.as_str()));
    let mut o = kafka_overrides(&tls_brokers(), &props);
    push(
        &mut o,
        "kafka.consumer.enable.ssl.certificate.verification",
        "false",
    );
    push(
        &mut o,
        "kafka.producer.ssl.endpoint.identification.algorithm",
        "none",
    );
    push(
        &mut o,
        "redis.url",
        &format!("rediss://127.0.0.1:{}", redis.port),
    );
    push(&mut o, "redis.tls_insecure_skip_verify", "true");
    push(&mut o, "http.listen", "0.0.0.0:0");
    let env = env_of(&f, &o);
    let expected = [
        "kafka.consumer.\"enable.ssl.certificate.verification\" = false",
        "kafka.producer.\"ssl.endpoint.identification.algorithm\" = none",
        "redis.tls_insecure_skip_verify = true",
        "http.listen = \"0.0.0.0:0\"",
    ];

    let o = service::command(&env)
        .args(["check", "--output", "json"])
        .stdin(Stdio::null())
        .output()
        .expect("running deductor check");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "check works with verification off:\n{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let security: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "security")
        .map(|c| {
            assert_eq!(c["status"], "warn", "{v:#}");
            c["detail"].as_str().unwrap()
        })
        .collect();
    for key in expected {
        assert!(
            security.iter().any(|d| d.starts_with(key)),
            "no warning for {key}: {v:#}"
        );
    }
    let warned = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "warn")
        .count();
    assert_eq!(v["warnings"], warned, "every warning counted: {v:#}");
    assert!(warned >= expected.len(), "{v:#}");

    // A password in clear (SASL_PLAINTEXT with PLAIN): warned even when the
    // broker refuses the mechanism.
    let mut plain = kafka_overrides(&scram().brokers, &[("security.protocol", "SASL_PLAINTEXT")]);
    // (The consumer names a mechanism librdkafka has, so that the clients
    // build and `check` gets as far as its warnings.)
    for (k, v) in [
        ("kafka.consumer.sasl.mechanism", "SCRAM-SHA-512"),
        ("kafka.consumer.sasl.username", "u"),
        ("kafka.consumer.sasl.password", "p"),
        ("kafka.producer.sasl.mechanism", "PLAIN"),
        ("kafka.producer.sasl.username", "u"),
        ("kafka.producer.sasl.password", "p"),
    ] {
        push(&mut plain, k, v);
    }
    let (_, out) = deductor(&env_of(&f, &plain), &["check"]);
    assert!(
        out.lines().any(|l| l.starts_with(
            "WARN  security: kafka.producer.\"security.protocol\" = SASL_PLAINTEXT with PLAIN"
        )),
        "no warning for SASL_PLAINTEXT with PLAIN:\n{out}"
    );

    // `run` logs the same warnings at start.
    let mut child = service::spawn(&env, &["run"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(&child.log).unwrap_or_default();
        if expected.iter().all(|k| {
            log.lines().any(|l| {
                l.contains("weakened setting")
                    && (l.contains(k) || l.contains(&k.replace('"', "\\\"")))
            })
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "run did not log every weakened setting; log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    child.kill();
    f.cleanup().await;
}

/// SASL_SSL set only under `[kafka.consumer]`: the producer speaks
/// plaintext to the TLS listener, so `run` could never produce.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_tests_the_producers_own_kafka_settings() {
    let f = Fixture::new("sec-prodchk", 1).await;
    let s = scram();
    let ca = tls_ca();
    let mut props = scram_props(&s, "SASL_SSL", &s.password);
    props.push(("ssl.ca.location", ca.as_str()));
    let mut consumer_only = vec![("kafka.brokers".to_owned(), tls_brokers())];
    for (k, v) in &props {
        push(&mut consumer_only, &format!("kafka.consumer.{k}"), v);
    }
    let (code, out) = deductor(&env_of(&f, &consumer_only), &["check"]);
    assert_ne!(
        code, 0,
        "check passed with the producer unconfigured:\n{out}"
    );
    let line = out
        .lines()
        .find(|l| l.starts_with("FAIL  kafka"))
        .unwrap_or_else(|| panic!("no kafka failure:\n{out}"));
    assert!(
        line.contains("producer"),
        "does not name the producer: {line}"
    );
    let (code, out) = deductor(
        &env_of(&f, &kafka_overrides(&tls_brokers(), &props)),
        &["check"],
    );
    assert_eq!(code, 0, "both configured:\n{out}");
    f.cleanup().await;
}

/// The documented codes: a refused Kafka login and an untrusted broker
/// certificate are 2 (fix the configuration) from `check` and from `run`,
/// which ends by itself with rate-limited logs meanwhile; an untrusted
/// Redis certificate is 2 from `check`, `run` and an admin command, with
/// `rediss://` and `rediss-sentinel://` alike, in one clear line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failure_one_exit_code() {
    let f = Fixture::new("sec-codes", 1).await;
    let s = scram();

    // Wrong SASL password.
    let bad = wrong_password();
    let env = env_of(
        &f,
        &kafka_overrides(&s.brokers, &scram_props(&s, "SASL_PLAINTEXT", &bad)),
    );
    let (code, out) = deductor(&env, &["check"]);
    assert_eq!(code, 2, "check with a wrong SASL password:\n{out}");
    let (code, log) = run_exit(&env, Duration::from_secs(60));
    assert_eq!(code, 2, "run with a wrong SASL password; log:\n{log}");

    // A broker certificate of an unknown CA (no ssl.ca.location).
    let env = env_of(
        &f,
        &kafka_overrides(&tls_brokers(), &scram_props(&s, "SASL_SSL", &s.password)),
    );
    let (code, out) = deductor(&env, &["check"]);
    assert_eq!(
        code, 2,
        "check with an untrusted broker certificate:\n{out}"
    );
    assert!(out.contains("TLS handshake failed"), "{out}");
    let bound = deductor::kafka::refusal::REFUSAL_BOUND;
    let started = Instant::now();
    let (code, log) = run_exit(&env, bound + Duration::from_secs(60));
    assert_eq!(
        code, 2,
        "run with an untrusted broker certificate; log:\n{log}"
    );
    let lines = log.lines().count() as u64;
    let secs = started.elapsed().as_secs().max(1);
    // librdkafka reports ~47 failures a second; the log says one per 10 s.
    assert!(
        lines <= 20 + secs,
        "{lines} log lines in {secs}s, not rate-limited:\n{log}"
    );

    // A Redis certificate of an unknown CA.
    let redis = private_redis(true).await;
    for url in [
        format!("rediss://127.0.0.1:{}", redis.port),
        format!("rediss-sentinel://127.0.0.1:{}/mymaster", redis.port),
    ] {
        let env = f.env(&[("redis.url", &url), ("redis.connect_timeout_ms", "2000")]);
        let (code, out) = deductor(&env, &["check"]);
        assert_eq!(code, 2, "check with {url}:\n{out}");
        let line = out
            .lines()
            .find(|l| l.starts_with("FAIL  redis"))
            .unwrap_or_else(|| panic!("{out}"));
        assert!(line.contains("certificate"), "{line}");
        assert!(!line.contains("ssl/statem"), "an OpenSSL dump: {line}");
        let (code, out) = deductor(&env, &["promo", "show", "p"]);
        assert_eq!(code, 2, "promo show with {url}:\n{out}");
        let (code, log) = run_exit(&env, Duration::from_secs(60));
        assert_eq!(code, 2, "run with {url}; log:\n{log}");
    }
    f.cleanup().await;
}
