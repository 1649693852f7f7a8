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

/// A primary of a Redis Cluster as `CLUSTER NODES` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Primary {
    pub id: String,
    /// The port it announces (a proxy's, where the node is behind one).
    pub port: u16,
    /// Its slot ranges, inclusive.
    pub slots: Vec<(u16, u16)>,
}

impl Primary {
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|(lo, hi)| *lo <= slot && slot <= *hi)
    }
}

/// The primaries the node on `port` knows, failed ones left out; empty when
/// it does not answer.
pub fn cluster_primaries(port: u16) -> Vec<Primary> {
    parse_primaries(&cli(port, &["CLUSTER", "NODES"]))
}

/// The primary serving `slot` and another primary, as the node on `port`
/// knows them: the source and the target of a slot move. Each is one that
/// says so itself (`ROLE`): just after a Cluster with replicas is created,
/// another node may still list a replica as a primary without slots, and
/// `CLUSTER SETSLOT` on it answers "Please use SETSLOT only with masters".
/// Panics (a test's setup failed) when there are not two.
pub fn slot_owner_and_another(port: u16, slot: u16) -> (Primary, Primary) {
    let primaries: Vec<Primary> = cluster_primaries(port)
        .into_iter()
        .filter(|p| cli(p.port, &["ROLE"]).lines().next() == Some("master"))
        .collect();
    let owner = primaries
        .iter()
        .find(|p| p.serves(slot))
        .unwrap_or_else(|| panic!("no primary serves slot {slot}: {primaries:?}"))
        .clone();
    let other = primaries
        .into_iter()
        .find(|p| p.id != owner.id)
        .unwrap_or_else(|| panic!("no primary besides {} ({})", owner.id, owner.port));
    (owner, other)
}

/// [`cluster_primaries`] of a `CLUSTER NODES` text: `<id> <ip:port@bus[,host]>
/// <flags> <master> <ping> <pong> <epoch> <link> <slot ranges...>`; a range
/// in brackets is a slot being migrated or imported, not served.
pub fn parse_primaries(nodes: &str) -> Vec<Primary> {
    nodes
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 || !f[2].contains("master") || f[2].contains("fail") {
                return None;
            }
            let port = f[1]
                .split(['@', ','])
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let slots = f[8..]
                .iter()
                .filter(|r| !r.starts_with('['))
                .filter_map(|r| {
                    let mut ends = r.split('-');
                    let lo: u16 = ends.next()?.parse().ok()?;
                    let hi: u16 = ends.next().map_or(Some(lo), |h| h.parse().ok())?;
                    Some((lo, hi))
                })
                .collect();
            Some(Primary {
                id: f[0].to_owned(),
                port,
                slots,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primaries_of_cluster_nodes() {
        let nodes = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460 [5461->-b2]
b2 127.0.0.1:7002@17002,host master - 0 1 2 connected 5461-10922
r3 127.0.0.1:7004@17004 slave a1 0 1 1 connected
c3 127.0.0.1:7003@17003 master,fail - 0 1 3 disconnected 10923-16383
d4 127.0.0.1:7005@17005 master - 0 1 4 connected 16000
";
        let p = parse_primaries(nodes);
        assert_eq!(p.len(), 3, "{p:?}");
        assert_eq!(p[0].id, "a1");
        assert_eq!(
            p[0].slots,
            vec![(0, 5460)],
            "a migrating slot is not listed"
        );
        assert!(p[1].serves(5461) && !p[1].serves(5460));
        assert_eq!(p[1].port, 7002);
        assert_eq!(p[2].slots, vec![(16000, 16000)]);
    }
}
