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
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::stack::Redis;

pub const SERVICE: &str = "deductor";

/// What the replication link does with the primary's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Flowing,
    /// Held: not read from the primary (so never acknowledged by the replica).
    Stalled,
    /// Closed without delivering what was held.
    Cut,
}

/// A TCP proxy in front of a data node. Connections whose client sent
/// `PSYNC`/`SYNC` (a replica) obey [`Link`]; the others always flow.
pub struct LinkProxy {
    pub port: u16,
    state: watch::Sender<Link>,
}

impl LinkProxy {
    pub async fn start(port: u16, target: u16) -> anyhow::Result<LinkProxy> {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .with_context(|| format!("binding the link proxy on {port}"))?;
        let (state, rx) = watch::channel(Link::Flowing);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let rx = rx.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    relay(client, server, rx).await;
                });
            }
        });
        Ok(LinkProxy { port, state })
    }

    pub fn set(&self, link: Link) {
        let _ = self.state.send(link);
    }
}

async fn relay(client: TcpStream, server: TcpStream, mut rx: watch::Receiver<Link>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut c_rd, mut c_wr) = client.into_split();
    let (mut s_rd, mut s_wr) = server.into_split();
    let replica = Arc::new(AtomicBool::new(false));
    let is_replica = replica.clone();
    let upstream = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match c_rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            if chunk.windows(4).any(|w| w == b"SYNC") {
                is_replica.store(true, Ordering::SeqCst);
            }
            if s_wr.write_all(chunk).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let link = *rx.borrow_and_update();
        if replica.load(Ordering::SeqCst) {
            match link {
                Link::Cut => break,
                Link::Stalled => {
                    if rx.changed().await.is_err() {
                        break;
                    }
                    continue;
                }
                Link::Flowing => {}
            }
        }
        tokio::select! {
            r = s_rd.read(&mut buf) => {
                let n = match r {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if c_wr.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            changed = rx.changed() => {
                if changed.is_err() {
                    break;
                }
            }
        }
    }
    upstream.abort();
}

/// `redis-cli -p PORT ARGS...` (stdout, trimmed); empty when it fails.
fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

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

/// Two data nodes (one primary, one replica) behind their proxies, and
/// three sentinels.
pub struct Replicated {
    pub nodes: [Arc<Mutex<Redis>>; 2],
    pub proxies: [LinkProxy; 2],
    /// Index of the node that is the primary now.
    pub primary: usize,
    sentinels: Vec<(u16, Child)>,
    pub failovers: u32,
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
            failovers: 0,
        };
        set.wait_in_sync(1).await?;
        for k in 0..3 {
            let sport = port + 20 + k;
            let sdir = dir.join(format!("sentinel-{k}"));
            std::fs::create_dir_all(&sdir)?;
            let conf = sdir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {sport}\nbind 127.0.0.1\ndir {}\nlogfile sentinel.log\n\
                     sentinel monitor {SERVICE} 127.0.0.1 {} 2\n\
                     sentinel down-after-milliseconds {SERVICE} 1000\n\
                     sentinel failover-timeout {SERVICE} 3000\n\
                     sentinel parallel-syncs {SERVICE} 1\n",
                    sdir.display(),
                    proxy_ports[0]
                ),
            )?;
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting redis-server --sentinel")?;
            // scripts/chaos kills what a crashed run left by these.
            std::fs::write(sdir.join("pid"), child.id().to_string())?;
            set.sentinels.push((sport, child));
        }
        let first = set.sentinels[0].0;
        eventually(
            Duration::from_secs(90),
            "the sentinels know the replica and each other",
            || {
                let master = cli(first, &["SENTINEL", "MASTER", SERVICE]);
                let field = |name: &str| {
                    let mut lines = master.lines();
                    while let Some(l) = lines.next() {
                        if l == name {
                            return lines.next().unwrap_or("").to_owned();
                        }
                    }
                    String::new()
                };
                field("num-slaves") == "1" && field("num-other-sentinels") == "2"
            },
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
    pub fn stall(&mut self) -> Instant {
        self.proxies[self.primary].set(Link::Stalled);
        Instant::now()
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
        self.wait_in_sync(old).await?;
        self.primary = new;
        self.failovers += 1;
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
