//! Replicated Redis for the failover fault: two data nodes, each behind a
//! [`LinkProxy`] of its own, and three sentinels (quorum 2, down after 1 s).
//! The replica replicates through the primary's proxy, which can stall the
//! replication stream (the bytes stay unsent, as on a congested link) and
//! then cut it, so that writes the primary acknowledged never reach the
//! replica Sentinel then promotes.
//!
//! Every address the sentinels know is a proxy's: each node announces its
//! proxy's port (`replica-announce-port`), and the sentinels monitor the
//! first primary at its proxy. So after a failover the clients (which ask
//! the sentinels) and the next replica reach the new primary through its
//! proxy too, and the fault can be repeated the other way round. A replica
//! whose master address differed from the one Sentinel knows would be
//! "fixed" by Sentinel and bypass the proxy.

use std::path::Path;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use deductor_testkit::proxy::{Link, LinkProxy};
use deductor_testkit::redis_cli::{cli, cluster_create, cluster_in_sync, cluster_url};
use deductor_testkit::sentinel;

use crate::stack::Redis;

pub use deductor_testkit::sentinel::SERVICE;

/// Polls `check` every 100 ms for up to `limit`.
async fn eventually(
    limit: Duration,
    what: &str,
    mut check: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while !check() {
        if Instant::now() >= deadline {
            bail!("timed out after {} s: {what}", limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The replication offset a node reports (`master_repl_offset`), 0 when
/// it does not answer.
fn repl_offset(port: u16) -> u64 {
    cli(port, &["INFO", "replication"])
        .lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Two data nodes (one primary, one replica) behind their proxies, and
/// three sentinels.
pub struct Replicated {
    pub nodes: [Arc<Mutex<Redis>>; 2],
    pub proxies: [LinkProxy; 2],
    /// Index of the node that is the primary now.
    pub primary: usize,
    sentinels: Vec<(u16, Child)>,
    /// The primary's replication offset when its link stalled.
    stalled_at: u64,
}

impl Replicated {
    /// The nodes listen on `port` and `port + 7`, behind proxies on
    /// `port + 10` and `port + 11`; the sentinels on `port + 20 ..= + 22`.
    /// Node 0 starts as the primary.
    pub async fn start(repo: &Path, dir: &Path, port: u16) -> anyhow::Result<Replicated> {
        let node_ports = [port, port + 7];
        let proxy_ports = [port + 10, port + 11];
        let mut nodes = Vec::new();
        for i in 0..2 {
            let r = Redis::new(repo, &dir.join(format!("redis-{i}")), node_ports[i], None)?;
            let mut extra = format!("replica-announce-port {}\n", proxy_ports[i]);
            if i == 1 {
                extra.push_str(&format!("replicaof 127.0.0.1 {}\n", proxy_ports[0]));
            }
            r.configure(&extra)?;
            nodes.push(r);
        }
        let proxies = [
            LinkProxy::start(proxy_ports[0], node_ports[0]).await?,
            LinkProxy::start(proxy_ports[1], node_ports[1]).await?,
        ];
        for n in &mut nodes {
            tokio::task::block_in_place(|| n.start())?;
        }
        let [a, b]: [Redis; 2] = nodes.try_into().map_err(|_| anyhow::anyhow!("two nodes"))?;
        let mut set = Replicated {
            nodes: [Arc::new(Mutex::new(a)), Arc::new(Mutex::new(b))],
            proxies,
            primary: 0,
            sentinels: Vec::new(),
            stalled_at: 0,
        };
        set.wait_in_sync(1).await?;
        for k in 0..3 {
            let sport = port + 20 + k;
            let sdir = dir.join(format!("sentinel-{k}"));
            let child = sentinel::start(&sdir, sport, proxy_ports[0], "")
                .context("starting redis-server --sentinel")?;
            // scripts/chaos kills what a crashed run left by these.
            std::fs::write(sdir.join("pid"), child.id().to_string())?;
            set.sentinels.push((sport, child));
        }
        let first = set.sentinels[0].0;
        eventually(
            Duration::from_secs(90),
            "the sentinels know the replica and each other",
            || sentinel::knows(&cli(first, &["SENTINEL", "MASTER", SERVICE]), 1, 2),
        )
        .await?;
        Ok(set)
    }

    /// The `redis-sentinel://` url of the sentinels.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis-sentinel://{}/{SERVICE}", hosts.join(","))
    }

    fn node_port(&self, i: usize) -> u16 {
        self.nodes[i].lock().expect("node lock").port
    }

    /// Until node `i` is a replica whose link to its primary is up.
    async fn wait_in_sync(&self, i: usize) -> anyhow::Result<()> {
        let port = self.node_port(i);
        eventually(
            Duration::from_secs(90),
            &format!("replica {port} in sync"),
            || cli(port, &["INFO", "replication"]).contains("master_link_status:up"),
        )
        .await
    }

    /// The port the sentinels name as primary now ("" when none answers).
    fn sentinel_primary(&self) -> String {
        for (p, _) in &self.sentinels {
            let out = cli(*p, &["SENTINEL", "get-master-addr-by-name", SERVICE]);
            if let Some(port) = out.lines().nth(1) {
                return port.trim().to_owned();
            }
        }
        String::new()
    }

    /// The first half of the failover fault: the replica's link stalls
    /// (the primary's writes from now on stay unreplicated).
    pub async fn stall(&mut self) -> anyhow::Result<Instant> {
        self.settle().await?;
        self.stalled_at = repl_offset(self.node_port(self.primary));
        self.proxies[self.primary].set(Link::Stalled);
        Ok(Instant::now())
    }

    /// The bytes of writes the stalled primary took since its link stalled:
    /// what its replica lacks.
    pub fn unreplicated(&self) -> u64 {
        repl_offset(self.node_port(self.primary)).saturating_sub(self.stalled_at)
    }

    /// Until every sentinel names the same primary and the other node is
    /// its replica with the link up; the primary is then whichever node the
    /// sentinels name. Sentinel may fail over once more right after a fault
    /// (a sentinel that had not yet seen the promotion starts its own, and
    /// can promote the old primary just restarted as a replica): the fault
    /// takes the topology as Sentinel leaves it.
    async fn settle(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let named: Vec<String> = self
                .sentinels
                .iter()
                .map(|(p, _)| {
                    cli(*p, &["SENTINEL", "get-master-addr-by-name", SERVICE])
                        .lines()
                        .nth(1)
                        .unwrap_or("")
                        .trim()
                        .to_owned()
                })
                .collect();
            let agreed = named.iter().all(|n| !n.is_empty() && *n == named[0]);
            let primary = self
                .proxies
                .iter()
                .position(|x| agreed && x.port.to_string() == named[0]);
            if let Some(p) = primary {
                let replica = self.node_port(1 - p);
                let own = self.node_port(p);
                if cli(own, &["INFO", "replication"]).contains("role:master")
                    && cli(replica, &["INFO", "replication"]).contains("master_link_status:up")
                {
                    self.primary = p;
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                bail!("Sentinel did not settle within 120 s (sentinels name {named:?})");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The second half, after [`Replicated::stall`]: the primary is
    /// SIGKILLed and its link cut (what it held is never delivered),
    /// Sentinel promotes the replica; the old primary is restarted from its
    /// AOF as a replica of the new one (through the new primary's proxy) and
    /// resynchronised, so a gate asking for one replica can pass again.
    /// Returns what happened.
    pub async fn fail_over(&mut self, stalled: Instant) -> anyhow::Result<String> {
        let (old, new) = (self.primary, 1 - self.primary);
        let lag = stalled.elapsed();
        let killed = Instant::now();
        {
            let node = self.nodes[old].clone();
            tokio::task::block_in_place(|| node.lock().expect("node lock").kill());
        }
        self.proxies[old].set(Link::Cut);
        let want = self.proxies[new].port.to_string();
        eventually(
            Duration::from_secs(90),
            "Sentinel promotes the replica",
            || self.sentinel_primary() == want,
        )
        .await?;
        let promoted_ms = killed.elapsed().as_millis();
        self.proxies[old].set(Link::Flowing);
        {
            let node = self.nodes[old].clone();
            let extra = format!(
                "replica-announce-port {}\nreplicaof 127.0.0.1 {}\n",
                self.proxies[old].port, self.proxies[new].port
            );
            tokio::task::block_in_place(|| {
                let mut n = node.lock().expect("node lock");
                n.configure(&extra)?;
                n.restarts += 1;
                n.start()
            })?;
        }
        self.settle().await?;
        Ok(format!(
            "replica link of node {old} stalled {} ms, node {old} SIGKILLed; \
             node {new} promoted after {promoted_ms} ms; node {old} back as its \
             replica after {} ms",
            lag.as_millis(),
            killed.elapsed().as_millis()
        ))
    }

    pub fn stop(&mut self) {
        for (_, c) in &mut self.sentinels {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.nodes {
            if let Ok(mut n) = n.lock() {
                n.stop();
            }
        }
    }
}

/// A Redis Cluster of three primaries with one replica each, every node
/// behind a [`LinkProxy`] of its own: each node announces its proxy's port
/// (`cluster-announce-port`), so clients and the replicas reach every node
/// through its proxy, and the failover fault can stall a primary's
/// replication stream. The cluster bus goes direct: each node's bus listens
/// on its proxy's port + 10000 (`cluster-port`), so `CLUSTER MEET` to a
/// proxy's address finds the bus where it expects it.
pub struct ReplicatedCluster {
    pub nodes: Vec<Arc<Mutex<Redis>>>,
    pub proxies: Vec<LinkProxy>,
    /// The node a fault is failing over: (index, the replica's index).
    pending: Option<(usize, usize)>,
    /// The stalled primary's replication offset when its link stalled.
    stalled_at: u64,
}

impl ReplicatedCluster {
    /// The nodes listen on `port + 30 ..= + 35`, their proxies on
    /// `port + 40 ..= + 45`, the cluster bus on the proxy ports + 10000.
    pub async fn start(repo: &Path, dir: &Path, port: u16) -> anyhow::Result<ReplicatedCluster> {
        let mut nodes = Vec::new();
        let mut proxies = Vec::new();
        for i in 0..6u16 {
            let (data, proxy) = (port + 30 + i, port + 40 + i);
            let mut r = Redis::new(repo, &dir.join(format!("redis-{i}")), data, None)?;
            r.configure(&format!(
                "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout 1000\n\
                 cluster-port {bus}\ncluster-announce-ip 127.0.0.1\ncluster-announce-port {proxy}\n\
                 cluster-announce-bus-port {bus}\nreplica-announce-port {proxy}\n",
                bus = proxy + 10_000
            ))?;
            proxies.push(LinkProxy::start(proxy, data).await?);
            tokio::task::block_in_place(|| r.start())?;
            nodes.push(Arc::new(Mutex::new(r)));
        }
        let addrs: Vec<String> = proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port))
            .collect();
        cluster_create(&addrs)?;
        let c = ReplicatedCluster {
            nodes,
            proxies,
            pending: None,
            stalled_at: 0,
        };
        c.wait_healthy().await?;
        Ok(c)
    }

    fn port(&self, i: usize) -> u16 {
        self.nodes[i].lock().expect("node lock").port
    }

    /// Until every node says `cluster_state:ok` and three replicas' links
    /// are up.
    async fn wait_healthy(&self) -> anyhow::Result<()> {
        let ports: Vec<u16> = (0..self.nodes.len()).map(|i| self.port(i)).collect();
        eventually(
            Duration::from_secs(90),
            "the cluster is ok with 3 replicas in sync",
            || cluster_in_sync(&ports, 3),
        )
        .await
    }

    /// The `redis-cluster://` url (the proxies).
    pub fn url(&self) -> String {
        let ports: Vec<u16> = self.proxies.iter().map(|p| p.port).collect();
        cluster_url(&ports)
    }

    /// Index of the node whose proxy port is `proxy`.
    fn by_proxy(&self, proxy: u16) -> Option<usize> {
        self.proxies
            .iter()
            .position(|p| p.port == proxy)
            .or_else(|| (0..self.nodes.len()).find(|i| self.port(*i) == proxy))
    }

    /// The first half of the failover fault: a random primary's replica
    /// link stalls (`pick` chooses among the primaries).
    pub fn stall(&mut self, pick: usize) -> anyhow::Result<Instant> {
        let mut pairs = Vec::new();
        for i in 0..self.nodes.len() {
            let info = cli(self.port(i), &["INFO", "replication"]);
            if !info.contains("role:master") {
                continue;
            }
            // slave0:ip=127.0.0.1,port=<proxy>,state=online,...
            let replica = info
                .lines()
                .find_map(|l| l.strip_prefix("slave0:"))
                .and_then(|v| v.split(',').find_map(|kv| kv.strip_prefix("port=")))
                .and_then(|p| p.trim().parse::<u16>().ok())
                .and_then(|p| self.by_proxy(p));
            if let Some(r) = replica {
                pairs.push((i, r));
            }
        }
        if pairs.is_empty() {
            bail!("no primary with a replica to fail over");
        }
        let (primary, replica) = pairs[pick % pairs.len()];
        self.stalled_at = repl_offset(self.port(primary));
        self.proxies[primary].set(Link::Stalled);
        self.pending = Some((primary, replica));
        Ok(Instant::now())
    }

    /// The bytes of writes the stalled primary took since its link stalled.
    pub fn unreplicated(&self) -> u64 {
        match self.pending {
            Some((primary, _)) => repl_offset(self.port(primary)).saturating_sub(self.stalled_at),
            None => 0,
        }
    }

    /// The second half: the stalled primary is SIGKILLed and its link cut,
    /// the cluster promotes its replica; the old primary is restarted from
    /// its AOF and nodes.conf, and rejoins as the new primary's replica.
    pub async fn fail_over(&mut self, stalled: Instant) -> anyhow::Result<String> {
        let Some((old, new)) = self.pending.take() else {
            bail!("fail_over without stall");
        };
        let lag = stalled.elapsed();
        let killed = Instant::now();
        {
            let node = self.nodes[old].clone();
            tokio::task::block_in_place(|| node.lock().expect("node lock").kill());
        }
        self.proxies[old].set(Link::Cut);
        let new_port = self.port(new);
        eventually(
            Duration::from_secs(90),
            "the cluster promotes the replica",
            || cli(new_port, &["INFO", "replication"]).contains("role:master"),
        )
        .await?;
        let promoted_ms = killed.elapsed().as_millis();
        self.proxies[old].set(Link::Flowing);
        {
            let node = self.nodes[old].clone();
            tokio::task::block_in_place(|| {
                let mut n = node.lock().expect("node lock");
                n.restarts += 1;
                n.start()
            })?;
        }
        self.wait_healthy().await?;
        Ok(format!(
            "cluster: replica link of node {old} stalled {} ms, node {old} SIGKILLed; \
             node {new} promoted after {promoted_ms} ms; node {old} back as its \
             replica after {} ms",
            lag.as_millis(),
            killed.elapsed().as_millis()
        ))
    }

    pub fn stop(&mut self) {
        for n in &self.nodes {
            if let Ok(mut n) = n.lock() {
                n.stop();
            }
        }
    }
}

/// The replicated Redis of a run with failovers.
pub enum Topology {
    Sentinel(Replicated),
    Cluster(ReplicatedCluster),
}

impl Topology {
    pub fn url(&self) -> String {
        match self {
            Topology::Sentinel(s) => s.url(),
            Topology::Cluster(c) => c.url(),
        }
    }

    pub async fn stall(&mut self, pick: usize) -> anyhow::Result<Instant> {
        match self {
            Topology::Sentinel(s) => s.stall().await,
            Topology::Cluster(c) => c.stall(pick),
        }
    }

    /// The bytes of writes the stalled primary took since the stall.
    pub fn unreplicated(&self) -> u64 {
        match self {
            Topology::Sentinel(s) => s.unreplicated(),
            Topology::Cluster(c) => c.unreplicated(),
        }
    }

    pub async fn fail_over(&mut self, stalled: Instant) -> anyhow::Result<String> {
        match self {
            Topology::Sentinel(s) => s.fail_over(stalled).await,
            Topology::Cluster(c) => c.fail_over(stalled).await,
        }
    }

    pub fn stop(&mut self) {
        match self {
            Topology::Sentinel(s) => s.stop(),
            Topology::Cluster(c) => c.stop(),
        }
    }

    /// A data node, for the single-Redis slot of the run (unused by the
    /// failover runs' faults).
    pub fn first_node(&self) -> Arc<Mutex<Redis>> {
        match self {
            Topology::Sentinel(s) => s.nodes[0].clone(),
            Topology::Cluster(c) => c.nodes[0].clone(),
        }
    }
}
