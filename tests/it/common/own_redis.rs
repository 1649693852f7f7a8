//! A Redis server of one test's own, for the tests that kill, restart or
//! freeze Redis under a running service. They used the dev stack's shared
//! Redis and so held the whole stack exclusively ([`super::stack_exclusive`]):
//! every other test waited for them, and they for every other. On a server
//! of their own (same durability settings as the dev stack's:
//! config/dev-stack/redis-common.conf) they hold the stack shared, for its
//! Kafka, and run beside the others.
//!
//! `redis-server` is the one first on PATH: Debian's Redis, or Valkey's in
//! scripts/test's valkey8 cell (`scripts/dev-stack env` puts it first).

use super::replication::{self, Proc};
use super::service;

pub struct OwnRedis {
    dir: tempfile::TempDir,
    port: u16,
    node: Option<Proc>,
}

impl OwnRedis {
    /// Starts the server on a free loopback port and waits for PING.
    pub async fn start() -> OwnRedis {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = replication::free_port();
        let mut own = OwnRedis {
            dir,
            port,
            node: None,
        };
        own.restart().await;
        own
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGKILL (no shutdown; what `appendfsync always` wrote survives), and
    /// waits until nothing answers on its port.
    pub async fn kill(&mut self) {
        if let Some(mut node) = self.node.take() {
            node.kill9();
        }
        service::wait_closed(&self.addr(), "SIGKILL").await;
    }

    /// Starts the server again on its port, from its own AOF, and waits
    /// until it answers PING (not LOADING).
    pub async fn restart(&mut self) {
        assert!(self.node.is_none(), "{} is running", self.addr());
        self.node = Some(replication::redis(self.dir.path(), self.port, &[]));
        replication::wait_ping(self.port).await;
    }

    /// SIGSTOP: the server holds its connections and answers nothing.
    pub fn freeze(&self) {
        if let Some(node) = &self.node {
            node.signal(libc::SIGSTOP);
        }
    }

    /// SIGCONT after [`OwnRedis::freeze`].
    pub fn thaw(&self) {
        if let Some(node) = &self.node {
            node.signal(libc::SIGCONT);
        }
    }
}
