//! Settings: `config/default.toml` < `--config FILE` < `DEDUCTOR_*` env < flags.
//!
//! Every layer is merged by figment, then [`Settings::validate`] checks what
//! types cannot: a bad value is reported with its key and how to fix it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::ledger::sentinel::SentinelUrl;

/// The compiled-in defaults: the first layer, and the documentation of every key.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

const ENV_PREFIX: &str = "DEDUCTOR_";
/// The longest TTL accepted for `redis.record_ttl_secs` and
/// `redis.refund_ttl_secs`: 10 years (365-day years), far beyond any refund
/// window and far below what Redis and the scripts can take.
pub const MAX_TTL_SECS: u64 = 10 * 365 * 24 * 3600;

/// More replicas than any sane deployment has: a typo, not a setting.
const MAX_WAIT_REPLICAS: u32 = 16;
/// `WAIT` blocks its connection (and fred's unresponsive check must outlast it).
const MAX_WAIT_TIMEOUT_MS: u64 = 60_000;

const SECTIONS: [&str; 7] = [
    "kafka", "redis", "pipeline", "retry", "http", "log", "tracing",
];

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub kafka: KafkaSettings,
    pub redis: RedisSettings,
    pub pipeline: PipelineSettings,
    pub retry: RetrySettings,
    pub http: HttpSettings,
    pub log: LogSettings,
    pub tracing: TracingSettings,
}

#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    pub brokers: String,
    pub group_id: String,
    pub input_topic: String,
    pub outcome_topic: String,
    pub dlq_topic: String,
    pub group_instance_id: String,
    pub produce_timeout_ms: u64,
    /// Input record headers copied onto outcomes (e.g. `x-correlation-id`).
    pub propagate_headers: Vec<String>,
    /// A file holding the SASL password of both clients (a mounted
    /// Secret), read at load into their `sasl.password`.
    pub sasl_password_file: String,
    /// librdkafka properties for the consumer (SASL, TLS, tuning).
    pub consumer: BTreeMap<String, String>,
    /// librdkafka properties for the producer.
    pub producer: BTreeMap<String, String>,
}

#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: String,
    pub username: String,
    pub password: String,
    /// A file holding `password` (a mounted Secret), read at load.
    pub password_file: String,
    /// PEM CA certificates trusted for `rediss://`, besides the system's.
    pub tls_ca_file: String,
    /// `rediss://` without certificate or name checks (throwaway tests only).
    pub tls_insecure_skip_verify: bool,
    pub pool_size: usize,
    pub command_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub key_prefix: String,
    pub record_ttl_secs: u64,
    pub refund_ttl_secs: u64,
    pub slow_script_ms: u64,
    /// The sentinels' ACL user and password (`redis-sentinel://` urls only);
    /// the data nodes' are `username` / `password`.
    pub sentinel_username: String,
    pub sentinel_password: String,
    /// A file holding `sentinel_password` (a mounted Secret), read at load.
    pub sentinel_password_file: String,
    /// The durability gate: an event is done only when `WAIT` says this many
    /// replicas have its writes (0 = off).
    pub wait_replicas: u32,
    /// How long one `WAIT` may block before a short count is retried.
    pub wait_timeout_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PipelineSettings {
    pub max_in_flight_per_partition: usize,
    pub max_in_flight: usize,
    pub commit_interval_ms: u64,
    pub drain_timeout_secs: u64,
    pub exit_when_drained: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    pub initial_interval_ms: u64,
    pub max_interval_ms: u64,
    pub multiplier: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub listen: String,
    pub stall_timeout_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    pub level: String,
}

/// The spans of events: `traceparent` is always read and written; spans are
/// exported over OTLP/HTTP only when `otlp_endpoint` is set.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TracingSettings {
    /// `http(s)://host:port` of an OTLP/HTTP collector; empty = no export.
    pub otlp_endpoint: String,
    pub service_name: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Json,
    Pretty,
}

/// A configuration error: names the key and says how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config: {0}")]
    Load(String),
    #[error("config key {key}: {problem}; {fix}")]
    Invalid {
        key: &'static str,
        problem: String,
        fix: &'static str,
    },
}

/// Librdkafka properties whose values are secrets: never printed.
const SECRET_PROPERTIES: [&str; 4] = [
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "sasl.oauthbearer.client.secret",
];

/// True when a librdkafka property holds a secret.
pub fn is_secret_property(name: &str) -> bool {
    SECRET_PROPERTIES.contains(&name) || name.ends_with(".pem") && name.contains("key")
}

impl fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The pass-through maps may hold sasl.password and key passwords.
        let redacted = |m: &BTreeMap<String, String>| -> BTreeMap<String, String> {
            m.iter()
                .map(|(k, v)| {
                    let v = if is_secret_property(k) { "***" } else { v };
                    (k.clone(), v.to_owned())
                })
                .collect()
        };
        f.debug_struct("KafkaSettings")
            .field("brokers", &self.brokers)
            .field("group_id", &self.group_id)
            .field("input_topic", &self.input_topic)
            .field("outcome_topic", &self.outcome_topic)
            .field("dlq_topic", &self.dlq_topic)
            .field("group_instance_id", &self.group_instance_id)
            .field("produce_timeout_ms", &self.produce_timeout_ms)
            .field("sasl_password_file", &self.sasl_password_file)
            .field("consumer", &redacted(&self.consumer))
            .field("producer", &redacted(&self.producer))
            .finish()
    }
}

impl fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&self.url))
            .field("username", &self.username)
            .field(
                "password",
                &if self.password.is_empty() { "" } else { "***" },
            )
            .field("password_file", &self.password_file)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_insecure_skip_verify", &self.tls_insecure_skip_verify)
            .field("pool_size", &self.pool_size)
            .field("command_timeout_ms", &self.command_timeout_ms)
            .field("key_prefix", &self.key_prefix)
            .field("sentinel_username", &self.sentinel_username)
            .field("sentinel_password_file", &self.sentinel_password_file)
            .field(
                "sentinel_password",
                &if self.sentinel_password.is_empty() {
                    ""
                } else {
                    "***"
                },
            )
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout_ms", &self.wait_timeout_ms)
            .finish_non_exhaustive()
    }
}

/// `redis://user:secret@host` -> `redis://user:***@host`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((auth, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => format!("{scheme}://***@{host}"),
    }
}

impl Settings {
    /// Merges every layer. `file` is an optional config file; `overrides`
    /// are `section.key=value` pairs from the command line.
    pub fn load(
        file: Option<&Path>,
        overrides: &[(String, String)],
    ) -> Result<Settings, ConfigError> {
        Settings::load_from_env(file, overrides, std::env::vars())
    }

    /// [`Settings::load`] with an explicit environment, for tests.
    pub fn load_from_env(
        file: Option<&Path>,
        overrides: &[(String, String)],
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let mut fig = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::Load(format!(
                    "config file {} does not exist; pass an existing file to --config or DEDUCTOR_CONFIG",
                    path.display()
                )));
            }
            fig = fig.merge(Toml::file(path));
        }
        let env: Vec<(String, String)> = env.into_iter().collect();
        fig = fig.merge(env_provider(&env));
        // librdkafka pass-through from the environment: the property names
        // contain dots, which figment would read as nesting, so they are
        // merged as whole keys here.
        for (name, value) in &env {
            for client in ["consumer", "producer"] {
                let prefix = format!("{ENV_PREFIX}KAFKA_{}_", client.to_uppercase());
                if let Some(prop) = name.strip_prefix(&prefix) {
                    let prop = prop.to_lowercase().replace('_', ".");
                    fig = fig.merge(Serialized::default(
                        "kafka",
                        serde_json::json!({ client: { prop: value } }),
                    ));
                }
            }
        }
        for (key, value) in overrides {
            fig = fig.merge(override_provider(key, value)?);
        }
        let mut settings: Settings = fig.extract().map_err(|e| ConfigError::Load(one_line(&e)))?;
        settings.read_secret_files()?;
        settings.validate()?;
        Ok(settings)
    }

    /// Reads the `*_file` settings into the secrets they stand for:
    /// `redis.password_file` -> `redis.password`,
    /// `redis.sentinel_password_file` -> `redis.sentinel_password`, `kafka.sasl_password_file`
    /// -> `sasl.password` of the consumer and the producer. A secret mounted
    /// as a file stays out of the environment (and of `ps e`, crash dumps and
    /// `kubectl describe`). Each is exclusive with the inline value: with
    /// both set, which one wins would be a guess. Read once, at load: a
    /// rotated file takes effect at the next start.
    fn read_secret_files(&mut self) -> Result<(), ConfigError> {
        if !self.redis.password_file.is_empty() {
            if !self.redis.password.is_empty() {
                return Err(ConfigError::Invalid {
                    key: "redis.password_file",
                    problem: "is set together with redis.password".into(),
                    fix: "set only one of them: the file for a mounted secret, the value otherwise",
                });
            }
            self.redis.password = read_secret("redis.password_file", &self.redis.password_file)?;
        }
        if !self.redis.sentinel_password_file.is_empty() {
            if !self.redis.sentinel_password.is_empty() {
                return Err(ConfigError::Invalid {
                    key: "redis.sentinel_password_file",
                    problem: "is set together with redis.sentinel_password".into(),
                    fix: "set only one of them: the file for a mounted secret, the value otherwise",
                });
            }
            self.redis.sentinel_password = read_secret(
                "redis.sentinel_password_file",
                &self.redis.sentinel_password_file,
            )?;
        }
        let k = &mut self.kafka;
        if !k.sasl_password_file.is_empty() {
            for (client, props) in [("consumer", &k.consumer), ("producer", &k.producer)] {
                if props.contains_key("sasl.password") {
                    return Err(ConfigError::Invalid {
                        key: "kafka.sasl_password_file",
                        problem: format!(
                            "is set together with kafka.{client}.\"sasl.password\""
                        ),
                        fix: "set only one of them: the file for a mounted secret, the property otherwise",
                    });
                }
            }
            let password = read_secret("kafka.sasl_password_file", &k.sasl_password_file)?;
            for props in [&mut k.consumer, &mut k.producer] {
                props.insert("sasl.password".into(), password.clone());
            }
        }
        Ok(())
    }

    /// Checks what the types cannot; names the key and the fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn bad(key: &'static str, problem: impl Into<String>, fix: &'static str) -> ConfigError {
            ConfigError::Invalid {
                key,
                problem: problem.into(),
                fix,
            }
        }
        let k = &self.kafka;
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
        let t = &self.tracing;
        let exported = !t.otlp_endpoint.is_empty();
        let is_http =
            t.otlp_endpoint.starts_with("http://") || t.otlp_endpoint.starts_with("https://");
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
        let r = &self.redis;
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
        if r.key_prefix.is_empty() || r.key_prefix.contains(['{', '}', ' ']) {
            return Err(bad(
                "redis.key_prefix",
                format!("{:?} is empty or contains {{, }} or a space", r.key_prefix),
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
        let p = &self.pipeline;
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
        let t = &self.retry;
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
        if !self.http.listen.is_empty() && self.http.listen.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(bad(
                "http.listen",
                format!("{:?} is not an address", self.http.listen),
                "use ip:port such as 0.0.0.0:9464, or empty to disable",
            ));
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log.level).is_err() {
            return Err(bad(
                "log.level",
                format!("{:?} is not a filter", self.log.level),
                "use e.g. info or deductor=debug",
            ));
        }
        Ok(())
    }

    pub fn command_timeout(&self) -> Duration {
        Duration::from_millis(self.redis.command_timeout_ms)
    }

    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs(self.pipeline.drain_timeout_secs)
    }
}

/// `DEDUCTOR_REDIS_KEY_PREFIX` -> `redis.key_prefix`: the first word after the
/// prefix names the section, the rest is the key. Variables of no known
/// section (DEDUCTOR_CONFIG) and the pass-through ones are left out.
fn env_provider(env: &[(String, String)]) -> Serialized<serde_json::Value> {
    let mut tree = serde_json::Map::new();
    for (name, value) in env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        let rest = rest.to_lowercase();
        let Some((section, key)) = rest.split_once('_') else {
            continue;
        };
        if !SECTIONS.contains(&section) || key.is_empty() {
            continue;
        }
        if section == "kafka" && (key.starts_with("consumer_") || key.starts_with("producer_")) {
            continue;
        }
        // Only the keys config/default.toml documents: other DEDUCTOR_*
        // variables (e.g. DEDUCTOR_REDIS_CLUSTER_URL of scripts/dev-stack)
        // belong to tools and tests, not to the service.
        if !known_key(section, key) {
            continue;
        }
        let entry = tree
            .entry(section.to_owned())
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        if let serde_json::Value::Object(m) = entry {
            m.insert(key.to_owned(), typed(section, key, value));
        }
    }
    Serialized::defaults(serde_json::Value::Object(tree))
}

/// True when `section.key` is a key of the defaults.
fn known_key(section: &str, key: &str) -> bool {
    default_value(section, key).is_some()
}

/// The default of `section.key` (config/default.toml), None for a key it
/// does not list.
fn default_value(section: &str, key: &str) -> Option<&'static serde_json::Value> {
    static DEFAULTS: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    let defaults = DEFAULTS.get_or_init(|| {
        Figment::from(Toml::string(DEFAULT_TOML))
            .extract::<serde_json::Value>()
            .unwrap_or_default()
    });
    defaults.get(section).and_then(|s| s.get(key))
}

fn override_provider(key: &str, value: &str) -> Result<Serialized<serde_json::Value>, ConfigError> {
    let Some((section, rest)) = key.split_once('.') else {
        return Err(ConfigError::Load(format!(
            "--set {key}: expected section.key=value, e.g. --set redis.pool_size=8"
        )));
    };
    let value = match rest.split_once('.') {
        // kafka.consumer.<librdkafka property>
        Some((client @ ("consumer" | "producer"), prop)) if section == "kafka" => {
            serde_json::json!({ client: { prop: value } })
        }
        _ => serde_json::json!({ rest: typed(section, rest, value) }),
    };
    Ok(Serialized::default(section, value))
}

/// An environment or flag value (always text) typed after the key's default:
/// a string key keeps the text whatever it looks like (a password `111111`,
/// a group id `20261130`), a number or boolean key gets a number or boolean
/// when the text is one. Text a typed key cannot take stays text, so the
/// extract reports the key and the expected type.
fn typed(section: &str, key: &str, v: &str) -> serde_json::Value {
    use serde_json::Value;
    let number = || -> Option<Value> {
        if let Ok(n) = v.parse::<u64>() {
            return Some(n.into());
        }
        if let Ok(n) = v.parse::<i64>() {
            return Some(n.into());
        }
        v.parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .and_then(|f| serde_json::Number::from_f64(f).map(Value::Number))
    };
    let boolean = || match v {
        "true" => Some(Value::Bool(true)),
        "false" => Some(Value::Bool(false)),
        _ => None,
    };
    let typed = match default_value(section, key) {
        Some(Value::String(_)) => None,
        // A list: comma separated (`--set kafka.propagate_headers=a,b`).
        Some(Value::Array(_)) => Some(Value::Array(
            v.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(|x| Value::String(x.to_owned()))
                .collect(),
        )),
        Some(Value::Number(_)) => number(),
        Some(Value::Bool(_)) => boolean(),
        // Not a key of the defaults (refused by the extract, which names
        // it): the best guess, so that the error is about the key.
        _ => number().or_else(boolean),
    };
    typed.unwrap_or_else(|| v.into())
}

/// The secret held by the file `path` (setting `key`), without the line
/// break an editor or `echo` leaves at its end. A missing, unreadable, empty
/// or non-UTF-8 file is an error naming the key: starting without the
/// secret would fail later, at the first connection, far from the cause.
fn read_secret(key: &'static str, path: &str) -> Result<String, ConfigError> {
    let fix = "point it at a readable file that holds only the secret, or leave it empty";
    let bad = |problem: String| ConfigError::Invalid { key, problem, fix };
    let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read {path}: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|_| bad(format!("{path} is not UTF-8 text")))?;
    let secret = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if secret.is_empty() {
        return Err(bad(format!("{path} is empty")));
    }
    Ok(secret.to_owned())
}

fn one_line(e: &figment::Error) -> String {
    let mut msgs = Vec::new();
    for err in e.clone() {
        let path = err.path.join(".");
        // Name a file source; the other layers (defaults, environment,
        // flags) are built in code, whose location means nothing to a user.
        let from = match err.metadata.as_ref().and_then(|m| m.source.as_ref()) {
            Some(figment::Source::File(path)) => format!(" (in {})", path.display()),
            _ => String::new(),
        };
        if path.is_empty() {
            msgs.push(format!("{}{from}", err.kind));
        } else {
            msgs.push(format!("key {path}: {}{from}", err.kind));
        }
    }
    msgs.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
