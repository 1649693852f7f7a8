//! Replicated Redis owned by one test: a primary, its replica and (for
//! Sentinel) three sentinels, as child processes on free loopback ports in a
//! temporary directory, killed when dropped. Failover tests kill and stop
//! these processes, so they never touch the shared dev stack.
//!
//! The replica reaches its primary through [`LinkProxy`], which can stall
//! the replication stream (the bytes stay unsent, as on a congested or
//! partitioned link) and then cut it so that they are never delivered.
//! Sentinel monitors the primary at the proxy's address too: a replica
//! whose master address differed from the monitored one would be "fixed"
//! by Sentinel and bypass the proxy.

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use deductor_testkit::sentinel::{self, SERVICE};

/// A port nothing listens on right now, below the kernel's ephemeral range
/// (32768-60999): these nodes are killed and restarted on their port, and a
/// port from the ephemeral range can meanwhile become the local port of some
/// outgoing connection (a Kafka or Redis client of a test running beside),
/// so that the restarted node cannot bind it.
pub fn free_port() -> u16 {
    free_ports(&[0])
}

/// Ports handed out by this test process so far. A port is never handed
/// out twice: two nodes of one test (or of two tests running beside) drew
/// the same random port once, and the second could not bind it.
static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

/// A port `p` such that every `p + offset` is free now and was never
/// handed out by this process; all of them are reserved at once.
fn free_ports(offsets: &[u16]) -> u16 {
    use rand::Rng;
    let mut rng = rand::rng();
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1000 {
        let port = rng.random_range(20_000..32_000);
        let all: Vec<u16> = offsets.iter().map(|o| port + o).collect();
        if all
            .iter()
            .all(|p| !handed.contains(p) && StdListener::bind(("127.0.0.1", *p)).is_ok())
        {
            handed.extend(all);
            return port;
        }
    }
    panic!("no free port in 20000-31999 after 1000 tries")
}

/// One redis-server (or sentinel) child; SIGKILLed when dropped.
pub struct Proc {
    pub port: u16,
    child: Option<Child>,
}

impl Proc {
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// `kill -9`: no shutdown, no last fsync beyond what `appendfsync always` did.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn signal(&self, sig: i32) {
        if self.pid() > 0 {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(self.pid(), sig);
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.kill9();
    }
}

pub use deductor_testkit::redis_cli::{cli, cluster_create, cluster_in_sync, cluster_url};

/// `INFO replication` field of the node on `port`.
pub fn repl_field(port: u16, field: &str) -> String {
    let info = cli(port, &["INFO", "replication"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or("")
        .trim()
        .to_owned()
}

/// The last `n` lines of the log at `path`, last line first ("" when unreadable).
fn log_tail(path: &Path, n: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().rev().take(n).collect();
    lines.join("\n")
}

/// Polls `check` every 100 ms for up to `secs` seconds; panics with `what`.
pub async fn eventually(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check() {
        assert!(Instant::now() < deadline, "timed out after {secs}s: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts a data node (AOF, `appendfsync always`) with `extra` config args.
pub fn redis(dir: &Path, port: u16, extra: &[&str]) -> Proc {
    let dir = dir.join(format!("redis-{port}"));
    std::fs::create_dir_all(&dir).expect("node dir");
    let mut args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--dir",
        dir.to_str().expect("utf-8 path"),
        "--logfile",
        "redis.log",
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--busy-reply-threshold",
        "5000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let child = Command::new("redis-server")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed (scripts/install-deps)");
    Proc {
        port,
        child: Some(child),
    }
}

/// Waits until the node on `port` answers PING (not LOADING; NOAUTH counts:
/// it needs a password).
pub async fn wait_ping(port: u16) {
    eventually(20, &format!("redis on {port} answers PING"), || {
        cli(port, &["PING"]).ends_with("PONG") || cli(port, &["PING"]).contains("NOAUTH")
    })
    .await;
}

pub use deductor_testkit::proxy::{Link, LinkProxy};

/// A primary (behind a [`LinkProxy`]) and one replica, optionally watched by
/// three sentinels (quorum 2, down after 2 s).
pub struct Replicated {
    pub dir: tempfile::TempDir,
    pub primary: Proc,
    pub replica: Proc,
    pub sentinels: Vec<Proc>,
    pub proxy: LinkProxy,
    pub password: Option<String>,
}

impl Replicated {
    /// `sentinel_password`: the sentinels require it (`requirepass`);
    /// `password`: the data nodes require it.
    pub async fn start(
        with_sentinels: bool,
        password: Option<&str>,
        sentinel_password: Option<&str>,
    ) -> Replicated {
        let dir = tempfile::tempdir().expect("tempdir");
        let (p_port, r_port) = (free_port(), free_port());
        let auth: Vec<String> = match password {
            Some(pw) => vec![
                "--requirepass".into(),
                pw.into(),
                "--masterauth".into(),
                pw.into(),
            ],
            None => vec![],
        };
        let auth: Vec<&str> = auth.iter().map(String::as_str).collect();
        let primary = redis(dir.path(), p_port, &auth);
        wait_ping(p_port).await;
        let proxy = LinkProxy::start(0, p_port).await.expect("link proxy");
        let proxy_port = proxy.port.to_string();
        let mut extra = vec!["--replicaof", "127.0.0.1", &proxy_port];
        extra.extend(&auth);
        let replica = redis(dir.path(), r_port, &extra);
        wait_ping(r_port).await;
        let mut set = Replicated {
            dir,
            primary,
            replica,
            sentinels: Vec::new(),
            proxy,
            password: password.map(str::to_owned),
        };
        set.wait_in_sync(r_port).await;
        if with_sentinels {
            for _ in 0..3 {
                let s = set.sentinel(sentinel_password);
                set.sentinels.push(s);
            }
            let sentinel = set.sentinels[0].port;
            let spw = sentinel_password.map(str::to_owned);
            let asks = move |args: &[&str]| {
                let mut all: Vec<&str> = Vec::new();
                if let Some(pw) = &spw {
                    all.extend(["-a", pw.as_str(), "--no-auth-warning"]);
                }
                all.extend(args);
                cli(sentinel, &all)
            };
            eventually(90, "the sentinels know the replica and each other", || {
                sentinel::knows(&asks(&["SENTINEL", "MASTER", SERVICE]), 1, 2)
            })
            .await;
        }
        set
    }

    fn sentinel(&self, password: Option<&str>) -> Proc {
        let port = free_port();
        let dir = self.dir.path().join(format!("sentinel-{port}"));
        let mut extra = String::new();
        if let Some(pw) = &self.password {
            extra.push_str(&format!("sentinel auth-pass {SERVICE} {pw}\n"));
        }
        if let Some(pw) = password {
            extra.push_str(&format!("requirepass {pw}\n"));
        }
        let child =
            sentinel::start(&dir, port, self.proxy.port, &extra).expect("redis-server --sentinel");
        Proc {
            port,
            child: Some(child),
        }
    }

    /// `redis-sentinel://` url of the sentinels.
    pub fn sentinel_url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis-sentinel://{}/{SERVICE}", hosts.join(","))
    }

    /// The primary's address for a direct client: the proxy (which the
    /// replica also uses).
    pub fn primary_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.proxy.port)
    }

    fn auth_args(&self) -> Vec<String> {
        match &self.password {
            Some(pw) => vec!["-a".into(), pw.clone(), "--no-auth-warning".into()],
            None => vec![],
        }
    }

    /// `redis-cli` on a data node, with its password.
    pub fn node_cli(&self, port: u16, args: &[&str]) -> String {
        let auth = self.auth_args();
        let mut all: Vec<&str> = auth.iter().map(String::as_str).collect();
        all.extend(args);
        cli(port, &all)
    }

    /// Until the node on `port` is a replica whose link is up and whose
    /// offset reached its primary's.
    pub async fn wait_in_sync(&self, port: u16) {
        let auth = self.auth_args();
        let mut all: Vec<&str> = auth.iter().map(String::as_str).collect();
        all.extend(["INFO", "replication"]);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let info = cli(port, &all);
            if info.contains("master_link_status:up") {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "timed out after 90s: replica {port} in sync; INFO replication:\n{info}\nlog (last lines first):\n{}",
                    log_tail(&self.dir.path().join(format!("redis-{port}")).join("redis.log"), 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Until the sentinels name `port` as primary; on timeout, panics with
    /// each sentinel's and the replica's last log lines, so a failover that
    /// never came says why (TILT, no good replica, no quorum).
    pub async fn wait_promoted(&self, port: u16, secs: u64, sentinel_password: Option<&str>) {
        let want = port.to_string();
        let deadline = Instant::now() + Duration::from_secs(secs);
        while self.sentinel_primary(sentinel_password) != want {
            if Instant::now() >= deadline {
                let dir = self.dir.path();
                let mut paths: Vec<PathBuf> = self
                    .sentinels
                    .iter()
                    .map(|s| {
                        dir.join(format!("sentinel-{}", s.port))
                            .join("sentinel.log")
                    })
                    .collect();
                paths.push(dir.join(format!("redis-{port}")).join("redis.log"));
                let logs: Vec<String> = paths
                    .iter()
                    .map(|path| {
                        format!(
                            "--- {} (last lines first):\n{}",
                            path.display(),
                            log_tail(path, 25)
                        )
                    })
                    .collect();
                panic!(
                    "timed out after {secs}s: Sentinel promotes {port}; sentinels name {:?}\n{}",
                    self.sentinel_primary(sentinel_password),
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The port the sentinels name as primary now ("" when none answers).
    pub fn sentinel_primary(&self, sentinel_password: Option<&str>) -> String {
        let mut args: Vec<&str> = Vec::new();
        if let Some(pw) = sentinel_password {
            args.extend(["-a", pw, "--no-auth-warning"]);
        }
        args.extend(["SENTINEL", "get-master-addr-by-name", SERVICE]);
        for s in &self.sentinels {
            let out = cli(s.port, &args);
            if let Some(port) = out.lines().nth(1) {
                return port.trim().to_owned();
            }
        }
        String::new()
    }

    /// Starts the killed primary again on its port as a replica of `of`
    /// (what Sentinel would make it), and waits until it is in sync.
    pub async fn restart_old_primary_as_replica_of(&mut self, of: u16) {
        let port = self.primary.port;
        let of = of.to_string();
        let auth: Vec<String> = match &self.password {
            Some(pw) => vec![
                "--requirepass".into(),
                pw.clone(),
                "--masterauth".into(),
                pw.clone(),
            ],
            None => vec![],
        };
        let mut extra = vec!["--replicaof", "127.0.0.1", &of];
        extra.extend(auth.iter().map(String::as_str));
        self.primary = redis(self.dir.path(), port, &extra);
        wait_ping(port).await;
        self.wait_in_sync(port).await;
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().to_owned()
    }
}

/// A port free for a Redis Cluster node: it and its bus port (+10000).
fn free_cluster_port() -> u16 {
    free_ports(&[0, 10_000])
}

/// A Redis Cluster of three primaries with one replica each.
pub struct ReplicatedCluster {
    pub dir: tempfile::TempDir,
    pub nodes: Vec<Proc>,
}

impl ReplicatedCluster {
    pub async fn start() -> ReplicatedCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let port = free_cluster_port();
            nodes.push(redis(
                dir.path(),
                port,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ],
            ));
            wait_ping(port).await;
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        cluster_create(&addrs).expect("cluster create");
        let c = ReplicatedCluster { dir, nodes };
        let ports: Vec<u16> = c.nodes.iter().map(|n| n.port).collect();
        eventually(90, "cluster ok with 3 replicas in sync", || {
            cluster_in_sync(&ports, 3)
        })
        .await;
        c
    }

    pub fn url(&self) -> String {
        let ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        cluster_url(&ports)
    }

    /// The replica node of the primary on `primary`.
    pub fn replica_of(&self, primary: u16) -> &Proc {
        let port: u16 = repl_field(primary, "slave0")
            .split(',')
            .find_map(|kv| kv.strip_prefix("port="))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("primary {primary} has no replica"));
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("the replica is ours")
    }
}
