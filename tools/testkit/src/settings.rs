//! Redis settings for a test or a tool that reaches Redis itself (not
//! through a `deductor` process): built here, not loaded, so that no
//! `DEDUCTOR_*` variable of the environment changes them.

use deductor::config::RedisSettings;

/// `url` and key prefix `prefix`, no credentials, no TLS, no replica gate,
/// no batching,
/// the service's record and refund TTLs, a pool of 2 and short timeouts
/// (5 s a command, 2 s to connect; a script is slow after 1 s). A caller
/// that needs more sets those fields over these.
pub fn redis(url: &str, prefix: &str) -> RedisSettings {
    RedisSettings {
        url: url.to_owned(),
        username: String::new(),
        password: String::new(),
        password_file: String::new(),
        tls_ca_file: String::new(),
        tls_insecure_skip_verify: false,
        pool_size: 2,
        command_timeout_ms: 5_000,
        connect_timeout_ms: 2_000,
        key_prefix: prefix.to_owned(),
        record_ttl_secs: 2_592_000,
        refund_ttl_secs: 604_800,
        slow_script_ms: 1_000,
        sentinel_username: String::new(),
        sentinel_password: String::new(),
        sentinel_password_file: String::new(),
        wait_replicas: 0,
        wait_timeout_ms: 1_000,
        // As the service: one deduct.lua call per placement line (tests of
        // the batch path set more).
        batch_max_lines: 1,
        batch_linger_ms: 0,
    }
}
