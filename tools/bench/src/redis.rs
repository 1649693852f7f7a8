//! The bench's Redis side: a clean database with the workload's promotions,
//! the server's own per-command statistics, and the EVALSHA ceiling
//! measured with `redis-benchmark`.

use std::process::Command;

use anyhow::{bail, Context as _};
use fred::prelude::{Builder, Client, ClientLike, Config, Value};
use fred::types::{ClusterHash, CustomCommand};

use crate::workload::Promotion;

pub struct Redis {
    client: Client,
    host: String,
    port: u16,
}

fn cmd(name: &'static str) -> CustomCommand {
    CustomCommand::new_static(name, ClusterHash::FirstKey, false)
}

impl Redis {
    pub async fn connect(url: &str) -> anyhow::Result<Redis> {
        let config = Config::from_url(url).context("redis url")?;
        let (host, port) = match &config.server {
            fred::types::config::ServerConfig::Centralized { server } => {
                (server.host.to_string(), server.port)
            }
            _ => bail!("the bench needs a standalone Redis, not {url}"),
        };
        let client = Builder::from_config(config).build()?;
        client.init().await.context("connecting to Redis")?;
        Ok(Redis { client, host, port })
    }

    async fn run(&self, name: &'static str, args: Vec<String>) -> anyhow::Result<Value> {
        self.client
            .custom::<Value, String>(cmd(name), args)
            .await
            .with_context(|| format!("redis {name}"))
    }

    /// FLUSHALL, a compacted AOF, then the promotions. Automatic AOF
    /// rewrites are turned off on this (benchmark-only) Redis: a rewrite
    /// forking in the middle of a run slowed every fsync for seconds (p50
    /// latency 4.6 s in one run); the file is compacted here, between runs.
    pub async fn reset(&self, promotions: &[Promotion]) -> anyhow::Result<()> {
        self.run("FLUSHALL", vec![]).await?;
        self.run(
            "CONFIG",
            vec![
                "SET".into(),
                "auto-aof-rewrite-percentage".into(),
                "0".into(),
            ],
        )
        .await?;
        self.compact_aof().await?;
        let writes = promotions.iter().map(|p| {
            let mut args = vec![format!("promo:{{{}}}", p.id)];
            for (f, v) in p.fields() {
                args.push(f.to_owned());
                args.push(v);
            }
            self.run("HSET", args)
        });
        for r in futures::future::join_all(writes).await {
            r?;
        }
        Ok(())
    }

    /// BGREWRITEAOF and wait (bounded) until it is done.
    async fn compact_aof(&self) -> anyhow::Result<()> {
        let in_progress = |v: Value| {
            v.as_string().unwrap_or_default().lines().any(|l| {
                l.trim() == "aof_rewrite_in_progress:1" || l.trim() == "aof_rewrite_scheduled:1"
            })
        };
        // An error means AOF is off or a rewrite is already running: wait below.
        let _ = self.run("BGREWRITEAOF", vec![]).await;
        for _ in 0..600 {
            let v = self.run("INFO", vec!["persistence".to_owned()]).await?;
            if !in_progress(v) {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        bail!("Redis AOF rewrite still running after 60 s")
    }

    pub async fn script_load(&self, body: &str) -> anyhow::Result<String> {
        let v = self
            .run("SCRIPT", vec!["LOAD".to_owned(), body.to_owned()])
            .await?;
        v.as_string().context("SCRIPT LOAD reply")
    }

    /// INFO memory's `used_memory`, bytes.
    pub async fn used_memory(&self) -> anyhow::Result<u64> {
        let v = self.run("INFO", vec!["memory".to_owned()]).await?;
        let text = v.as_string().unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|n| n.trim().parse().ok())
            .context("INFO memory has no used_memory")
    }

    /// Zeroes INFO commandstats.
    pub async fn reset_stats(&self) -> anyhow::Result<()> {
        self.run("CONFIG", vec!["RESETSTAT".to_owned()]).await?;
        Ok(())
    }

    /// (calls, microseconds inside Redis) of the script commands since the
    /// last [`Redis::reset_stats`].
    pub async fn script_stats(&self) -> anyhow::Result<(u64, u64)> {
        let v = self.run("INFO", vec!["commandstats".to_owned()]).await?;
        let text = v.as_string().unwrap_or_default();
        let (mut calls, mut usec) = (0, 0);
        for line in text.lines() {
            let Some(rest) = line
                .strip_prefix("cmdstat_evalsha:")
                .or_else(|| line.strip_prefix("cmdstat_eval:"))
            else {
                continue;
            };
            for kv in rest.split(',') {
                match kv.split_once('=') {
                    Some(("calls", n)) => calls += n.trim().parse::<u64>().unwrap_or(0),
                    Some(("usec", n)) => usec += n.trim().parse::<u64>().unwrap_or(0),
                    _ => {}
                }
            }
        }
        Ok((calls, usec))
    }

    /// `redis-benchmark` running EVALSHA of deduct.lua on one promotion with
    /// ample budget and stock, a unique order, customer and event per call;
    /// returns calls per second.
    pub async fn ceiling(
        &self,
        deduct_lua: &str,
        requests: u64,
        clients: u32,
        pipeline: u32,
    ) -> anyhow::Result<Ceiling> {
        let sha = self.script_load(deduct_lua).await?;
        let p = Promotion {
            id: "bench-ceiling".to_owned(),
            budget: Some(1_000_000_000_000),
            stock: Some(1_000_000_000),
            per_customer: Some(5),
        };
        self.reset(std::slice::from_ref(&p)).await?;
        let keys_args = [
            "promo:{bench-ceiling}",
            "promo:{bench-ceiling}:used:c__rand_int__",
            "promo:{bench-ceiling}:order:o-__rand_int__",
            "promo:{bench-ceiling}:rejected:e-__rand_int__",
            "1500",
            "1",
            "1795946400",
            "e-__rand_int__",
            "2592000",
            "604800",
            "c__rand_int__",
        ];
        self.benchmark(&sha, 4, &keys_args, requests, clients, pipeline)
            .await
    }

    /// The same for issue 14's reference script (`tools/bench/reference.lua`):
    /// one promotion with ample budget and stock, a unique customer and
    /// event per call, so every call deducts.
    pub async fn reference_ceiling(
        &self,
        reference_lua: &str,
        requests: u64,
        clients: u32,
        pipeline: u32,
    ) -> anyhow::Result<Ceiling> {
        self.reset(&[]).await?;
        self.run(
            "MSET",
            vec![
                "budget:{bench-ref}".into(),
                "1000000000000".into(),
                "stock:{bench-ref}".into(),
                "1000000000".into(),
            ],
        )
        .await?;
        let sha = self.script_load(reference_lua).await?;
        let keys_args = [
            "budget:{bench-ref}",
            "stock:{bench-ref}",
            "userLimit:{bench-ref}:c__rand_int__",
            "idem:{bench-ref}:e-__rand_int__",
            "1500",
            "1",
            "5",
            "604800",
        ];
        self.benchmark(&sha, 4, &keys_args, requests, clients, pipeline)
            .await
    }

    /// A clean database with the reference script's counters of
    /// `promotions` (`budget:{P}`, `stock:{P}`; unlimited = 10^15), for the
    /// Spring comparison service, which runs that script.
    pub async fn reset_reference(&self, promotions: &[Promotion]) -> anyhow::Result<()> {
        self.reset(&[]).await?;
        const UNLIMITED: u64 = 1_000_000_000_000_000;
        let mut args = Vec::with_capacity(promotions.len() * 4);
        for p in promotions {
            args.push(format!("budget:{{{}}}", p.id));
            args.push(p.budget.unwrap_or(UNLIMITED).to_string());
            args.push(format!("stock:{{{}}}", p.id));
            args.push(p.stock.unwrap_or(UNLIMITED).to_string());
        }
        if !args.is_empty() {
            self.run("MSET", args).await?;
        }
        Ok(())
    }

    /// Runs `redis-benchmark` with EVALSHA `sha` and `keys_args` (its
    /// `__rand_int__` placeholders make each call's keys unique); returns
    /// calls per second and the time per call inside Redis.
    async fn benchmark(
        &self,
        sha: &str,
        numkeys: usize,
        keys_args: &[&str],
        requests: u64,
        clients: u32,
        pipeline: u32,
    ) -> anyhow::Result<Ceiling> {
        self.reset_stats().await?;
        let numkeys = numkeys.to_string();
        let args: Vec<String> = ["EVALSHA", sha, numkeys.as_str()]
            .iter()
            .chain(keys_args)
            .map(|s| s.to_string())
            .collect();
        let mut c = Command::new("redis-benchmark");
        c.args(["-h", &self.host, "-p", &self.port.to_string()])
            .args(["-c", &clients.to_string(), "-P", &pipeline.to_string()])
            .args(["-n", &requests.to_string(), "-r", "1000000000", "--csv"])
            .args(&args);
        let command_line = format!(
            "redis-benchmark -c {clients} -P {pipeline} -n {requests} -r 1000000000 {}",
            args.join(" ")
        );
        let out = tokio::task::spawn_blocking(move || c.output())
            .await?
            .context("running redis-benchmark (package redis-tools)")?;
        if !out.status.success() {
            bail!(
                "redis-benchmark failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let csv = String::from_utf8_lossy(&out.stdout);
        let rps = csv
            .lines()
            .filter_map(|l| l.split("\",\"").nth(1))
            .filter_map(|v| v.trim_matches('"').parse::<f64>().ok())
            .next_back()
            .with_context(|| format!("no rate in redis-benchmark output: {csv}"))?;
        let (calls, usec) = self.script_stats().await?;
        let failed = self.failed_calls().await?;
        if failed > 0 {
            bail!("{failed} EVALSHA calls of the ceiling run failed: check the arguments");
        }
        Ok(Ceiling {
            calls_per_s: rps,
            usec_per_call: if calls > 0 {
                usec as f64 / calls as f64
            } else {
                0.0
            },
            command_line,
        })
    }

    async fn failed_calls(&self) -> anyhow::Result<u64> {
        let v = self.run("INFO", vec!["commandstats".to_owned()]).await?;
        let text = v.as_string().unwrap_or_default();
        Ok(text
            .lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:"))
            .flat_map(|l| l.split(','))
            .filter_map(|kv| kv.strip_prefix("failed_calls="))
            .filter_map(|n| n.trim().parse::<u64>().ok())
            .sum())
    }

    /// Redis's process id (for CPU sampling).
    pub async fn pid(&self) -> Option<i32> {
        let v = self.run("INFO", vec!["server".to_owned()]).await.ok()?;
        v.as_string()?
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse().ok())
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub async fn quit(&self) {
        let _ = self.client.quit().await;
    }
}

#[derive(Debug, Clone)]
pub struct Ceiling {
    pub calls_per_s: f64,
    /// Time inside Redis per call (INFO commandstats).
    pub usec_per_call: f64,
    pub command_line: String,
}
