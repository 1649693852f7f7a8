//! The settings' tests: layers, keys named in errors, secrets, redaction.

use super::*;
use std::path::Path;

fn load(env: &[(&str, &str)], overrides: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    let overrides: Vec<(String, String)> = overrides
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::load_from_env(None, &overrides, env)
}

#[test]
fn defaults_load_and_validate() {
    let s = load(&[], &[]).expect("defaults are valid");
    assert_eq!(s.kafka.input_topic, "orders");
    assert_eq!(s.kafka.outcome_topic, "deduct-outcomes");
    assert_eq!(s.kafka.dlq_topic, "orders.dlq");
    assert_eq!(s.redis.key_prefix, "promo");
    assert_eq!(s.redis.record_ttl_secs, 30 * 24 * 3600);
    assert_eq!(s.redis.refund_ttl_secs, 7 * 24 * 3600);
}

#[test]
fn the_batch_linger_is_bounded_and_off_by_default() {
    assert_eq!(load(&[], &[]).unwrap().redis.batch_linger_ms, 0);
    let s = load(&[], &[("redis.batch_linger_ms", "100")]).unwrap();
    assert_eq!(s.redis.batch_linger_ms, 100);
    let e = load(&[], &[("redis.batch_linger_ms", "101")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("0 (send what is ready) to 100"), "{e}");
}

#[test]
fn env_overrides_file_and_flags_override_env() {
    let s = load(
        &[
            ("DEDUCTOR_REDIS_POOL_SIZE", "7"),
            ("DEDUCTOR_KAFKA_GROUP_ID", "g-env"),
        ],
        &[("kafka.group_id", "g-flag")],
    )
    .unwrap();
    assert_eq!(s.redis.pool_size, 7);
    assert_eq!(s.kafka.group_id, "g-flag");
}

#[test]
fn librdkafka_properties_pass_through() {
    let s = load(
        &[("DEDUCTOR_KAFKA_CONSUMER_SASL_MECHANISM", "SCRAM-SHA-512")],
        &[("kafka.producer.compression.type", "lz4")],
    )
    .unwrap();
    assert_eq!(
        s.kafka.consumer.get("sasl.mechanism").map(String::as_str),
        Some("SCRAM-SHA-512")
    );
    assert_eq!(
        s.kafka.producer.get("compression.type").map(String::as_str),
        Some("lz4")
    );
    // defaults of the same map are kept
    assert_eq!(
        s.kafka
            .consumer
            .get("auto.offset.reset")
            .map(String::as_str),
        Some("earliest")
    );
}

#[test]
fn unknown_key_is_named() {
    let e = load(&[], &[("redis.pool", "3")]).unwrap_err().to_string();
    assert!(e.contains("pool"), "{e}");
}

#[test]
fn unrelated_deductor_variables_are_ignored() {
    let s = load(
        &[
            ("DEDUCTOR_REDIS_CLUSTER_URL", "redis-cluster://x:1"),
            ("DEDUCTOR_KAFKA_SASL_BROKERS", "x:1"),
            ("DEDUCTOR_CONFIG", ""),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(s.redis.url, "redis://127.0.0.1:6379");
}

#[test]
fn wrong_type_is_named() {
    let e = load(&[("DEDUCTOR_REDIS_POOL_SIZE", "many")], &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("redis.pool_size"), "{e}");
}

#[test]
fn invalid_values_name_key_and_fix() {
    for (key, value, named) in [
        ("redis.url", "http://x", "redis.url"),
        ("redis.command_timeout_ms", "0", "redis.command_timeout_ms"),
        ("redis.record_ttl_secs", "60", "redis.record_ttl_secs"),
        ("kafka.input_topic", "bad topic", "kafka.input_topic"),
        ("kafka.outcome_topic", "orders", "kafka.outcome_topic"),
        ("pipeline.max_in_flight", "1", "pipeline.max_in_flight"),
        ("http.listen", "nowhere", "http.listen"),
        ("redis.key_prefix", "a{b", "redis.key_prefix"),
        ("redis.batch_linger_ms", "101", "redis.batch_linger_ms"),
    ] {
        let e = load(&[], &[(key, value)]).unwrap_err().to_string();
        assert!(e.contains(named), "{key}={value}: {e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
}

#[test]
fn string_keys_keep_numeric_looking_text() {
    let s = load(
        &[
            ("DEDUCTOR_REDIS_PASSWORD", "111111"),
            ("DEDUCTOR_REDIS_USERNAME", "true"),
            ("DEDUCTOR_LOG_LEVEL", "info"),
        ],
        &[
            ("kafka.group_id", "20261130"),
            ("kafka.group_instance_id", "007"),
            ("redis.key_prefix", "1.5"),
        ],
    )
    .expect("numeric-looking strings are strings");
    assert_eq!(s.redis.password, "111111");
    assert_eq!(s.redis.username, "true");
    assert_eq!(s.kafka.group_id, "20261130");
    assert_eq!(s.kafka.group_instance_id, "007", "leading zero kept");
    assert_eq!(s.redis.key_prefix, "1.5");
    let s = load(&[("DEDUCTOR_KAFKA_GROUP_ID", "42")], &[]).unwrap();
    assert_eq!(s.kafka.group_id, "42");
}

#[test]
fn typed_keys_still_parse_from_env_and_flags() {
    let s = load(
        &[
            ("DEDUCTOR_REDIS_RECORD_TTL_SECS", "864000"),
            ("DEDUCTOR_PIPELINE_EXIT_WHEN_DRAINED", "true"),
            ("DEDUCTOR_RETRY_MULTIPLIER", "1.5"),
        ],
        &[
            ("retry.max_interval_ms", "7000"),
            ("redis.tls_insecure_skip_verify", "false"),
        ],
    )
    .unwrap();
    assert_eq!(s.redis.record_ttl_secs, 864_000);
    assert!(s.pipeline.exit_when_drained);
    assert_eq!(s.retry.multiplier, 1.5);
    assert_eq!(s.retry.max_interval_ms, 7000);
    let s = load(&[], &[("retry.multiplier", "3")]).unwrap();
    assert_eq!(s.retry.multiplier, 3.0, "an integer for a float key");
    for (key, value) in [
        ("redis.pool_size", "-1"),
        ("redis.pool_size", "1.5"),
        ("pipeline.exit_when_drained", "yes"),
    ] {
        let e = load(&[], &[(key, value)]).unwrap_err().to_string();
        assert!(e.contains(key), "{key}={value}: {e}");
    }
}

#[test]
fn propagate_headers_is_a_list_from_files_env_and_flags() {
    assert!(load(&[], &[]).unwrap().kafka.propagate_headers.is_empty());
    let s = load(
        &[],
        &[("kafka.propagate_headers", "x-correlation-id, x-tenant")],
    )
    .unwrap();
    assert_eq!(s.kafka.propagate_headers, ["x-correlation-id", "x-tenant"]);
    let s = load(&[("DEDUCTOR_KAFKA_PROPAGATE_HEADERS", "x-a")], &[]).unwrap();
    assert_eq!(s.kafka.propagate_headers, ["x-a"]);
    for bad in ["traceparent", "ce_id", "deductor.error"] {
        let e = load(&[], &[("kafka.propagate_headers", bad)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("kafka.propagate_headers"), "{bad}: {e}");
    }
}

#[test]
fn otlp_endpoint_is_off_or_an_http_url() {
    let s = load(&[], &[]).unwrap();
    assert_eq!(s.tracing.otlp_endpoint, "");
    assert!(load(&[], &[("tracing.otlp_endpoint", "http://c:4318")]).is_ok());
    let e = load(&[], &[("tracing.otlp_endpoint", "c:4318")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("tracing.otlp_endpoint"), "{e}");
}

#[test]
fn the_sentinels_password_is_read_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("sentinel");
    std::fs::write(&f, "s3cret\n").unwrap();
    let path = f.to_string_lossy().into_owned();
    let url = ("redis.url", "redis-sentinel://127.0.0.1:26379/mymaster");
    let s = load(&[], &[url, ("redis.sentinel_password_file", path.as_str())]).unwrap();
    assert_eq!(s.redis.sentinel_password, "s3cret");
    let e = load(
        &[],
        &[
            url,
            ("redis.sentinel_password_file", path.as_str()),
            ("redis.sentinel_password", "inline"),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("redis.sentinel_password_file"), "{e}");
}

#[test]
fn ttls_are_bounded() {
    let ok = MAX_TTL_SECS.to_string();
    let s = load(&[], &[("redis.record_ttl_secs", ok.as_str())]).unwrap();
    assert_eq!(s.redis.record_ttl_secs, 315_360_000);
    let over = (MAX_TTL_SECS + 1).to_string();
    for (overrides, named) in [
        (
            vec![("redis.record_ttl_secs", "9999999999999999")],
            "redis.record_ttl_secs",
        ),
        (
            vec![("redis.record_ttl_secs", over.as_str())],
            "redis.record_ttl_secs",
        ),
        (
            vec![
                ("redis.record_ttl_secs", over.as_str()),
                ("redis.refund_ttl_secs", over.as_str()),
            ],
            "redis.refund_ttl_secs",
        ),
    ] {
        let e = load(&[], &overrides).unwrap_err().to_string();
        assert!(e.contains(named), "{overrides:?}: {e}");
        assert!(e.contains("315360000"), "names the maximum: {e}");
    }
}

#[test]
fn sentinel_urls_and_the_gate_are_checked() {
    let s = load(
        &[],
        &[
            ("redis.url", "redis-sentinel://a:26379,b:26380/mymaster"),
            ("redis.sentinel_password", "x"),
            ("redis.wait_replicas", "1"),
        ],
    )
    .unwrap();
    assert_eq!(s.redis.wait_replicas, 1);
    assert_eq!(s.redis.wait_timeout_ms, 1000);
    assert!(!format!("{:?}", s.redis).contains("\"x\""));
    for (pairs, key, says) in [
        (
            vec![("redis.url", "redis-sentinel://a:26379")],
            "redis.url",
            "/SERVICE",
        ),
        (
            vec![("redis.url", "redis-sentinel://u:hunter2@a:port/m")],
            "redis.url",
            "port",
        ),
        (
            vec![("redis.sentinel_username", "w")],
            "redis.sentinel_password",
            "not a redis-sentinel",
        ),
        (
            vec![("redis.wait_replicas", "17")],
            "redis.wait_replicas",
            "17",
        ),
        (
            vec![("redis.wait_replicas", "1"), ("redis.wait_timeout_ms", "0")],
            "redis.wait_timeout_ms",
            "block forever",
        ),
    ] {
        let e = load(&[], &pairs).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains(says), "{pairs:?}: {e}");
        assert!(!e.contains("hunter2"), "{e}");
    }
    // Off: the timeout is not used, so not checked.
    load(&[], &[("redis.wait_timeout_ms", "0")]).unwrap();
}

#[test]
fn redis_tls_settings_are_checked() {
    let ca = std::env::temp_dir().join(format!("deductor-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, "not checked here").unwrap();
    let ca_path = ca.display().to_string();
    let s = load(
        &[
            ("DEDUCTOR_REDIS_URL", "rediss://127.0.0.1:6380"),
            ("DEDUCTOR_REDIS_TLS_CA_FILE", ca_path.as_str()),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(s.redis.tls_ca_file, ca_path);
    assert!(!s.redis.tls_insecure_skip_verify);
    for (overrides, named) in [
        (
            vec![
                ("redis.url", "rediss://h:1"),
                ("redis.tls_ca_file", "/nonexistent/ca.pem"),
            ],
            "redis.tls_ca_file",
        ),
        (
            vec![("redis.tls_ca_file", ca_path.as_str())],
            "redis.tls_ca_file",
        ),
        (
            vec![("redis.tls_insecure_skip_verify", "true")],
            "redis.tls_insecure_skip_verify",
        ),
    ] {
        let e = load(&[], &overrides).unwrap_err().to_string();
        assert!(e.contains(named), "{overrides:?}: {e}");
    }
    let _ = std::fs::remove_file(&ca);
}

#[test]
fn secrets_are_read_from_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, content: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path.display().to_string()
    };
    let redis = file("redis", b"111111\n");
    let kafka = file("kafka", b" k pass \r\n");
    let s = load(
        &[("DEDUCTOR_REDIS_PASSWORD_FILE", redis.as_str())],
        &[("kafka.sasl_password_file", kafka.as_str())],
    )
    .unwrap();
    // One trailing line break dropped, everything else kept, as text.
    assert_eq!(s.redis.password, "111111");
    assert_eq!(s.redis.password_file, redis);
    for client in [&s.kafka.consumer, &s.kafka.producer] {
        assert_eq!(
            client.get("sasl.password").map(String::as_str),
            Some(" k pass ")
        );
    }
    let shown = format!("{s:?}");
    assert!(
        !shown.contains("111111") && !shown.contains("k pass"),
        "{shown}"
    );
    assert!(shown.contains(&redis), "the path stays visible: {shown}");
}

#[test]
fn secret_files_name_their_key_when_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, content: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path.display().to_string()
    };
    let good = file("good", b"pw");
    let empty = file("empty", b"\n");
    let binary = file("binary", b"\xff\xfe");
    let missing = dir.path().join("missing").display().to_string();
    // (overrides, the key the error names, a detail it gives)
    type Case<'a> = (Vec<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec![("redis.password_file", &good), ("redis.password", "inline")],
            "redis.password_file",
            "redis.password",
        ),
        (
            vec![
                ("kafka.sasl_password_file", &good),
                ("kafka.producer.sasl.password", "inline"),
            ],
            "kafka.sasl_password_file",
            "kafka.producer",
        ),
        (
            vec![("redis.password_file", &missing)],
            "redis.password_file",
            &missing,
        ),
        (
            vec![("kafka.sasl_password_file", &missing)],
            "kafka.sasl_password_file",
            &missing,
        ),
        (
            vec![("redis.password_file", &empty)],
            "redis.password_file",
            "is empty",
        ),
        (
            vec![("redis.password_file", &binary)],
            "redis.password_file",
            "not UTF-8",
        ),
        (
            vec![("kafka.sasl_password_file", dir.path().to_str().unwrap())],
            "kafka.sasl_password_file",
            "cannot read",
        ),
    ];
    for (overrides, key, detail) in cases {
        let e = load(&[], &overrides).unwrap_err().to_string();
        assert!(
            e.contains(&format!("config key {key}:")) && e.contains(detail),
            "{overrides:?}: {e}"
        );
        assert!(!e.contains("inline"), "a secret is never shown: {e}");
    }
    // The consumer's inline password conflicts too, from the environment.
    let e = load(
        &[
            ("DEDUCTOR_KAFKA_SASL_PASSWORD_FILE", good.as_str()),
            ("DEDUCTOR_KAFKA_CONSUMER_SASL_PASSWORD", "inline"),
        ],
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("kafka.sasl_password_file") && e.contains("kafka.consumer"),
        "{e}"
    );
}

#[test]
fn missing_config_file_is_reported() {
    let e = Settings::load_from_env(Some(Path::new("/nonexistent.toml")), &[], Vec::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent.toml"), "{e}");
}

#[test]
fn secrets_are_redacted() {
    assert_eq!(redact_url("redis://u:pw@h:1"), "redis://u:***@h:1");
    assert_eq!(redact_url("redis://h:1"), "redis://h:1");
    let mut s = load(&[], &[]).unwrap();
    s.redis.password = "hunter2".into();
    assert!(!format!("{:?}", s.redis).contains("hunter2"));
    for client in [&mut s.kafka.consumer, &mut s.kafka.producer] {
        client.insert("sasl.password".into(), "hunter3".into());
        client.insert("ssl.key.password".into(), "hunter4".into());
    }
    let all = format!("{s:?}");
    assert!(!all.contains("hunter"), "{all}");
    assert!(
        all.contains("sasl.password"),
        "the key itself stays visible"
    );
}

#[test]
fn delivery_reads_both_modes_and_names_a_wrong_one() {
    assert_eq!(
        load(&[], &[]).unwrap().kafka.delivery,
        Delivery::AtLeastOnce
    );
    let s = load(&[("DEDUCTOR_KAFKA_DELIVERY", "exactly_once")], &[]).unwrap();
    assert_eq!(s.kafka.delivery, Delivery::ExactlyOnce);
    let e = load(&[], &[("kafka.delivery", "exactly-once")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("delivery") && e.contains("exactly_once"), "{e}");
}

#[test]
fn exactly_once_refuses_what_its_aborts_and_fencing_cannot_work_with() {
    let eos = ("kafka.delivery", "exactly_once");
    for (key, value, named) in [
        (
            "kafka.consumer.partition.assignment.strategy",
            "cooperative-sticky",
            "partition.assignment.strategy",
        ),
        (
            "kafka.consumer.group.protocol",
            "consumer",
            "group.protocol",
        ),
        (
            "kafka.consumer.isolation.level",
            "read_uncommitted",
            "isolation.level",
        ),
        ("kafka.producer.transactional.id", "x", "transactional.id"),
        (
            "kafka.producer.transaction.timeout.ms",
            "10000",
            "kafka.produce_timeout_ms",
        ),
    ] {
        let e = load(&[], &[eos, (key, value)]).unwrap_err().to_string();
        assert!(e.contains(named), "{key}={value}: {e}");
        // The same setting is fine with at_least_once.
        assert!(
            load(&[], &[(key, value)]).is_ok(),
            "{key}={value} at_least_once"
        );
    }
    assert!(load(
        &[],
        &[
            eos,
            ("kafka.consumer.partition.assignment.strategy", "roundrobin")
        ]
    )
    .is_ok());
    let e = load(&[], &[("kafka.transaction_interval_ms", "0")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("kafka.transaction_interval_ms"), "{e}");
}

#[test]
fn a_prefetch_budget_below_the_least_is_refused_by_name() {
    let e = load(&[], &[("kafka.prefetch_budget_kib", "10")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("kafka.prefetch_budget_kib"), "{e}");
    assert!(e.contains("16384"), "the fix names a value: {e}");
    let s = load(&[], &[("kafka.prefetch_budget_kib", "65536")]).unwrap();
    assert_eq!(s.kafka.prefetch_budget_kib, 65_536);
}

#[test]
fn the_transactional_id_is_stable_with_static_membership_else_unique_to_the_process() {
    let mut k = load(&[], &[]).unwrap().kafka;
    k.group_id = "deductor".into();
    k.group_instance_id = "deductor-2".into();
    assert_eq!(k.transactional_id(), "deductor-deductor-2");
    k.group_instance_id.clear();
    let id = k.transactional_id();
    assert!(id.starts_with("deductor-"), "{id}");
    assert!(id.ends_with(&format!("-{}", std::process::id())), "{id}");
    k.transactional_id = "fixed".into();
    assert_eq!(k.transactional_id(), "fixed");
}

/// Issue 24 item 9: a typo that leaves the credentials in a url without
/// `://` never prints the password, in `redact_url` nor in the error.
#[test]
fn malformed_urls_never_show_their_password() {
    for (url, shown) in [
        ("redis//admin:pw1@host:6379", "redis//admin:***@host:6379"),
        ("admin:pw1@host", "admin:***@host"),
        ("redis:/admin:pw1@host", "redis:***@host"),
        ("redis://:pw1@host", "redis://:***@host"),
        ("redis://pw1@host", "redis://***@host"),
        ("redis://u:p@w1@host", "redis://u:***@host"),
        ("redis://u:pw1/x@host", "redis://u:***@host"),
    ] {
        assert_eq!(redact_url(url), shown, "{url}");
        let e = load(&[], &[("redis.url", url)]);
        if let Err(e) = e {
            let e = e.to_string();
            assert!(!e.contains("pw1") && !e.contains("w1@"), "{url}: {e}");
        }
    }
    assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
}

/// Issue 24 item 12: SCAN glob characters in the key prefix are refused.
#[test]
fn key_prefix_refuses_glob_characters() {
    for prefix in ["pr[o]mo", "promo*", "pro?mo", "pro\\mo", "pro]mo"] {
        let e = load(&[], &[("redis.key_prefix", prefix)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("redis.key_prefix"), "{prefix}: {e}");
    }
    assert!(load(&[], &[("redis.key_prefix", "promo-eu.1")]).is_ok());
}

/// Issue 24 item 10: a misspelled or unknown secret-looking property is
/// redacted like the known ones.
#[test]
fn secret_looking_properties_are_redacted() {
    let mut s = load(&[], &[]).unwrap();
    for (k, v) in [
        ("sasl.passwrd", "hunter5"),
        ("sasl.oauthbearer.client.secret", "hunter6"),
        ("ssl.keystore.pasword", "hunter7"),
        ("sasl.jaas.config", "hunter8"),
    ] {
        s.kafka.consumer.insert(k.into(), v.into());
        s.kafka.producer.insert(k.into(), v.into());
    }
    let all = format!("{s:?}");
    assert!(!all.contains("hunter"), "{all}");
    assert!(is_secret_property("sasl.passwrd"));
    assert!(!is_secret_property("session.timeout.ms"));
}

#[test]
fn a_password_in_the_redis_url_is_refused_without_echoing_it() {
    for url in [
        "redis://deductor:hunter2@h:6379",
        "redis://:hunter2@h:6379/0",
        "rediss://u:hunter2@h:6380",
        "redis-cluster://u:hunter2@h:7000?node=h2:7001",
        "redis-sentinel://u:hunter2@a:26379,b:26379/mymaster",
    ] {
        let e = load(&[], &[("redis.url", url)]).unwrap_err().to_string();
        assert!(
            e.contains("redis.url") && e.contains("redis.password") && e.contains("password_file"),
            "{url}: {e}"
        );
        assert!(!e.contains("hunter2"), "{url}: {e}");
        let e = load(&[("DEDUCTOR_REDIS_URL", url)], &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("redis.url") && !e.contains("hunter2"),
            "{url}: {e}"
        );
    }
    // A user without a password, and the password where it belongs, load.
    for url in [
        "redis://deductor@h:6379",
        "redis://h:6379",
        "redis://:@h:6379",
    ] {
        assert!(load(&[], &[("redis.url", url)]).is_ok(), "{url}");
    }
    let s = load(
        &[("DEDUCTOR_REDIS_PASSWORD", "hunter2")],
        &[
            ("redis.url", "redis://h:6379"),
            ("redis.username", "deductor"),
        ],
    )
    .unwrap();
    assert_eq!(s.redis.password, "hunter2");
}
