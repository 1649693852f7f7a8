//! Child processes and their resource use: deductor's CPU time comes from
//! the kernel's accounting of the child (`wait4`), its peak RSS from its
//! VmHWM; Redis and Kafka are sampled from `/proc/<pid>/stat`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use deductor_testkit::service;

/// What a finished child used.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub exit_code: i32,
    pub wall_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    /// Peak resident set (VmHWM, read every 20 ms while it ran), KiB.
    pub max_rss_kib: u64,
}

impl Usage {
    pub fn cpu_s(&self) -> f64 {
        self.user_s + self.sys_s
    }
}

/// A running deductor.
pub struct Child {
    pid: i32,
    waiter: std::thread::JoinHandle<anyhow::Result<Usage>>,
    /// The text of its last /metrics scrape (empty before one answered).
    last_metrics: std::sync::Arc<std::sync::Mutex<String>>,
}

/// Starts `bin args...` with every `DEDUCTOR_*` variable of this process
/// removed (the bench passes its settings as flags), output to `log`.
/// `metrics_port`: deductor's /metrics, scraped every 2 s while it runs,
/// as Prometheus would (the service folds its histogram samples into their
/// buckets every second itself, `ops::http::spawn_upkeep`, so the scrapes
/// no longer bound its memory); the last text is kept ([`Child::last_metrics`]).
pub fn spawn(
    bin: &Path,
    args: &[String],
    log: &Path,
    metrics_port: Option<u16>,
) -> anyhow::Result<Child> {
    let mut cmd = service::logged(bin, log)?;
    cmd.args(args);
    let started = Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let pid = child.id() as i32;
    // The child is reaped by wait4 below, never by std (which would lose
    // the rusage); `child` is only dropped.
    drop(child);
    let last_metrics = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let last = last_metrics.clone();
    let waiter = std::thread::spawn(move || wait4(pid, started, metrics_port, &last));
    Ok(Child {
        pid,
        waiter,
        last_metrics,
    })
}

/// Peak resident set of a running process's current image, KiB.
fn vm_hwm_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Reaps the child, reading its VmHWM every 20 ms until then. (The rusage
/// ru_maxrss cannot be used: Linux carries the parent's peak RSS at fork
/// into the child's, so it reported the bench's own memory.)
fn wait4(
    pid: i32,
    started: Instant,
    metrics_port: Option<u16>,
    last: &std::sync::Mutex<String>,
) -> anyhow::Result<Usage> {
    let mut status = 0;
    let mut hwm = 0;
    let mut scraped = Instant::now();
    // SAFETY: rusage is plain old data, fully written by wait4 on success.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        if let Some(k) = vm_hwm_kib(pid) {
            hwm = hwm.max(k);
        }
        // SAFETY: plain syscall on our own child; both out-pointers are valid.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            break;
        }
        if r != 0 {
            bail!("wait4({pid}): {}", std::io::Error::last_os_error());
        }
        if let Some(port) = metrics_port {
            if scraped.elapsed() >= Duration::from_secs(2) {
                scraped = Instant::now();
                if let Some(text) = metrics_text(port) {
                    *last.lock().unwrap_or_else(|p| p.into_inner()) = text;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let wall_s = started.elapsed().as_secs_f64();
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let exit_code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    Ok(Usage {
        exit_code,
        wall_s,
        user_s: secs(ru.ru_utime),
        sys_s: secs(ru.ru_stime),
        max_rss_kib: hwm,
    })
}

/// GET /metrics: the response (headers and body), or None when the
/// service does not answer.
pub fn metrics_text(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    c.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut body = Vec::new();
    c.read_to_end(&mut body).ok()?;
    Some(String::from_utf8_lossy(&body).into_owned())
}

/// `deductor_event_stage_seconds`' sum and count per stage, from a
/// /metrics text.
pub fn stage_totals(text: &str) -> std::collections::BTreeMap<String, (f64, f64)> {
    let mut out = std::collections::BTreeMap::<String, (f64, f64)>::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("deductor_event_stage_seconds_") else {
            continue;
        };
        let (kind, rest) = match rest.split_once('{') {
            Some(x) => x,
            None => continue,
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Some(stage) = labels
            .split(',')
            .find_map(|l| l.strip_prefix("stage=\""))
            .map(|v| v.trim_end_matches('"'))
        else {
            continue;
        };
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        let e = out.entry(stage.to_owned()).or_default();
        match kind {
            "sum" => e.0 = v,
            "count" => e.1 = v,
            _ => {}
        }
    }
    out
}

/// Mean ms per stage between two /metrics texts of one process.
pub fn stage_means(before: &str, after: &str) -> std::collections::BTreeMap<String, f64> {
    let b = stage_totals(before);
    stage_totals(after)
        .into_iter()
        .filter_map(|(stage, (sum, count))| {
            let (s0, c0) = b.get(&stage).copied().unwrap_or_default();
            (count > c0).then(|| (stage, (sum - s0) / (count - c0) * 1000.0))
        })
        .collect()
}

/// (sum, count) of the unlabelled histogram `name` in a /metrics text.
pub fn histogram_totals(text: &str, name: &str) -> Option<(f64, f64)> {
    let value = |suffix: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(suffix)?;
            rest.strip_prefix(' ')?.trim().parse::<f64>().ok()
        })
    };
    Some((value("_sum")?, value("_count")?))
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Child {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// A handle on the text of its last /metrics scrape.
    pub fn last_metrics(&self) -> std::sync::Arc<std::sync::Mutex<String>> {
        self.last_metrics.clone()
    }

    pub fn finished(&self) -> bool {
        self.waiter.is_finished()
    }

    /// SIGTERM: the service drains, commits and exits 0 (G4).
    pub fn terminate(&self) {
        if !self.finished() {
            // SAFETY: plain syscall on our own, not yet reaped child.
            unsafe { libc::kill(self.pid, libc::SIGTERM) };
        }
    }

    fn kill(&self) {
        if !self.finished() {
            // SAFETY: as above.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }

    /// Waits for the exit; after `timeout` the child is killed and this fails.
    pub fn wait(self, timeout: Duration) -> anyhow::Result<Usage> {
        let deadline = Instant::now() + timeout;
        while !self.finished() {
            if Instant::now() > deadline {
                self.kill();
                let _ = self.waiter.join();
                bail!(
                    "deductor (pid {}) did not finish within {timeout:?}; killed",
                    self.pid
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.waiter
            .join()
            .map_err(|_| anyhow::anyhow!("wait4 thread panicked"))?
    }
}

/// CPU seconds (user + system) a process has used so far; 0 if unreadable.
/// The CPU seconds of the service, Redis and the broker at one instant.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    pub at: Instant,
    pub service: f64,
    pub redis: f64,
    pub kafka: f64,
}

impl Mark {
    pub fn now(service: i32, redis: Option<i32>, kafka: Option<i32>) -> Mark {
        Mark {
            at: Instant::now(),
            service: cpu_seconds(Some(service)),
            redis: cpu_seconds(redis),
            kafka: cpu_seconds(kafka),
        }
    }

    /// The CPU each used from `first` to `self`.
    pub fn since(&self, first: &Mark) -> crate::report::Window {
        crate::report::Window {
            wall_s: (self.at - first.at).as_secs_f64().max(0.001),
            service_s: self.service - first.service,
            redis_s: self.redis - first.redis,
            kafka_s: self.kafka - first.kafka,
        }
    }
}

pub fn cpu_seconds(pid: Option<i32>) -> f64 {
    let Some(pid) = pid else { return 0.0 };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces): state is the
    // 3rd field, utime and stime the 14th and 15th.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) / hz
}

/// The 1-minute load average.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[cfg(test)]
mod stage_tests {
    use super::*;

    #[test]
    fn stage_means_are_the_difference_of_two_scrapes() {
        let before = "deductor_event_stage_seconds_sum{stage=\"redis\"} 1\n\
                      deductor_event_stage_seconds_count{stage=\"redis\"} 10\n";
        let after = "# HELP x\n\
                     deductor_event_stage_seconds_bucket{stage=\"redis\",le=\"0.001\"} 3\n\
                     deductor_event_stage_seconds_sum{stage=\"redis\"} 3\n\
                     deductor_event_stage_seconds_count{stage=\"redis\"} 30\n\
                     deductor_event_stage_seconds_sum{stage=\"commit\"} 0.5\n\
                     deductor_event_stage_seconds_count{stage=\"commit\"} 5\n\
                     deductor_event_stage_seconds_sum{stage=\"publish\"} 0\n\
                     deductor_event_stage_seconds_count{stage=\"publish\"} 0\n";
        let m = stage_means(before, after);
        assert_eq!(m.len(), 2, "{m:?}");
        assert!((m["redis"] - 100.0).abs() < 1e-9, "{m:?}");
        assert!((m["commit"] - 100.0).abs() < 1e-9, "{m:?}");
    }

    #[test]
    fn histogram_totals_read_the_named_histogram_only() {
        let text = "# TYPE deductor_batch_lines histogram\n\
                    deductor_batch_lines_bucket{le=\"1\"} 2\n\
                    deductor_batch_lines_sum 67\n\
                    deductor_batch_lines_count 3\n\
                    deductor_batch_lines_total_sum 9\n";
        assert_eq!(
            histogram_totals(text, "deductor_batch_lines"),
            Some((67.0, 3.0))
        );
        assert_eq!(histogram_totals(text, "deductor_other"), None);
    }
}
