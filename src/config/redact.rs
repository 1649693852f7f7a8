//! What settings never print: secret librdkafka properties, passwords and
//! the credentials of urls ([`redact_url`]); the `Debug` of the sections
//! that hold them.

use std::collections::BTreeMap;
use std::fmt;

use super::{KafkaSettings, RedisSettings};

/// Librdkafka properties whose values are secrets: never printed.
const SECRET_PROPERTIES: [&str; 4] = [
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "sasl.oauthbearer.client.secret",
];

/// Fragments of a property name that make it look like a secret: a
/// misspelled `sasl.passwrd` or a property librdkafka adds later is
/// treated as one too (its value is never printed).
const SECRET_LOOKING: [&str; 9] = [
    "pass", "secret", "token", "key", "cred", "jaas", "pwd", "oauth", "auth",
];

/// True when a librdkafka property holds a secret, or its name looks as if
/// it might (`sasl.passwrd`, `ssl.key.pem`, `sasl.oauthbearer.config`).
pub fn is_secret_property(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_PROPERTIES.contains(&name) || SECRET_LOOKING.iter().any(|f| lower.contains(f))
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
            .field("delivery", &self.delivery)
            .field("transactional_id", &self.transactional_id)
            .field("transaction_interval_ms", &self.transaction_interval_ms)
            .field("prefetch_budget_kib", &self.prefetch_budget_kib)
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
            .field("batch_max_lines", &self.batch_max_lines)
            .field("batch_linger_ms", &self.batch_linger_ms)
            .finish_non_exhaustive()
    }
}

/// `redis://user:secret@host` -> `redis://user:***@host`, and the same
/// for a malformed url whose credentials a typo left behind
/// (`redis//admin:pw@host`, `admin:pw@host`): whatever stands before the
/// last `@` after the scheme (up to its first `//`) is credentials, and only
/// the user name before its first `:` is kept.
pub fn redact_url(url: &str) -> String {
    let Some((auth, host)) = url.rsplit_once('@') else {
        return url.to_owned();
    };
    let (scheme, creds) = match auth.find("//") {
        Some(i) => auth.split_at(i + 2),
        None => ("", auth),
    };
    match creds.split_once(':') {
        Some((user, _)) => format!("{scheme}{user}:***@{host}"),
        None => format!("{scheme}***@{host}"),
    }
}
