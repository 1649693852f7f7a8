//! Sentinels of a replicated Redis that a test or a chaos run starts on its
//! own: their configuration, their start, and when they know the whole set.

use std::io;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The name under which the sentinels monitor the primary.
pub const SERVICE: &str = "deductor";

/// Writes `dir/sentinel.conf` (creating `dir`) for a sentinel on `port`
/// that monitors [`SERVICE`] at 127.0.0.1:`primary_port` (quorum 2, down
/// after 2 s, failover timeout 10 s, one replica resyncing at a time), then
/// the lines `extra` (credentials), and starts `redis-server --sentinel` on
/// it with its output discarded. Its log is `dir/sentinel.log`.
///
/// Down after 2 s and a 10 s failover timeout, not less: on a loaded 2-core
/// machine, sentinels with 1 s and 3 s judged the new primary down right
/// after a failover and failed over again, back to the old primary as it
/// restarted as a replica, and the replication test waiting for it to sync
/// timed out (CI, `ledger::replication::with_the_gate_a_failover_loses_no_acknowledged_deduction`).
pub fn start(dir: &Path, port: u16, primary_port: u16, extra: &str) -> io::Result<Child> {
    std::fs::create_dir_all(dir)?;
    let conf = dir.join("sentinel.conf");
    let text = format!(
        "port {port}\nbind 127.0.0.1\ndir {}\nlogfile sentinel.log\n\
         sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n\
         sentinel down-after-milliseconds {SERVICE} 2000\n\
         sentinel failover-timeout {SERVICE} 10000\n\
         sentinel parallel-syncs {SERVICE} 1\n{extra}",
        dir.display()
    );
    std::fs::write(&conf, text)?;
    Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// A field of a `SENTINEL MASTER` reply as `redis-cli` prints it (each
/// name on a line, its value on the next); empty when absent.
pub fn master_field(master: &str, name: &str) -> String {
    let mut lines = master.lines();
    while let Some(l) = lines.next() {
        if l == name {
            return lines.next().unwrap_or("").to_owned();
        }
    }
    String::new()
}

/// Whether a `SENTINEL MASTER` reply shows `replicas` replicas and
/// `other_sentinels` other sentinels: the sentinel knows the whole set.
pub fn knows(master: &str, replicas: usize, other_sentinels: usize) -> bool {
    master_field(master, "num-slaves") == replicas.to_string()
        && master_field(master, "num-other-sentinels") == other_sentinels.to_string()
}
