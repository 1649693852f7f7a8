//! [`Settings::validate`]: what the types cannot check, a function per
//! section. Each error names its key, the problem, and how to fix it.

use std::path::Path;

use super::*;
use crate::ledger::sentinel::SentinelUrl;

/// A [`ConfigError::Invalid`]: the key, what is wrong, how to fix it.
fn bad(key: &'static str, problem: impl Into<String>, fix: &'static str) -> ConfigError {
    ConfigError::Invalid {
        key,
        problem: problem.into(),
        fix,
    }
}

impl Settings {
    /// Checks every section in turn; the first problem is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        kafka(&self.kafka)?;
        tracing(&self.tracing)?;
        redis(&self.redis)?;
        pipeline(&self.pipeline)?;
        retry(&self.retry)?;
        http(&self.http)?;
        log(&self.log)
    }
}

/// `kafka.*`: headers to propagate, brokers, topics, group, produce timeout.
fn kafka(k: &KafkaSettings) -> Result<(), ConfigError> {
    for h in &k.propagate_headers {
        let reserved = h.eq_ignore_ascii_case("traceparent")
            || h.eq_ignore_ascii_case("tracestate")
            || h.eq_ignore_ascii_case("content-type")
            || h.to_ascii_lowercase().starts_with("ce_")
            || h.to_ascii_lowercase().starts_with("deductor.");
        if h.trim().is_empty() || h.trim() != h || reserved {
            return Err(bad(
                "kafka.propagate_headers",
                format!("{h:?} cannot be propagated"),
                "list header names without blanks, other than traceparent, tracestate, content-type, ce_* and deductor.*",
            ));
        }
    }
    if k.brokers.trim().is_empty() {
        return Err(bad(
            "kafka.brokers",
            "is empty",
            "set it to host:port[,host:port]",
        ));
    }
    for (key, topic) in [
        ("kafka.input_topic", &k.input_topic),
        ("kafka.outcome_topic", &k.outcome_topic),
        ("kafka.dlq_topic", &k.dlq_topic),
    ] {
        if topic.is_empty()
            || topic.len() > 249
            || !topic
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(bad(
                key,
                format!("{topic:?} is not a valid topic name"),
                "use 1 to 249 characters of A-Z a-z 0-9 . _ -",
            ));
        }
    }
    if k.input_topic == k.outcome_topic || k.input_topic == k.dlq_topic {
        return Err(bad(
            "kafka.outcome_topic",
            "the outcome or dead-letter topic equals the input topic",
            "give each of input_topic, outcome_topic and dlq_topic its own topic",
        ));
    }
    if k.group_id.trim().is_empty() {
        return Err(bad(
            "kafka.group_id",
            "is empty",
            "name the consumer group, e.g. deductor",
        ));
    }
    if k.produce_timeout_ms == 0 {
        return Err(bad(
            "kafka.produce_timeout_ms",
            "is 0",
            "use a positive number of milliseconds, e.g. 30000",
        ));
    }
    if k.prefetch_budget_kib < crate::kafka::consumer::MIN_PREFETCH_BUDGET_KIB {
        return Err(bad(
            "kafka.prefetch_budget_kib",
            format!(
                "is {} (below {} KiB)",
                k.prefetch_budget_kib,
                crate::kafka::consumer::MIN_PREFETCH_BUDGET_KIB
            ),
            "give the prefetch over all partitions in KiB, e.g. 16384 (16 MiB)",
        ));
    }
    if k.transaction_interval_ms == 0 {
        return Err(bad(
            "kafka.transaction_interval_ms",
            "is 0",
            "use a positive number of milliseconds, e.g. 100",
        ));
    }
    if k.delivery == Delivery::ExactlyOnce {
        exactly_once(k)?;
    }
    Ok(())
}

/// `kafka.delivery = "exactly_once"`: what the transactions depend on.
fn exactly_once(k: &KafkaSettings) -> Result<(), ConfigError> {
    // A revoke aborts the open transaction, which holds outcomes of every
    // partition: every partition must be given up with it, as the eager
    // assignors (range, roundrobin) do at each rebalance.
    let strategy = k
        .consumer
        .get("partition.assignment.strategy")
        .map(String::as_str)
        .unwrap_or("");
    if strategy.contains("cooperative") {
        return Err(bad(
            "kafka.consumer.\"partition.assignment.strategy\"",
            format!("{strategy:?} is incremental; exactly_once aborts the whole transaction on a revoke"),
            "use an eager assignor (range, roundrobin: the default) with kafka.delivery = \"exactly_once\"",
        ));
    }
    if k.consumer
        .get("group.protocol")
        .is_some_and(|v| v == "consumer")
    {
        return Err(bad(
            "kafka.consumer.\"group.protocol\"",
            "\"consumer\" (KIP-848) rebalances incrementally; exactly_once aborts the whole transaction on a revoke",
            "leave it unset (classic) with kafka.delivery = \"exactly_once\"",
        ));
    }
    if k.consumer
        .get("isolation.level")
        .is_some_and(|v| v == "read_uncommitted")
    {
        return Err(bad(
            "kafka.consumer.\"isolation.level\"",
            "read_uncommitted lets a new owner read offsets a pending transaction has not committed",
            "leave it unset (read_committed) with kafka.delivery = \"exactly_once\"",
        ));
    }
    if k.producer.contains_key("transactional.id") {
        return Err(bad(
            "kafka.producer.\"transactional.id\"",
            "is set as a pass-through property",
            "set kafka.transactional_id instead (or leave it empty for the default scheme)",
        ));
    }
    let txn_timeout = match k.producer.get("transaction.timeout.ms") {
        Some(v) => v.parse::<u64>().map_err(|_| {
            bad(
                "kafka.producer.\"transaction.timeout.ms\"",
                format!("{v:?} is not a number of milliseconds"),
                "use e.g. \"60000\"",
            )
        })?,
        None => 60_000,
    };
    if k.produce_timeout_ms > txn_timeout {
        return Err(bad(
            "kafka.produce_timeout_ms",
            format!(
                "{} ms is longer than the transaction timeout ({txn_timeout} ms)",
                k.produce_timeout_ms
            ),
            "lower kafka.produce_timeout_ms or raise kafka.producer.\"transaction.timeout.ms\"",
        ));
    }
    Ok(())
}

/// `tracing.*`: the OTLP endpoint and the service name.
fn tracing(t: &TracingSettings) -> Result<(), ConfigError> {
    let exported = !t.otlp_endpoint.is_empty();
    let is_http = t.otlp_endpoint.starts_with("http://") || t.otlp_endpoint.starts_with("https://");
    if exported && !is_http {
        return Err(bad(
            "tracing.otlp_endpoint",
            format!("{:?} is not an http(s) URL", t.otlp_endpoint),
            "set it to http://collector:4318 (OTLP/HTTP), or leave it empty to export nothing",
        ));
    }
    if t.service_name.trim().is_empty() {
        return Err(bad(
            "tracing.service_name",
            "is empty",
            "set it to the name spans are reported under, e.g. deductor",
        ));
    }
    Ok(())
}

/// `redis.*`: the url and its credentials, TLS, the gate, the pool, timeouts, the key prefix, TTLs.
/// True when the url's user info holds a password: `scheme://user:pw@…` or
/// `scheme://:pw@…` (an empty password after the colon counts as none).
fn url_has_password(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.rsplit_once('@')
        .and_then(|(auth, _)| auth.split_once(':'))
        .is_some_and(|(_, password)| !password.is_empty())
}

fn redis(r: &RedisSettings) -> Result<(), ConfigError> {
    let sentinel = SentinelUrl::is_sentinel(&r.url);
    if ![
        "redis://",
        "rediss://",
        "redis-cluster://",
        "rediss-cluster://",
    ]
    .iter()
    .any(|s| r.url.starts_with(s))
        && !sentinel
    {
        return Err(bad(
            "redis.url",
            format!("{:?} is not a Redis url", redact_url(&r.url)),
            "use redis://host:port, rediss://host:port, redis-cluster://host:port?node=host:port \
                 or redis-sentinel://host:port[,host:port...]/SERVICE",
        ));
    }
    if sentinel {
        if let Err(problem) = SentinelUrl::parse(&r.url) {
            return Err(bad(
                "redis.url",
                format!("{:?}: {problem}", redact_url(&r.url)),
                "use redis-sentinel://host:port[,host:port...]/SERVICE (rediss-sentinel:// for TLS), \
                 SERVICE being the name the sentinels monitor the primary under",
            ));
        }
    } else if !r.sentinel_username.is_empty() || !r.sentinel_password.is_empty() {
        return Err(bad(
            "redis.sentinel_password",
            "sentinel credentials are set but redis.url is not a redis-sentinel:// url",
            "use redis-sentinel://host:port/SERVICE, or leave sentinel_username and sentinel_password empty",
        ));
    }
    if url_has_password(&r.url) {
        // Not echoed: the url is the secret's carrier here.
        return Err(bad(
            "redis.url",
            "holds a password (user:password@ in the url), which would end up in config files and ConfigMaps",
            "leave only redis://[user@]host:port in the url and set the password in redis.password, \
             DEDUCTOR_REDIS_PASSWORD or a file named by redis.password_file (the chart: secret.redisPassword)",
        ));
    }
    let tls = r.url.starts_with("rediss://")
        || r.url.starts_with("rediss-cluster://")
        || r.url.starts_with("rediss-sentinel://");
    if !r.tls_ca_file.is_empty() {
        if !tls {
            return Err(bad(
                "redis.tls_ca_file",
                "is set but redis.url is not a TLS url",
                "use rediss://host:port (or rediss-cluster://), or leave tls_ca_file empty",
            ));
        }
        if !Path::new(&r.tls_ca_file).is_file() {
            return Err(bad(
                "redis.tls_ca_file",
                format!("{} does not exist or is not a file", r.tls_ca_file),
                "name a PEM file of CA certificates, or leave it empty for the system's",
            ));
        }
    }
    if r.tls_insecure_skip_verify && !tls {
        return Err(bad(
            "redis.tls_insecure_skip_verify",
            "is on but redis.url is not a TLS url",
            "use rediss://host:port, or turn it off",
        ));
    }
    if r.wait_replicas > MAX_WAIT_REPLICAS {
        return Err(bad(
            "redis.wait_replicas",
            format!("{} is above {MAX_WAIT_REPLICAS}", r.wait_replicas),
            "use 0 (off) or the number of replicas that must have each write, e.g. 1",
        ));
    }
    if r.wait_replicas > 0 && !(1..=MAX_WAIT_TIMEOUT_MS).contains(&r.wait_timeout_ms) {
        return Err(bad(
            "redis.wait_timeout_ms",
            format!(
                "{} is out of range (0 would block forever on a lost replica)",
                r.wait_timeout_ms
            ),
            "use 1 to 60000 milliseconds, e.g. 1000",
        ));
    }
    if !(1..=512).contains(&r.batch_max_lines) {
        return Err(bad(
            "redis.batch_max_lines",
            format!("{} is out of range", r.batch_max_lines),
            "use 1 (no batching) to 512, e.g. 32",
        ));
    }
    if r.batch_linger_ms > MAX_BATCH_LINGER_MS {
        return Err(bad(
            "redis.batch_linger_ms",
            format!("{} is out of range", r.batch_linger_ms),
            "use 0 (send what is ready) to 100 milliseconds, e.g. 1",
        ));
    }
    if r.pool_size == 0 || r.pool_size > 64 {
        return Err(bad(
            "redis.pool_size",
            format!("{} is out of range", r.pool_size),
            "use 1 to 64",
        ));
    }
    if r.command_timeout_ms == 0 {
        return Err(bad(
            "redis.command_timeout_ms",
            "is 0 (no timeout: a lost reply would hang the partition)",
            "use a positive number of milliseconds, e.g. 2000",
        ));
    }
    if r.connect_timeout_ms == 0 {
        return Err(bad(
            "redis.connect_timeout_ms",
            "is 0",
            "use a positive number of milliseconds, e.g. 2000",
        ));
    }
    // `{` `}` would move the hash tag; `* ? [ ] \\` are SCAN MATCH glob
    // characters: the operator tools' SCAN patterns would match other keys
    // or none (`promo list` and `audit` would see nothing).
    if r.key_prefix.is_empty()
        || r.key_prefix
            .contains(['{', '}', ' ', '*', '?', '[', ']', '\\'])
    {
        return Err(bad(
            "redis.key_prefix",
            format!(
                "{:?} is empty or contains {{, }}, a space or a glob character (* ? [ ] \\)",
                r.key_prefix
            ),
            "use a plain word such as promo",
        ));
    }
    if r.record_ttl_secs < r.refund_ttl_secs || r.record_ttl_secs == 0 {
        return Err(bad(
            "redis.record_ttl_secs",
            format!(
                "{} is shorter than redis.refund_ttl_secs ({}) or 0",
                r.record_ttl_secs, r.refund_ttl_secs
            ),
            "records must outlive the refund window: raise record_ttl_secs (default 2592000 = 30 days)",
        ));
    }
    if r.refund_ttl_secs == 0 {
        return Err(bad(
            "redis.refund_ttl_secs",
            "is 0",
            "use a positive number of seconds, e.g. 604800",
        ));
    }
    // The scripts refuse a TTL Redis cannot take (BADARG, fatal on every
    // deduct); caught here at start instead.
    for (key, ttl) in [
        ("redis.refund_ttl_secs", r.refund_ttl_secs),
        ("redis.record_ttl_secs", r.record_ttl_secs),
    ] {
        if ttl > MAX_TTL_SECS {
            return Err(bad(
                key,
                format!("{ttl} is above the maximum {MAX_TTL_SECS} (10 years)"),
                "use at most 315360000 seconds, e.g. 2592000 (30 days)",
            ));
        }
    }
    Ok(())
}

/// `pipeline.*`: in-flight bounds and the commit interval.
fn pipeline(p: &PipelineSettings) -> Result<(), ConfigError> {
    if p.max_in_flight_per_partition == 0 {
        return Err(bad(
            "pipeline.max_in_flight_per_partition",
            "is 0",
            "use 1 or more",
        ));
    }
    if p.max_in_flight < p.max_in_flight_per_partition {
        return Err(bad(
            "pipeline.max_in_flight",
            format!(
                "{} is below pipeline.max_in_flight_per_partition ({})",
                p.max_in_flight, p.max_in_flight_per_partition
            ),
            "make it at least max_in_flight_per_partition",
        ));
    }
    if p.commit_interval_ms == 0 {
        return Err(bad(
            "pipeline.commit_interval_ms",
            "is 0",
            "use a positive number of milliseconds, e.g. 1000",
        ));
    }
    Ok(())
}

/// `retry.*`: the backoff's intervals and multiplier.
fn retry(t: &RetrySettings) -> Result<(), ConfigError> {
    if t.initial_interval_ms == 0 || t.max_interval_ms < t.initial_interval_ms {
        return Err(bad(
            "retry.max_interval_ms",
            "is below retry.initial_interval_ms, or initial_interval_ms is 0",
            "use 0 < initial_interval_ms <= max_interval_ms",
        ));
    }
    if !(t.multiplier >= 1.0 && t.multiplier <= 10.0) {
        return Err(bad(
            "retry.multiplier",
            format!("{} is out of range", t.multiplier),
            "use 1.0 to 10.0",
        ));
    }
    Ok(())
}

/// `http.listen`: empty, or an address; the connection limits in range.
fn http(h: &HttpSettings) -> Result<(), ConfigError> {
    if !h.listen.is_empty() && h.listen.parse::<std::net::SocketAddr>().is_err() {
        return Err(bad(
            "http.listen",
            format!("{:?} is not an address", h.listen),
            "use ip:port such as 0.0.0.0:9464, or empty to disable",
        ));
    }
    for (key, v) in [
        ("http.header_read_timeout_ms", h.header_read_timeout_ms),
        ("http.idle_timeout_ms", h.idle_timeout_ms),
    ] {
        if !(100..=600_000).contains(&v) {
            return Err(bad(
                key,
                format!("{v} is out of range"),
                "use 100 to 600000 (milliseconds)",
            ));
        }
    }
    if !(1..=10_000).contains(&h.max_connections) {
        return Err(bad(
            "http.max_connections",
            format!("{} is out of range", h.max_connections),
            "use 1 to 10000",
        ));
    }
    Ok(())
}

/// `log.level`: a tracing filter.
fn log(l: &LogSettings) -> Result<(), ConfigError> {
    if tracing_subscriber::EnvFilter::try_new(&l.level).is_err() {
        return Err(bad(
            "log.level",
            format!("{:?} is not a filter", l.level),
            "use e.g. info or deductor=debug",
        ));
    }
    Ok(())
}
