//! `redis-cli` against a loopback node, for the tools and tests that start
//! and fail over Redis servers of their own.

use std::process::Command;

use anyhow::{bail, Context as _};

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

/// `redis-cli --cluster create` of the nodes at `addrs` (`host:port`), one
/// replica to each primary, without asking; an error with redis-cli's
/// output when it fails.
pub fn cluster_create(addrs: &[String]) -> anyhow::Result<()> {
    let out = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(addrs)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .output()
        .context("redis-cli --cluster create")?;
    if !out.status.success() {
        bail!(
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Whether every node on `ports` says `cluster_state:ok` and `replicas` of
/// them are replicas whose link to their primary is up.
pub fn cluster_in_sync(ports: &[u16], replicas: usize) -> bool {
    ports
        .iter()
        .all(|p| cli(*p, &["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        && ports
            .iter()
            .filter(|p| cli(**p, &["INFO", "replication"]).contains("master_link_status:up"))
            .count()
            == replicas
}

/// The `redis-cluster://` url of the loopback nodes on `ports` (the first
/// in the host part, the others as `node=` parameters).
pub fn cluster_url(ports: &[u16]) -> String {
    let rest: Vec<String> = ports[1..]
        .iter()
        .map(|p| format!("node=127.0.0.1:{p}"))
        .collect();
    format!("redis-cluster://127.0.0.1:{}?{}", ports[0], rest.join("&"))
}
