//! Settings side by side (`--variant NAME=SET;SET...`, repeatable): each
//! round runs every variant's spread throughput run and latency run in turn
//! (the order reversed every other round, so a drifting machine load does
//! not favour one), and the report gives each variant's figures per round
//! and its ratio to the first variant within the same round.
//!
//! Two helpers make the usual comparisons possible on one machine: a
//! replica of the bench Redis (`--replica`, for `redis.wait_replicas`), and
//! an OTLP/HTTP sink (`--otlp-sink`; `{otlp}` in a variant's settings is its
//! url) that accepts and counts the spans deductor exports.

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde::Serialize;

/// One variant: a name and the settings it adds to every deductor run.
#[derive(Debug, Clone, Serialize)]
pub struct Variant {
    pub name: String,
    pub sets: Vec<String>,
}

/// `NAME=SECTION.KEY=VALUE[;SECTION.KEY=VALUE...]`; `NAME=` alone adds
/// nothing (the baseline).
pub fn parse_variant(s: &str) -> Result<Variant, String> {
    let (name, sets) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=SECTION.KEY=VALUE[;...]"))?;
    if name.is_empty() {
        return Err(format!("{s:?}: the variant needs a name"));
    }
    let sets: Vec<String> = sets
        .split(';')
        .filter(|x| !x.is_empty())
        .map(str::to_owned)
        .collect();
    if let Some(bad) = sets.iter().find(|x| !x.contains('=')) {
        return Err(format!("{s:?}: {bad:?} is not SECTION.KEY=VALUE"));
    }
    Ok(Variant {
        name: name.to_owned(),
        sets,
    })
}

/// The order of the variants in round `r`: as given, reversed every other
/// round.
pub fn order(n: usize, round: u32) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    if round % 2 == 1 {
        v.reverse();
    }
    v
}

/// One variant's figures in one round.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub variant: String,
    pub round: u32,
    pub events_per_s: f64,
    pub cpu_per_1k: f64,
    pub max_rss_mib: f64,
    pub offered_rate: f64,
    pub p50_ms: i64,
    pub p99_ms: i64,
    pub p999_ms: i64,
    /// p99 of produced -> read by a read_committed reader.
    pub visible_p99_ms: i64,
    /// CPU per event of the Redis and broker processes over the
    /// throughput run (wall-clock window), µs.
    pub redis_cpu_us: f64,
    pub broker_cpu_us: f64,
}

#[derive(Debug, Default, Serialize)]
pub struct Comparison {
    pub variants: Vec<Variant>,
    pub events: u64,
    pub latency_events: u64,
    pub latency_rate: f64,
    pub rows: Vec<Measured>,
    /// OTLP export requests the sink received (with --otlp-sink).
    pub otlp_requests: Option<u64>,
}

impl Comparison {
    fn row(&self, variant: &str, round: u32) -> Option<&Measured> {
        self.rows
            .iter()
            .find(|m| m.variant == variant && m.round == round)
    }

    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Variants side by side: spread throughput runs of {} events, then latency runs of {} spread events offered at {:.0}/s; \
             each round runs every variant in turn (the order reversed every other round).\n",
            self.events, self.latency_events, self.latency_rate
        );
        for v in &self.variants {
            let sets = if v.sets.is_empty() {
                "(defaults)".to_owned()
            } else {
                v.sets.join(", ")
            };
            let _ = writeln!(s, "- `{}`: {sets}", v.name);
        }
        if let Some(n) = self.otlp_requests {
            let _ = writeln!(s, "\nThe OTLP sink received {n} export requests.");
        }
        let _ = writeln!(
            s,
            "\n| round | variant | events/s | vs `{}` | p50 ms | p99 ms | p99 vs `{}` | p99.9 ms | p99 read_committed ms | CPU s / 1k events | Redis / broker CPU µs per event | peak RSS MiB |",
            self.variants.first().map_or("", |v| v.name.as_str()),
            self.variants.first().map_or("", |v| v.name.as_str()),
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        let rounds = self.rows.iter().map(|m| m.round).max().unwrap_or(0);
        for r in 0..=rounds {
            let base = self.variants.first().and_then(|v| self.row(&v.name, r));
            for v in &self.variants {
                let Some(m) = self.row(&v.name, r) else {
                    continue;
                };
                let ratio = |a: f64, b: Option<f64>| {
                    b.filter(|b| *b > 0.0)
                        .map_or("-".to_owned(), |b| format!("{:.2}x", a / b))
                };
                let _ = writeln!(
                    s,
                    "| {} | `{}` | {:.0} | {} | {} | {} | {} | {} | {} | {:.3} | {:.0} / {:.0} | {:.1} |",
                    r + 1,
                    v.name,
                    m.events_per_s,
                    ratio(m.events_per_s, base.map(|b| b.events_per_s)),
                    m.p50_ms,
                    m.p99_ms,
                    ratio(m.p99_ms as f64, base.map(|b| b.p99_ms as f64)),
                    m.p999_ms,
                    m.visible_p99_ms,
                    m.cpu_per_1k,
                    m.redis_cpu_us,
                    m.broker_cpu_us,
                    m.max_rss_mib
                );
            }
        }
        s
    }
}

/// A replica of the bench Redis (AOF, `appendfsync always`, like it), on
/// `port`, in sync before this returns; killed when dropped.
pub struct Replica {
    child: std::process::Child,
}

impl Replica {
    pub async fn start(
        host: &str,
        primary: u16,
        port: u16,
        dir: &std::path::Path,
    ) -> anyhow::Result<Replica> {
        std::fs::create_dir_all(dir)?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--replicaof", host, &primary.to_string()])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir)
            .args(["--logfile", "replica.log"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the replica (redis-server)")?;
        let replica = Replica { child };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let info = Command::new("redis-cli")
                .args(["-p", &port.to_string(), "INFO", "replication"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            if info.contains("master_link_status:up") {
                return Ok(replica);
            }
            if Instant::now() > deadline {
                bail!(
                    "the replica on {port} did not sync within 60 s; see {}/replica.log",
                    dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An OTLP/HTTP endpoint that accepts every export and counts them.
pub struct OtlpSink {
    pub url: String,
    pub requests: Arc<AtomicU64>,
}

impl OtlpSink {
    pub async fn start() -> anyhow::Result<OtlpSink> {
        let requests = Arc::new(AtomicU64::new(0));
        let count = requests.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |_body: axum::body::Bytes| {
                let count = count.clone();
                async move {
                    count.fetch_add(1, Ordering::Relaxed);
                    axum::http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the OTLP sink")?;
        let url = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(OtlpSink { url, requests })
    }

    pub fn count(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_parse_with_their_settings() {
        let v = parse_variant("gate-on=redis.wait_replicas=1;redis.wait_timeout_ms=500")
            .expect("valid");
        assert_eq!(v.name, "gate-on");
        assert_eq!(
            v.sets,
            ["redis.wait_replicas=1", "redis.wait_timeout_ms=500"]
        );
        assert!(parse_variant("base=").expect("baseline").sets.is_empty());
        assert!(parse_variant("noequals").is_err());
        assert!(parse_variant("=a.b=1").is_err());
        assert!(parse_variant("x=a.b").is_err());
    }

    #[test]
    fn every_other_round_runs_the_variants_backwards() {
        assert_eq!(order(3, 0), [0, 1, 2]);
        assert_eq!(order(3, 1), [2, 1, 0]);
        assert_eq!(order(2, 2), [0, 1]);
    }

    #[test]
    fn the_table_gives_ratios_to_the_first_variant_in_the_same_round() {
        let m = |v: &str, round, eps, p99| Measured {
            variant: v.into(),
            round,
            events_per_s: eps,
            cpu_per_1k: 0.1,
            max_rss_mib: 30.0,
            offered_rate: 1000.0,
            p50_ms: 5,
            p99_ms: p99,
            p999_ms: 50,
            visible_p99_ms: 60,
            redis_cpu_us: 15.0,
            broker_cpu_us: 10.0,
        };
        let c = Comparison {
            variants: vec![
                parse_variant("off=").expect("v"),
                parse_variant("on=redis.wait_replicas=1").expect("v"),
            ],
            events: 100,
            latency_events: 50,
            latency_rate: 1000.0,
            rows: vec![
                m("off", 0, 1000.0, 10),
                m("on", 0, 800.0, 20),
                m("on", 1, 900.0, 30),
                m("off", 1, 1200.0, 10),
            ],
            otlp_requests: None,
        };
        let md = c.markdown();
        assert!(
            md.contains("| 1 | `on` | 800 | 0.80x | 5 | 20 | 2.00x |"),
            "{md}"
        );
        assert!(
            md.contains("| 2 | `on` | 900 | 0.75x | 5 | 30 | 3.00x |"),
            "{md}"
        );
        assert!(md.contains("| 1 | `off` | 1000 | 1.00x |"), "{md}");
    }
}
