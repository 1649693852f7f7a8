//! The services under test and the faults done to them: a Redis of the run's
//! own (AOF, `appendfsync always`), optionally behind a network namespace
//! whose port can be cut with iptables, and the broker of a separate
//! `scripts/dev-stack` instance, killed and restarted through that script.
//! Both can also be frozen (SIGSTOP) and thawed (SIGCONT): a stall.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use deductor::config::RedisSettings;

/// Runs a command, failing with its stderr.
pub fn sh(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {} {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A network namespace joined to the host by a veth pair: the host side is
/// `host_ip`, the namespace side `ns_ip`.
#[derive(Debug, Clone)]
pub struct Netns {
    pub name: String,
    veth: String,
    pub host_ip: String,
    pub ns_ip: String,
}

/// How a cut behaves: packets vanish (timeouts) or are answered with a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    Drop,
    Reset,
}

impl Cut {
    pub fn as_str(self) -> &'static str {
        match self {
            Cut::Drop => "drop",
            Cut::Reset => "reset",
        }
    }

    fn target(self) -> &'static [&'static str] {
        match self {
            Cut::Drop => &["-j", "DROP"],
            Cut::Reset => &["-j", "REJECT", "--reject-with", "tcp-reset"],
        }
    }
}

impl Netns {
    /// Creates the namespace and the veth pair (`tag`: a few hex digits).
    pub fn create(tag: &str, subnet: u8) -> anyhow::Result<Netns> {
        for tool in ["ip", "iptables"] {
            if Command::new(tool).arg("--version").output().is_err() {
                bail!("{tool} is not installed (apt-get install iproute2 iptables)");
            }
        }
        let n = Netns {
            name: format!("dchaos-{tag}"),
            veth: format!("dch{tag}"),
            host_ip: format!("10.231.{subnet}.1"),
            ns_ip: format!("10.231.{subnet}.2"),
        };
        let peer = format!("{}p", n.veth);
        let host_cidr = format!("{}/30", n.host_ip);
        let ns_cidr = format!("{}/30", n.ns_ip);
        sh("ip", &["netns", "add", &n.name])?;
        let steps: [&[&str]; 7] = [
            &[
                "link", "add", &n.veth, "type", "veth", "peer", "name", &peer,
            ],
            &["link", "set", &peer, "netns", &n.name],
            &["addr", "add", &host_cidr, "dev", &n.veth],
            &["link", "set", &n.veth, "up"],
            &["-n", &n.name, "addr", "add", &ns_cidr, "dev", &peer],
            &["-n", &n.name, "link", "set", &peer, "up"],
            &["-n", &n.name, "link", "set", "lo", "up"],
        ];
        for step in steps {
            if let Err(e) = sh("ip", step) {
                n.destroy();
                return Err(e);
            }
        }
        Ok(n)
    }

    /// Cuts TCP `port` inside the namespace.
    pub fn cut(&self, port: u16, how: Cut) -> anyhow::Result<()> {
        let port = port.to_string();
        let mut args = vec![
            "netns", "exec", &self.name, "iptables", "-I", "INPUT", "-p", "tcp", "--dport", &port,
        ];
        args.extend_from_slice(how.target());
        sh("ip", &args)
    }

    /// Removes every cut.
    pub fn heal(&self) -> anyhow::Result<()> {
        sh(
            "ip",
            &["netns", "exec", &self.name, "iptables", "-F", "INPUT"],
        )
    }

    /// Deletes the veth pair and the namespace (best effort).
    pub fn destroy(&self) {
        let _ = sh("ip", &["link", "del", &self.veth]);
        let _ = sh("ip", &["netns", "del", &self.name]);
    }
}

/// A redis-server owned by the run.
pub struct Redis {
    dir: PathBuf,
    pub port: u16,
    /// Address clients use.
    pub host: String,
    netns: Option<Netns>,
    child: Option<Child>,
    pub restarts: u32,
    /// redis.conf as [`Redis::new`] wrote it (before [`Redis::configure`]).
    conf: String,
}

impl Redis {
    /// Writes the config: the dev-stack's shared settings (AOF, fsync always),
    /// then this run's port, bind address and paths.
    pub fn new(repo: &Path, dir: &Path, port: u16, netns: Option<Netns>) -> anyhow::Result<Redis> {
        std::fs::create_dir_all(dir)?;
        let host = netns
            .as_ref()
            .map_or("127.0.0.1".to_owned(), |n| n.ns_ip.clone());
        let bind = if host == "127.0.0.1" {
            host.clone()
        } else {
            format!("{host} 127.0.0.1")
        };
        let conf = format!(
            "include {common}\ndaemonize no\nprotected-mode no\nport {port}\nbind {bind}\ndir {dir}\nlogfile {dir}/redis.log\npidfile {dir}/redis.pid\nappendonly yes\nappendfsync always\n",
            common = repo.join("config/dev-stack/redis-common.conf").display(),
            dir = dir.display(),
        );
        std::fs::write(dir.join("redis.conf"), &conf)?;
        Ok(Redis {
            dir: dir.to_owned(),
            port,
            host,
            netns,
            child: None,
            restarts: 0,
            conf,
        })
    }

    /// Rewrites redis.conf as [`Redis::new`] wrote it plus `extra` lines
    /// (for the next start).
    pub fn configure(&self, extra: &str) -> anyhow::Result<()> {
        std::fs::write(self.dir.join("redis.conf"), format!("{}{extra}", self.conf))?;
        Ok(())
    }

    pub fn url(&self) -> String {
        format!("redis://{}:{}", self.host, self.port)
    }

    pub fn netns(&self) -> Option<&Netns> {
        self.netns.as_ref()
    }

    /// Starts redis-server (inside the namespace if any) and waits for PONG.
    pub fn start(&mut self) -> anyhow::Result<()> {
        let conf = self.dir.join("redis.conf");
        let mut cmd = match &self.netns {
            Some(n) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &n.name, "redis-server"]);
                c
            }
            None => Command::new("redis-server"),
        };
        let child = cmd
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server")?;
        std::fs::write(self.dir.join("pid"), child.id().to_string())?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.ping() {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    bail!(
                        "redis-server exited with {status}; see {}/redis.log",
                        self.dir.display()
                    );
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("redis did not answer PING within 60 s")
    }

    /// True when the server answers PONG (a server loading its AOF does not).
    pub fn ping(&self) -> bool {
        let addr = format!("{}:{}", self.host, self.port);
        let Ok(addr) = addr.parse() else { return false };
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 16];
        matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
    }

    /// SIGSTOP: the server keeps its connections but answers nothing, so
    /// every script sent meanwhile stays pending (a stall, not an outage).
    pub fn pause(&self) -> anyhow::Result<()> {
        match &self.child {
            Some(c) => signal(c.id(), "STOP"),
            None => bail!("redis is not running"),
        }
    }

    /// SIGCONT after [`Redis::pause`]: the pending scripts run.
    pub fn resume(&self) -> anyhow::Result<()> {
        match &self.child {
            Some(c) => signal(c.id(), "CONT"),
            None => Ok(()),
        }
    }

    /// `redis-cli -h HOST -p PORT ARGS...` (stdout, trimmed; empty when it
    /// fails): reaches a server inside the namespace too.
    pub fn cli(&self, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-h", &self.host, "-p", &self.port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    }

    /// SIGKILL: no shutdown, no final fsync beyond what `always` did.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn stop(&mut self) {
        self.kill();
        if let Some(n) = &self.netns {
            n.destroy();
        }
    }
}

/// A broker's pid from dev-stack's pidfile `file`, checked against its
/// command line (`kafka.Kafka`) so that a recycled pid is never signalled.
fn broker_pid(file: &Path) -> anyhow::Result<u32> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let pid: u32 = text
        .trim()
        .parse()
        .with_context(|| format!("{}: not a pid", file.display()))?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if !String::from_utf8_lossy(&cmdline).contains("kafka.Kafka") {
        bail!("pid {pid} of {} is not a Kafka broker", file.display());
    }
    Ok(pid)
}

/// Sends `sig` (a name: STOP, CONT, ...) to `pid`.
pub fn signal(pid: u32, sig: &str) -> anyhow::Result<()> {
    sh("kill", &[&format!("-{sig}"), &pid.to_string()])
}

/// The broker of the separate dev-stack instance (its env is inherited).
pub struct Broker {
    pub stack_cmd: PathBuf,
    pub port: u16,
    /// The dev-stack instance's state dir (its `kafka/kafka.pid`).
    pub stack_dir: PathBuf,
}

impl Broker {
    /// The broker's pid, from dev-stack's pidfile, checked against its
    /// command line so that a recycled pid is never signalled.
    fn pid(&self) -> anyhow::Result<u32> {
        broker_pid(&self.stack_dir.join("kafka/kafka.pid"))
    }

    /// SIGSTOP: connections stay open, nothing is acknowledged (produces,
    /// commits, heartbeats all wait).
    pub fn pause(&self) -> anyhow::Result<()> {
        signal(self.pid()?, "STOP")
    }

    pub fn resume(&self) -> anyhow::Result<()> {
        signal(self.pid()?, "CONT")
    }

    pub fn kill(&self) -> anyhow::Result<()> {
        sh(&self.stack_cmd.to_string_lossy(), &["kill-kafka"])
    }

    pub fn start(&self) -> anyhow::Result<()> {
        sh(&self.stack_cmd.to_string_lossy(), &["start-kafka"])
    }

    fn rule(&self) -> Vec<String> {
        [
            "INPUT",
            "-i",
            "lo",
            "-p",
            "tcp",
            "--dport",
            &self.port.to_string(),
            "-m",
            "comment",
            "--comment",
            "deductor-chaos",
            "-j",
            "DROP",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Cuts the broker's client port on the host's loopback (the dev-stack
    /// broker listens and advertises 127.0.0.1 only, so it cannot be moved
    /// into a namespace without its own listener configuration).
    pub fn cut(&self) -> anyhow::Result<()> {
        let mut args = vec!["-I".to_owned()];
        args.extend(self.rule());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        sh("iptables", &args)
    }

    pub fn heal(&self) -> anyhow::Result<()> {
        let mut args = vec!["-D".to_owned()];
        args.extend(self.rule());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // Delete every copy of the rule.
        let mut removed = false;
        while sh("iptables", &args).is_ok() {
            removed = true;
        }
        if !removed {
            bail!("no broker cut rule to remove");
        }
        Ok(())
    }
}

/// Redis settings for the run's own tools, independent of any `DEDUCTOR_*`
/// variables (scripts/chaos exports the dev-stack's, which are not settings):
/// the testkit's, with a larger pool and longer timeouts.
pub fn redis_settings(url: &str, prefix: &str) -> RedisSettings {
    RedisSettings {
        pool_size: 4,
        command_timeout_ms: 10_000,
        connect_timeout_ms: 5_000,
        slow_script_ms: 10_000,
        ..deductor_testkit::settings::redis(url, prefix)
    }
}

/// The 3-node cluster of `--brokers3` (scripts/dev-stack's `brokers3-*`
/// commands; its env names the instance): nodes 1 to 3, each broker and
/// controller, killed and started through that script, frozen and thawed
/// here by the pid in its pidfile.
pub struct Cluster3 {
    pub stack_cmd: PathBuf,
    /// The dev-stack instance's state dir (its `brokers3/node-N/kafka.pid`).
    pub stack_dir: PathBuf,
    /// The bootstrap list (all three nodes).
    pub brokers: String,
}

impl Cluster3 {
    pub const NODES: [i32; 3] = [1, 2, 3];

    /// Node `n`'s pid, from dev-stack's pidfile, checked against its command
    /// line so that a recycled pid is never signalled.
    fn pid(&self, n: i32) -> anyhow::Result<u32> {
        broker_pid(&self.stack_dir.join(format!("brokers3/node-{n}/kafka.pid")))
    }

    fn stack(&self, args: &[&str]) -> anyhow::Result<()> {
        sh(&self.stack_cmd.to_string_lossy(), args)
    }

    /// SIGKILL node `n`.
    pub fn kill(&self, n: i32) -> anyhow::Result<()> {
        self.stack(&["brokers3-kill", &n.to_string()])
    }

    /// Starts node `n` and waits until the cluster lists it again.
    pub fn start(&self, n: i32) -> anyhow::Result<()> {
        self.stack(&["brokers3-start", &n.to_string()])
    }

    /// SIGSTOP node `n`: its connections stay open, it answers nothing, its
    /// heartbeats to the controller quorum stop.
    pub fn pause(&self, n: i32) -> anyhow::Result<()> {
        signal(self.pid(n)?, "STOP")
    }

    pub fn resume(&self, n: i32) -> anyhow::Result<()> {
        signal(self.pid(n)?, "CONT")
    }

    /// Best effort after a failed fault: every node running and thawed.
    pub fn heal_all(&self) {
        for n in Self::NODES {
            match self.pid(n) {
                Ok(pid) => {
                    let _ = signal(pid, "CONT");
                }
                Err(_) => {
                    let _ = self.start(n);
                }
            }
        }
    }

    /// Moves the leadership of every partition of `topics` to another
    /// in-sync replica (reordered replicas, then a preferred election);
    /// returns the script's "moved M of N partitions".
    pub fn move_leaders(&self, topics: &[&str]) -> anyhow::Result<String> {
        let mut args = vec!["brokers3-move-leaders"];
        args.extend_from_slice(topics);
        let out = Command::new(&self.stack_cmd)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .context("running dev-stack brokers3-move-leaders")?;
        if !out.status.success() {
            bail!(
                "brokers3-move-leaders: {} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}
