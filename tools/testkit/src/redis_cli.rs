//! `redis-cli` against a loopback node, for the tools and tests that start
//! and fail over Redis servers of their own.

use std::process::Command;

/// `redis-cli -p PORT ARGS...` on 127.0.0.1 (stdout, trimmed); empty when
/// it fails.
pub fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}
