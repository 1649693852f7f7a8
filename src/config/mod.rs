//! Settings: `config/default.toml` < `--config FILE` < `DEDUCTOR_*` env < flags.
//!
//! Every layer is merged by figment, then [`Settings::validate`] checks what
//! types cannot: a bad value is reported with its key and how to fix it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The compiled-in defaults: the first layer, and the documentation of every key.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

const ENV_PREFIX: &str = "DEDUCTOR_";
/// The longest TTL accepted for `redis.record_ttl_secs` and
/// `redis.refund_ttl_secs`: 10 years (365-day years), far beyond any refund
/// window and far below what Redis and the scripts can take.
pub const MAX_TTL_SECS: u64 = 10 * 365 * 24 * 3600;

/// More replicas than any sane deployment has: a typo, not a setting.
const MAX_WAIT_REPLICAS: u32 = 16;
/// `WAIT` blocks its connection (and fred's unresponsive check must outlast it).
const MAX_WAIT_TIMEOUT_MS: u64 = 60_000;
/// A batch's first line waits this long at most for others: beyond it the
/// wait is latency, not batching.
const MAX_BATCH_LINGER_MS: u64 = 100;

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
    /// What a reader of the outcome topic sees after a crash or rebalance.
    pub delivery: Delivery,
    /// `exactly_once`: the producer's `transactional.id`; empty =
    /// `{group_id}-{group_instance_id}`, or `{group_id}-{hostname}-{pid}`
    /// with dynamic membership.
    pub transactional_id: String,
    /// `exactly_once`: how long one transaction stays open (outcomes are
    /// visible to `read_committed` readers when it commits).
    pub transaction_interval_ms: u64,
    /// The consumer's prefetch over all partitions of the input topic, in
    /// KiB: librdkafka's per-partition queue bounds are this budget shared
    /// among the topic's partitions (see [`crate::kafka::consumer::prefetch_share`]).
    pub prefetch_budget_kib: u64,
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

/// `kafka.delivery`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Offsets committed after the outcome is acknowledged: a crash or
    /// rebalance can publish an outcome again (same `outcome_id`).
    AtLeastOnce,
    /// Outcomes, dead letters and offsets in one Kafka transaction: a
    /// `read_committed` reader sees each exactly once.
    ExactlyOnce,
}

impl KafkaSettings {
    /// The `transactional.id` of `exactly_once` mode: `kafka.transactional_id`,
    /// else stable across restarts with static membership (a restarted pod
    /// fences and aborts its predecessor's open transaction at once), else
    /// unique to this process.
    pub fn transactional_id(&self) -> String {
        if !self.transactional_id.is_empty() {
            return self.transactional_id.clone();
        }
        if !self.group_instance_id.is_empty() {
            return format!("{}-{}", self.group_id, self.group_instance_id);
        }
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .unwrap_or_else(|| "host".to_owned());
        format!("{}-{}-{}", self.group_id, host, std::process::id())
    }
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
    /// Placement lines decided in one script call at most (1 = no batching).
    pub batch_max_lines: usize,
    /// How long a batch's first line may wait for others to join it once a
    /// batch slot is free (0 = not at all).
    pub batch_linger_ms: u64,
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
    /// A request's headers must be complete within this long of the server
    /// waiting for them (also the wait for a kept-alive connection's next
    /// request).
    pub header_read_timeout_ms: u64,
    /// A connection on which no byte moved either way for this long is closed.
    pub idle_timeout_ms: u64,
    /// Connections served at once, besides the few kept for the probes.
    pub max_connections: usize,
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
    /// librdkafka refused a client configuration built from the settings
    /// (a pass-through property, or a value it cannot take): `key` is the
    /// setting to fix; a secret-looking value is never in `problem`.
    #[error("config key {key}: {problem}; {fix}")]
    Client {
        key: String,
        problem: String,
        fix: &'static str,
    },
}

mod load;
mod redact;
mod validate;
mod weakened;

pub use redact::{is_secret_property, redact_url};
pub use weakened::{weakened, Weakened};

impl Settings {
    pub fn command_timeout(&self) -> Duration {
        Duration::from_millis(self.redis.command_timeout_ms)
    }

    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs(self.pipeline.drain_timeout_secs)
    }

    /// The producer's `transaction.timeout.ms` (librdkafka's default when
    /// unset; validated as a number).
    pub fn transaction_timeout(&self) -> Duration {
        let ms = self
            .kafka
            .producer
            .get("transaction.timeout.ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(60_000);
        Duration::from_millis(ms)
    }
}

/// How long `deductor run` may take past `pipeline.drain_timeout_secs` to
/// stop after SIGTERM, whatever is down (the chart's grace period is the
/// drain timeout plus this): the transaction boundary in progress, the last
/// transaction or offset commit, the producer's flush, leaving the group
/// and closing the pool, each bounded (`pipeline::wind_down`). Past it a
/// watchdog exits 1 with a line saying work was abandoned (nothing is lost:
/// what was not committed is redone by the next owner).
pub const SHUTDOWN_BOUND: Duration = Duration::from_secs(15);

#[cfg(test)]
mod tests;
