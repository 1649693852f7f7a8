//! The `deductor` binary as an operator uses it: configuration errors name
//! the key in one line, `promo set/show`, `publish`, `check` and
//! `healthcheck` against the real Kafka and Redis.
//!
//! - `check`: configuration errors, `check`, `audit`'s exit codes,
//!   `healthcheck`, and `run` waiting for Redis at start-up;
//! - `promo`: `promo set/show/pause/resume/adjust/limit/list/delete` and
//!   the promo_* scripts behind them;
//! - `live`: those changes made while the service decides a burst;
//! - `lookup`: `order show` and `event show`;
//! - `dlq`: `publish`, and `dlq list/show/replay`;
//! - `audit`: `audit` reads as the scripts read, at one instant, and on a
//!   Cluster only the promotion's slot;
//! - `operator`: secrets never print, `check` refuses what `run` refuses, a
//!   closed pipe, `publish` without Kafka.

mod audit;
mod check;
mod dlq;
mod live;
mod lookup;
mod modes;
mod operator;
mod promo;

use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::service::{self};

/// Runs `deductor <args>` with exactly `env` (inherited `DEDUCTOR_*` removed).
async fn deductor(env: &[(String, String)], args: &[&str]) -> Output {
    let mut c = service::command(env);
    c.args(args);
    tokio::task::spawn_blocking(move || c.output().expect("running deductor"))
        .await
        .unwrap()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit non-zero with one line on stderr that contains `needle`.
fn assert_one_line_error(o: &Output, needle: &str, what: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "{what}: exits non-zero; stderr: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{what}: one line on stderr: {err:?}"
    );
    assert!(err.contains(needle), "{what}: names {needle:?}: {err}");
}

/// A TCP port nothing listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `deductor <args>` under a test Redis's prefix.
async fn admin(r: &crate::common::redis::TestRedis, args: &[&str]) -> Output {
    // The test stack's brokers: `audit` asks the group's offsets when a
    // prefix has no ledger marker (the default group has none committed).
    let brokers = crate::common::kafka::brokers();
    let e = env(&[
        ("DEDUCTOR_REDIS_URL", &r.url),
        ("DEDUCTOR_REDIS_KEY_PREFIX", &r.prefix),
        ("DEDUCTOR_KAFKA_BROKERS", &brokers),
        ("DEDUCTOR_LOG_LEVEL", "warn"),
    ]);
    deductor(&e, args).await
}

fn json_of(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}{}", stdout(o), stderr(o)))
}

fn assert_exit(o: &Output, code: i32, what: &str) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "{what}: exit code; stdout {} stderr {}",
        stdout(o),
        stderr(o)
    );
}

/// A `redis-server` of the test's own on `port`, without persistence, in a
/// temporary directory, with `extra` arguments; killed when dropped.
struct LocalRedis {
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl LocalRedis {
    /// Starts it and waits until it listens.
    async fn start(port: u16, extra: &[&str]) -> LocalRedis {
        let dir = tempfile::tempdir().unwrap();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(extra)
            .arg("--dir")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting redis-server");
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !service::listening(&addr) {
            assert!(Instant::now() < deadline, "redis-server did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        LocalRedis { child, _dir: dir }
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
