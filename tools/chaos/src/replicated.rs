//! Replicated Redis for the failover fault: two data nodes, each behind a
//! [`LinkProxy`] of its own, and three sentinels (quorum 2, down after 2 s).
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
use deductor_testkit::redis_cli::{
    cli, cluster_create, cluster_in_sync, cluster_primaries, cluster_url,
};
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
    /// For nodes added by the node-add fault: the repository, the run's
    /// Redis directory and the base port.
    repo: std::path::PathBuf,
    dir: std::path::PathBuf,
    base_port: u16,
    /// Replicas expected in sync (3, one more per node-add fault).
    replicas: usize,
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
            let (r, p) =
                cluster_node(repo, dir, usize::from(i), port + 30 + i, port + 40 + i).await?;
            proxies.push(p);
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
            repo: repo.to_owned(),
            dir: dir.to_owned(),
            base_port: port,
            replicas: 3,
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
        let replicas = self.replicas;
        eventually(
            Duration::from_secs(90),
            &format!("the cluster is ok with {replicas} replicas in sync"),
            || cluster_in_sync(&ports, replicas),
        )
        .await
    }

    /// The primaries: (node id, index), from `CLUSTER NODES` of node 0 (or
    /// the first that answers).
    fn primaries(&self) -> Vec<(String, usize)> {
        (0..self.nodes.len())
            .map(|i| cluster_primaries(self.port(i)))
            .find(|p| !p.is_empty())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| Some((p.id, self.by_proxy(p.port)?)))
            .collect()
    }

    /// The slot-migration fault: the slot of `key` (a hot promotion's hash)
    /// moves from its primary to another one while events flow, as
    /// `redis-cli --cluster reshard` does: the slot held IMPORTING on the
    /// target and MIGRATING on the source while its keys move in chunks of
    /// `chunk` every 100 ms (at least `hold`), then assigned to the target
    /// on every primary.
    pub async fn migrate_slot(
        &self,
        key: &str,
        hold: Duration,
        chunk: usize,
    ) -> anyhow::Result<String> {
        let any = self.port(0);
        let slot: u16 = cli(any, &["CLUSTER", "KEYSLOT", key])
            .parse()
            .with_context(|| format!("CLUSTER KEYSLOT {key}"))?;
        let primaries = self.primaries();
        let owner_port = |i: usize| self.port(i);
        let Some((source_id, source)) = primaries
            .iter()
            .find(|(_, i)| {
                cli(
                    owner_port(*i),
                    &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()],
                )
                .parse::<u64>()
                .is_ok_and(|n| n > 0)
            })
            .cloned()
        else {
            return Ok(format!(
                "cluster: slot {slot} of {key} holds no key: skipped"
            ));
        };
        let Some((target_id, target)) = primaries.iter().find(|(id, _)| *id != source_id).cloned()
        else {
            bail!("no other primary to move slot {slot} to");
        };
        let (sp, tp, s) = (self.port(source), self.port(target), slot.to_string());
        let keys_at_start = cli(sp, &["CLUSTER", "COUNTKEYSINSLOT", &s]);
        let ok = |what: &str, reply: String| -> anyhow::Result<()> {
            if reply != "OK" {
                bail!("{what}: {reply:?}");
            }
            Ok(())
        };
        ok(
            "SETSLOT IMPORTING",
            cli(tp, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &source_id]),
        )?;
        ok(
            "SETSLOT MIGRATING",
            cli(sp, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &target_id]),
        )?;
        let started = Instant::now();
        let mut moved = 0usize;
        loop {
            let listed = cli(sp, &["CLUSTER", "GETKEYSINSLOT", &s, &chunk.to_string()]);
            let keys: Vec<&str> = listed.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() && started.elapsed() >= hold {
                break;
            }
            if !keys.is_empty() {
                let mut args = vec!["MIGRATE", "127.0.0.1"];
                let tps = tp.to_string();
                args.extend([tps.as_str(), "", "0", "5000", "KEYS"]);
                args.extend(keys.iter().copied());
                let reply = cli(sp, &args);
                if reply != "OK" && reply != "NOKEY" {
                    bail!("MIGRATE of slot {slot}: {reply:?}");
                }
                moved += keys.len();
            }
            if started.elapsed() > Duration::from_secs(120) {
                bail!("slot {slot} still held keys after 120 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The target first (it owns the slot from then on), then the source,
        // then every other primary; gossip tells the replicas.
        ok(
            "SETSLOT NODE (target)",
            cli(tp, &["CLUSTER", "SETSLOT", &s, "NODE", &target_id]),
        )?;
        ok(
            "SETSLOT NODE (source)",
            cli(sp, &["CLUSTER", "SETSLOT", &s, "NODE", &target_id]),
        )?;
        for (_, i) in &primaries {
            if *i != source && *i != target {
                cli(
                    self.port(*i),
                    &["CLUSTER", "SETSLOT", &s, "NODE", &target_id],
                );
            }
        }
        self.wait_healthy().await?;
        Ok(format!(
            "cluster: slot {slot} ({key}, {keys_at_start} keys) moved from node {source} to node {target}, \
             {moved} keys in {} ms",
            started.elapsed().as_millis()
        ))
    }

    /// The node-add fault: a new primary and its replica (each behind a
    /// proxy of its own, like the others) join the cluster, and
    /// `redis-cli --cluster rebalance --cluster-use-empty-masters` moves
    /// slots, with their keys, onto the new primary while events flow.
    pub async fn add_node(&mut self) -> anyhow::Result<String> {
        let first = self.nodes.len();
        if first + 2 > 10 {
            bail!("at most two node-add faults per run");
        }
        let started = Instant::now();
        let mut added = Vec::new();
        for i in first..first + 2 {
            let off = i as u16;
            let (data, proxy) = (self.base_port + 30 + off, self.base_port + 50 + off);
            let (r, p) = cluster_node(&self.repo, &self.dir, i, data, proxy).await?;
            self.proxies.push(p);
            self.nodes.push(Arc::new(Mutex::new(r)));
            added.push(proxy);
        }
        let existing = format!("127.0.0.1:{}", self.proxies[0].port);
        let primary = format!("127.0.0.1:{}", added[0]);
        let replica = format!("127.0.0.1:{}", added[1]);
        redis_cli_cluster(&["add-node", &primary, &existing])?;
        eventually(Duration::from_secs(30), "the new primary is known", || {
            cli(self.port(0), &["CLUSTER", "NODES"]).contains(&format!("127.0.0.1:{}@", added[0]))
        })
        .await?;
        let new_id = cli(self.port(first), &["CLUSTER", "MYID"]);
        // redis-cli refuses to add a node while the nodes' views differ
        // ("Nodes don't agree about configuration"): the gossip about the
        // new primary takes a moment.
        wait_agree(&existing).await?;
        redis_cli_cluster(&[
            "add-node",
            &replica,
            &existing,
            "--cluster-slave",
            "--cluster-master-id",
            &new_id,
        ])?;
        self.replicas += 1;
        self.wait_healthy().await?;
        wait_agree(&existing).await?;
        let joined = started.elapsed().as_millis();
        redis_cli_cluster(&[
            "rebalance",
            &existing,
            "--cluster-use-empty-masters",
            "--cluster-pipeline",
            "10",
        ])?;
        self.wait_healthy().await?;
        let owned = cli(self.port(0), &["CLUSTER", "NODES"])
            .lines()
            .find(|l| l.starts_with(&new_id))
            .map(|l| l.split_whitespace().skip(8).collect::<Vec<_>>().join(" "))
            .unwrap_or_default();
        Ok(format!(
            "cluster: nodes {first} (primary) and {} (its replica) added in {joined} ms; \
             rebalanced onto it (slots {owned}) after {} ms",
            first + 1,
            started.elapsed().as_millis()
        ))
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

/// Cluster node `i` of the run: its data port `data`, behind a
/// [`LinkProxy`] on `proxy` which it announces (the bus on `proxy` + 10000),
/// started and answering.
async fn cluster_node(
    repo: &Path,
    dir: &Path,
    i: usize,
    data: u16,
    proxy: u16,
) -> anyhow::Result<(Redis, LinkProxy)> {
    let mut r = Redis::new(repo, &dir.join(format!("redis-{i}")), data, None)?;
    r.configure(&format!(
        "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout 1000\n\
         cluster-port {bus}\ncluster-announce-ip 127.0.0.1\ncluster-announce-port {proxy}\n\
         cluster-announce-bus-port {bus}\nreplica-announce-port {proxy}\n",
        bus = proxy + 10_000
    ))?;
    let p = LinkProxy::start(proxy, data).await?;
    tokio::task::block_in_place(|| r.start())?;
    Ok((r, p))
}

/// Until `redis-cli --cluster check` through `node` passes (every node
/// agrees on the slots and no slot is open), at most 60 s.
async fn wait_agree(node: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let check = std::process::Command::new("redis-cli")
            .args(["--cluster", "check", node])
            .output()
            .context("redis-cli --cluster check")?;
        if check.status.success() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the cluster's nodes did not agree within 60 s: {}",
                String::from_utf8_lossy(&check.stdout)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `redis-cli --cluster ARGS... --cluster-yes`; an error with its output.
fn redis_cli_cluster(args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new("redis-cli")
        .arg("--cluster")
        .args(args)
        .arg("--cluster-yes")
        .output()
        .context("redis-cli --cluster")?;
    if !out.status.success() {
        bail!(
            "redis-cli --cluster {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
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

    /// The Cluster, for its own faults (slot migration, node add).
    pub fn cluster(&mut self) -> Option<&mut ReplicatedCluster> {
        match self {
            Topology::Sentinel(_) => None,
            Topology::Cluster(c) => Some(c),
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
