//! `deductor-bench`: the end-to-end benchmark of deductor against the real
//! broker and Redis (docs/benchmarks.md; run it with `scripts/bench`).
//!
//! In one run, on one machine:
//! 1. the Redis ceiling: `redis-benchmark` running EVALSHA of deduct.lua,
//!    then of issue 14's reference script (`reference.lua`);
//! 2. max throughput, spread and hot workloads: N events preloaded into a
//!    fresh topic, then `deductor run --until-drained` from the earliest
//!    offset; events/s, CPU per 1,000 events and peak RSS of the process;
//! 3. the same binary at in-flight depth 1, as the baseline;
//! 4. latency: events offered at half the spread maximum while deductor
//!    runs; produce timestamp of the event to broker append time of its outcome;
//! 5. the ceiling again (the machine is shared: the mean of both is used).
//!
//! With `--variant` (repeatable) it compares settings instead: spread
//! throughput and latency runs of each variant in turn, for `--rounds`
//! rounds (see `compare.rs`).

mod compare;
mod kafka;
mod proc;
mod redis;
mod report;
mod spring;
mod workload;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;
use deductor_testkit::topics;

use proc::Usage;
use report::{Latency, Report, Run};
use workload::{Generator, Workload};

#[derive(Debug, Parser)]
#[command(
    name = "deductor-bench",
    about = "End-to-end benchmark of deductor (see docs/benchmarks.md)"
)]
pub struct Opts {
    /// The deductor binary to measure.
    #[arg(long, default_value = "target/release/deductor")]
    deductor: PathBuf,
    /// Kafka bootstrap servers of the benchmark stack.
    #[arg(long, default_value = "127.0.0.1:9192")]
    brokers: String,
    /// Standalone Redis of the benchmark stack (it is FLUSHALLed!).
    #[arg(long, default_value = "redis://127.0.0.1:6390")]
    redis_url: String,
    /// Events per throughput run.
    #[arg(long, default_value_t = 200_000)]
    events: u64,
    /// Partitions of the order topic.
    #[arg(long, default_value_t = 12)]
    partitions: i32,
    /// Partitions of the outcome topic (default: --partitions). librdkafka
    /// sends one ProduceRequest per partition, so this sets how many
    /// produce requests the outcomes take.
    #[arg(long)]
    outcome_partitions: Option<i32>,
    /// Events of the depth-1 baseline run (default: --events).
    #[arg(long)]
    baseline_events: Option<u64>,
    /// Events offered in the latency run (default: --events / 2).
    #[arg(long)]
    latency_events: Option<u64>,
    /// Events of an unmeasured spread run before the measured ones (0: none).
    /// A broker JVM fresh from its start spent 2.5x its usual CPU per event
    /// in the first run (JIT warm-up): 81 against 32 µs per spread event;
    /// 20,000 events did not settle it (docs/benchmarks.md, step 0).
    #[arg(long, default_value_t = 200_000)]
    warmup_events: u64,
    /// Offered load of the latency run, events/s (default: half the spread maximum).
    #[arg(long)]
    latency_rate: Option<f64>,
    /// Stock of the hot workload's flash-sale promotion.
    #[arg(long, default_value_t = 2_000)]
    flash_stock: u64,
    /// Calls of each redis-benchmark run (default: --events).
    #[arg(long)]
    ceiling_requests: Option<u64>,
    /// Parts to run, comma separated:
    /// ceiling,spread,hot,baseline,latency,spring,spring-record,spring-hot.
    #[arg(
        long,
        default_value = "ceiling,spread,hot,baseline,latency,spring,spring-record,spring-hot",
        value_delimiter = ','
    )]
    only: Vec<String>,
    /// The Spring comparison service's jar (tools/bench/spring, built by
    /// scripts/bench); the spring parts need it.
    #[arg(long)]
    spring_jar: Option<PathBuf>,
    /// The java of the Spring service.
    #[arg(long, default_value = "java")]
    java: PathBuf,
    /// Consumer threads of the Spring services (default: one per
    /// partition, which gave the batch listener its best rate here).
    #[arg(long)]
    spring_concurrency: Option<u32>,
    /// Events of each Spring run (default: --events).
    #[arg(long)]
    spring_events: Option<u64>,
    /// Extra settings for every deductor run (SECTION.KEY=VALUE, repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    sets: Vec<String>,
    /// deductor's log filter (its log goes to <out>/<run>.log).
    #[arg(long, default_value = "warn")]
    deductor_log_level: String,
    /// The broker's process id, for its CPU share (optional).
    #[arg(long)]
    kafka_pid: Option<i32>,
    /// Where logs, results.json and results.md go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// How long one deductor run may take before it is killed, seconds.
    #[arg(long, default_value_t = 900)]
    timeout_s: u64,
    /// Compare settings instead of the parts: NAME=SECTION.KEY=VALUE[;...]
    /// (repeatable; the first is the baseline of the ratios; `NAME=` alone
    /// runs the defaults). `{otlp}` in a value is the --otlp-sink url.
    #[arg(long = "variant", value_parser = compare::parse_variant, value_name = "NAME=SETTINGS")]
    variants: Vec<compare::Variant>,
    /// Rounds of a --variant comparison.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Start a replica of the bench Redis (for redis.wait_replicas) on the
    /// port after it, for the whole run.
    #[arg(long)]
    replica: bool,
    /// Start an OTLP/HTTP sink that accepts and counts deductor's spans.
    #[arg(long)]
    otlp_sink: bool,
}

impl Opts {
    /// The outcome topic's partitions: `--outcome-partitions`, else `--partitions`.
    fn outcome_partitions(&self) -> i32 {
        self.outcome_partitions.unwrap_or(self.partitions)
    }
}

struct Ctx {
    opts: Opts,
    redis: redis::Redis,
    redis_pid: Option<i32>,
    stamp: String,
    topics: Vec<String>,
}

impl Ctx {
    fn wants(&self, part: &str) -> bool {
        self.opts.only.iter().any(|p| p == part)
    }

    /// Fresh input, outcome and dead-letter topics for one run.
    /// `input_append_time`: the input topic keeps broker append times (the
    /// latency run reads them back to split the latency).
    async fn topics(
        &mut self,
        tag: &str,
        input_append_time: bool,
    ) -> anyhow::Result<(String, String, String)> {
        let input = format!("bench-{tag}");
        let out = format!("bench-{tag}-out");
        let dlq = format!("bench-{tag}-dlq");
        let (p, po) = (self.opts.partitions, self.opts.outcome_partitions());
        let topic = |name, partitions, append_time| topics::Topic {
            name,
            partitions,
            append_time,
        };
        topics::create(
            &self.opts.brokers,
            &[
                topic(&input, p, input_append_time),
                topic(&out, po, true),
                topic(&dlq, 1, false),
            ],
            Duration::from_secs(30),
        )
        .await?;
        self.topics
            .extend([input.clone(), out.clone(), dlq.clone()]);
        Ok((input, out, dlq))
    }

    #[allow(clippy::too_many_arguments)]
    fn deductor_args(
        &self,
        input: &str,
        out: &str,
        dlq: &str,
        group: &str,
        extra: &[String],
        until_drained: bool,
        metrics_port: u16,
    ) -> Vec<String> {
        let mut a: Vec<String> = vec!["--brokers".into(), self.opts.brokers.clone()];
        a.extend(["--redis-url".into(), self.opts.redis_url.clone()]);
        a.extend([
            "--log-format".into(),
            "json".into(),
            "--log-level".into(),
            self.opts.deductor_log_level.clone(),
        ]);
        let sets = [
            format!("kafka.input_topic={input}"),
            format!("kafka.outcome_topic={out}"),
            format!("kafka.dlq_topic={dlq}"),
            format!("kafka.group_id={group}"),
            // Metrics on and scraped, as in production.
            format!("http.listen=127.0.0.1:{metrics_port}"),
        ];
        for s in sets.iter().chain(&self.opts.sets).chain(extra) {
            a.extend(["--set".into(), s.clone()]);
        }
        a.push("run".into());
        if until_drained {
            a.push("--until-drained".into());
        }
        a
    }

    fn log(&self, tag: &str) -> PathBuf {
        self.opts.out.join(format!("{tag}.log"))
    }
}

/// CPU seconds of Redis and Kafka over a run.
/// The outcomes of run `tag` (`n`, from topic `out`) read as they arrive,
/// and the CPU of the service `pid`, Redis and the broker marked at the
/// first and the last of them (None when fewer came within `timeout`).
fn read_marked(
    ctx: &Ctx,
    pid: i32,
    out: &str,
    tag: &str,
    n: u64,
    timeout: Duration,
) -> impl std::future::Future<Output = anyhow::Result<MarkedOutcomes>> + Send + 'static {
    let (redis_pid, kafka_pid) = (ctx.redis_pid, ctx.opts.kafka_pid);
    let (brokers, topic, prefix) = (ctx.opts.brokers.clone(), out.to_owned(), tag.to_owned());
    let partitions = ctx.opts.outcome_partitions();
    blocking(move || {
        let (mut first, mut last) = (None, None);
        let mark = || proc::Mark::now(pid, redis_pid, kafka_pid);
        let outcomes = kafka::read_live_with(
            &brokers,
            &topic,
            partitions,
            &prefix,
            n as usize,
            timeout,
            |seen| {
                if seen == 1 {
                    first = Some(mark());
                }
                if seen == n as usize {
                    last = Some(mark());
                }
            },
        )?;
        Ok((outcomes, first.zip(last)))
    })
}

type MarkedOutcomes = (Vec<kafka::OutcomeRec>, Option<(proc::Mark, proc::Mark)>);

struct Servers {
    redis0: f64,
    kafka0: f64,
}

impl Servers {
    fn start(ctx: &Ctx) -> Servers {
        Servers {
            redis0: proc::cpu_seconds(ctx.redis_pid),
            kafka0: proc::cpu_seconds(ctx.opts.kafka_pid),
        }
    }

    fn end(self, ctx: &Ctx) -> (f64, f64) {
        (
            proc::cpu_seconds(ctx.redis_pid) - self.redis0,
            proc::cpu_seconds(ctx.opts.kafka_pid) - self.kafka0,
        )
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f).await?
}

/// Fresh topics of one run and `n` events of `w` preloaded into its input.
struct Backlog {
    tag: String,
    input: String,
    out: String,
    dlq: String,
    refunds: u64,
    preload_s: f64,
}

async fn backlog(ctx: &mut Ctx, label: &str, w: Workload, n: u64) -> anyhow::Result<Backlog> {
    let tag = format!("{}-{label}", ctx.stamp);
    eprintln!("bench: {label}: preloading {n} {} events", w.name());
    let (input, out, dlq) = ctx.topics(&tag, false).await?;
    let (brokers, topic, prefix) = (ctx.opts.brokers.clone(), input.clone(), tag.clone());
    let t = Instant::now();
    let refunds = blocking(move || {
        let mut g = Generator::new(w, &prefix, 42);
        kafka::preload(&brokers, &topic, &mut g, n)
    })
    .await?;
    Ok(Backlog {
        tag,
        input,
        out,
        dlq,
        refunds,
        preload_s: t.elapsed().as_secs_f64(),
    })
}

/// One maximum-throughput run: preload `n` events, then drain them.
async fn throughput(
    ctx: &mut Ctx,
    label: &str,
    w: Workload,
    n: u64,
    extra: &[String],
) -> anyhow::Result<Run> {
    ctx.redis
        .reset(&workload::promotions(w, ctx.opts.flash_stock))
        .await?;
    let b = backlog(ctx, label, w, n).await?;
    let (tag, input, out, dlq) = (b.tag, b.input, b.out, b.dlq);
    let (refunds, preload_s) = (b.refunds, b.preload_s);

    eprintln!("bench: {label}: deductor run --until-drained");
    ctx.redis.reset_stats().await?;
    let memory0 = ctx.redis.used_memory().await?;
    let servers = Servers::start(ctx);
    let port = proc::free_port()?;
    let args = ctx.deductor_args(&input, &out, &dlq, &tag, extra, true, port);
    let child = proc::spawn(&ctx.opts.deductor, &args, &ctx.log(&tag), Some(port))?;
    let last_metrics = child.last_metrics();
    let timeout = Duration::from_secs(ctx.opts.timeout_s);
    // A live reader marks the CPU of the service, Redis and the broker at
    // the first and the last outcome, as for the Spring service
    // (spring.rs): issue 27's table compares both over that window, each
    // with the same reader at work beside it. (The figures over the
    // process's life, start and drain detection included, stay below.)
    let marks = tokio::spawn(read_marked(ctx, child.pid(), &out, &tag, n, timeout));
    let usage = blocking(move || child.wait(timeout)).await?;
    let metrics_text = last_metrics
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let stages_ms = proc::stage_means("", &metrics_text);
    // The last scrape, beside the log, for the histograms the table leaves out.
    let _ = std::fs::write(ctx.log(&tag).with_extension("metrics"), &metrics_text);
    let (redis_cpu, kafka_cpu) = servers.end(ctx);
    if usage.exit_code != 0 {
        bail!(
            "deductor exited {} in run {label}; see {}",
            usage.exit_code,
            ctx.log(&tag).display()
        );
    }
    let (calls, usec) = ctx.redis.script_stats().await?;
    let memory1 = ctx.redis.used_memory().await?;
    let (brokers, topic) = (ctx.opts.brokers.clone(), out.clone());
    let outcomes = blocking(move || kafka::read_all(&brokers, &topic)).await?;
    let mut run = summarize(
        label, w, n, refunds, preload_s, usage, &outcomes, calls, usec, redis_cpu, kafka_cpu, extra,
    )?;
    run.stages_ms = stages_ms;
    run.batch_calls_lines = proc::histogram_totals(&metrics_text, "deductor_batch_lines")
        .map(|(sum, count)| (count, sum));
    run.redis_memory_growth_b = Some(memory1 as i64 - memory0 as i64);
    // Every outcome is in the topic by now (the service drained and
    // exited), so the reader is done or about to be.
    match marks.await? {
        Ok((_, Some((first, last)))) => run.window = Some(last.since(&first)),
        Ok((_, None)) => eprintln!("bench: {label}: the live reader missed outcomes; no window"),
        Err(e) => eprintln!("bench: {label}: the live reader failed ({e:#}); no window"),
    }
    eprintln!(
        "bench: {label}: {:.0} events/s, {:.3} CPU s per 1,000 events, peak RSS {:.1} MiB",
        run.events_per_s, run.cpu_per_1k, run.max_rss_mib
    );
    Ok(run)
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    label: &str,
    w: Workload,
    n: u64,
    refunds: u64,
    preload_s: f64,
    usage: Usage,
    outcomes: &[kafka::OutcomeRec],
    calls: u64,
    usec: u64,
    redis_cpu: f64,
    kafka_cpu: f64,
    extra: &[String],
) -> anyhow::Result<Run> {
    let mut first: HashMap<&str, &kafka::OutcomeRec> = HashMap::with_capacity(outcomes.len());
    for o in outcomes {
        first.entry(o.event_id.as_str()).or_insert(o);
    }
    if (first.len() as u64) < n {
        bail!("run {label}: {} of {n} events have an outcome", first.len());
    }
    let lo = outcomes.iter().map(|o| o.ts_ms).min().unwrap_or(0);
    let hi = outcomes.iter().map(|o| o.ts_ms).max().unwrap_or(0);
    let span_s = ((hi - lo) as f64 / 1000.0).max(0.001);
    let mut tally: BTreeMap<String, u64> = BTreeMap::new();
    for o in first.values() {
        let k = match &o.reason {
            Some(r) => format!("{} {r}", o.kind),
            None => o.kind.clone(),
        };
        *tally.entry(k).or_default() += 1;
    }
    Ok(Run {
        label: label.to_owned(),
        workload: w.name().to_owned(),
        settings: extra.to_vec(),
        events: n,
        refunds,
        preload_s,
        outcomes: outcomes.len() as u64,
        duplicates: outcomes.iter().filter(|o| o.duplicate).count() as u64,
        span_s,
        events_per_s: n as f64 / span_s,
        wall_s: usage.wall_s,
        events_per_s_wall: n as f64 / usage.wall_s,
        cpu_s: usage.cpu_s(),
        cpu_per_1k: usage.cpu_s() / n as f64 * 1000.0,
        max_rss_mib: usage.max_rss_kib as f64 / 1024.0,
        script_calls: calls,
        script_calls_per_event: calls as f64 / n as f64,
        redis_usec_per_event: usec as f64 / n as f64,
        redis_busy: usec as f64 / 1e6 / span_s,
        redis_cpu_share: redis_cpu / usage.wall_s,
        kafka_cpu_share: kafka_cpu / usage.wall_s,
        tally,
        stages_ms: BTreeMap::new(),
        redis_memory_growth_b: None,
        batch_calls_lines: None,
        window: None,
    })
}

/// Offers `n` spread events at `rate` per second to a running deductor
/// (`label` names its topics and log; `extra`: settings of this run).
async fn latency(
    ctx: &mut Ctx,
    label: &str,
    rate: f64,
    n: u64,
    extra: &[String],
) -> anyhow::Result<Latency> {
    let tag = format!("{}-{label}", ctx.stamp);
    let (input, out, dlq) = ctx.topics(&tag, true).await?;
    ctx.redis
        .reset(&workload::promotions(
            Workload::Spread,
            ctx.opts.flash_stock,
        ))
        .await?;
    let port = proc::free_port()?;
    let args = ctx.deductor_args(&input, &out, &dlq, &tag, extra, false, port);
    let servers = Servers::start(ctx);
    let child = proc::spawn(&ctx.opts.deductor, &args, &ctx.log(&tag), Some(port))?;

    // Warm-up: the group is joined and the scripts are cached before the
    // measured events start.
    eprintln!("bench: latency: warming up");
    let (brokers, parts) = (ctx.opts.brokers.clone(), ctx.opts.outcome_partitions());
    let warm = format!("{tag}w");
    {
        let (b, i, o, w) = (brokers.clone(), input.clone(), out.clone(), warm.clone());
        blocking(move || {
            let mut g = Generator::new(Workload::Spread, &w, 7);
            kafka::preload(&b, &i, &mut g, 500)?;
            let got = kafka::read_live(&b, &o, parts, &w, 500, Duration::from_secs(120))?;
            if got.len() < 500 {
                bail!("warm-up: {} of 500 outcomes within 120 s", got.len());
            }
            Ok(())
        })
        .await?;
    }

    let before = proc::metrics_text(port).unwrap_or_default();
    eprintln!("bench: latency: offering {n} events at {rate:.0}/s");
    let measured = format!("{tag}m");
    let timeout = Duration::from_secs_f64(n as f64 / rate + 120.0);
    let reader = {
        let (b, o, m) = (brokers.clone(), out.clone(), measured.clone());
        tokio::task::spawn_blocking(move || {
            kafka::read_live(&b, &o, parts, &m, n as usize, timeout)
        })
    };
    let stamps = {
        let (b, i, m) = (brokers.clone(), input.clone(), measured.clone());
        blocking(move || {
            let mut g = Generator::new(Workload::Spread, &m, 11);
            kafka::paced(&b, &i, &mut g, n, rate)
        })
        .await?
    };
    let outcomes = reader.await??;
    // Commits of the last events come up to one interval after their
    // outcomes: wait for them before the scrape.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stages_ms = proc::stage_means(&before, &proc::metrics_text(port).unwrap_or_default());
    child.terminate();
    let usage = blocking(move || child.wait(Duration::from_secs(60))).await?;
    let (redis_cpu, kafka_cpu) = servers.end(ctx);
    let appended: HashMap<String, i64> = {
        let (b, i) = (brokers.clone(), input.clone());
        blocking(move || kafka::read_all(&b, &i))
            .await?
            .into_iter()
            .map(|e| (e.event_id, e.ts_ms))
            .collect()
    };

    let prefix = format!("{measured}-e");
    // Per event: (outcome append time, deductor's processed_at) of its
    // earliest outcome, and when the reader first saw one.
    let mut best: HashMap<usize, (i64, Option<i64>)> = HashMap::with_capacity(outcomes.len());
    let mut seen: HashMap<usize, i64> = HashMap::with_capacity(outcomes.len());
    for o in &outcomes {
        if let Some(i) = o
            .event_id
            .strip_prefix(&prefix)
            .and_then(|s| s.parse::<usize>().ok())
        {
            let e = best.entry(i).or_insert((o.ts_ms, o.processed_ms));
            if o.ts_ms < e.0 {
                *e = (o.ts_ms, o.processed_ms);
            }
            let s = seen.entry(i).or_insert(o.seen_ms);
            *s = (*s).min(o.seen_ms);
        }
    }
    if (best.len() as u64) < n {
        bail!("latency run: {} of {n} events have an outcome", best.len());
    }
    let mut lat: Vec<i64> = best.iter().map(|(i, (ts, _))| ts - stamps[*i]).collect();
    // Produced -> in the hands of a read_committed reader (with
    // exactly_once: after the transaction committed).
    let mut visible: Vec<i64> = seen.iter().map(|(i, s)| s - stamps[*i]).collect();
    // Split at processed_at: consume + Redis before it, produce + ack after.
    // Split at the event's broker append time and at deductor's processed_at:
    // load generator -> broker; broker -> outcome built (fetch, Redis);
    // outcome built -> appended (produce, ack).
    let mut intake: Vec<i64> = Vec::with_capacity(best.len());
    let mut before: Vec<i64> = Vec::with_capacity(best.len());
    for (i, (_, p)) in &best {
        let Some(a) = appended.get(&Generator::event_id(&measured, *i as u64)) else {
            continue;
        };
        intake.push(a - stamps[*i]);
        if let Some(p) = p {
            before.push(p - a);
        }
    }
    let mut after: Vec<i64> = best
        .values()
        .filter_map(|(ts, p)| p.map(|p| ts - p))
        .collect();
    for v in [&mut lat, &mut visible, &mut intake, &mut before, &mut after] {
        v.sort_unstable();
    }
    let pct = |v: &[i64], p: f64| {
        if v.is_empty() {
            return 0;
        }
        v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
    };
    let offered_s = (stamps.last().copied().unwrap_or(0) - stamps.first().copied().unwrap_or(0))
        as f64
        / 1000.0;
    let l = Latency {
        target_rate: rate,
        offered_rate: n as f64 / offered_s.max(0.001),
        events: n,
        p50_ms: pct(&lat, 0.50),
        p99_ms: pct(&lat, 0.99),
        p999_ms: pct(&lat, 0.999),
        to_broker_ms: [pct(&intake, 0.50), pct(&intake, 0.99)],
        to_processed_ms: [pct(&before, 0.50), pct(&before, 0.99)],
        to_append_ms: [pct(&after, 0.50), pct(&after, 0.99)],
        visible_ms: [pct(&visible, 0.50), pct(&visible, 0.99)],
        stages_ms,
        max_ms: *lat.last().unwrap_or(&0),
        cpu_per_1k: usage.cpu_s() / (n + 500) as f64 * 1000.0,
        max_rss_mib: usage.max_rss_kib as f64 / 1024.0,
        exit_code: usage.exit_code,
        redis_cpu_share: redis_cpu / usage.wall_s,
        kafka_cpu_share: kafka_cpu / usage.wall_s,
    };
    eprintln!(
        "bench: latency at {:.0}/s: p50 {} ms, p99 {} ms, p99.9 {} ms; mean ms per stage {:?}",
        l.offered_rate, l.p50_ms, l.p99_ms, l.p999_ms, l.stages_ms
    );
    Ok(l)
}

async fn ceiling(ctx: &Ctx) -> anyhow::Result<redis::Ceiling> {
    let n = ctx.opts.ceiling_requests.unwrap_or(ctx.opts.events);
    eprintln!("bench: redis ceiling: redis-benchmark EVALSHA deduct.lua, {n} calls");
    let c = ctx
        .redis
        .ceiling(deductor::ledger::scripts::DEDUCT.body, n, 50, 16)
        .await?;
    eprintln!(
        "bench: redis ceiling: {:.0} calls/s ({:.1} us per call inside Redis)",
        c.calls_per_s, c.usec_per_call
    );
    Ok(c)
}

/// Issue 14's reference: the original design article's four-key script,
/// on the same Redis, the same way.
async fn reference_ceiling(ctx: &Ctx) -> anyhow::Result<redis::Ceiling> {
    let n = ctx.opts.ceiling_requests.unwrap_or(ctx.opts.events);
    eprintln!("bench: reference ceiling: redis-benchmark EVALSHA reference.lua, {n} calls");
    let c = ctx
        .redis
        .reference_ceiling(include_str!("../reference.lua"), n, 50, 16)
        .await?;
    eprintln!(
        "bench: reference ceiling: {:.0} calls/s ({:.1} us per call inside Redis)",
        c.calls_per_s, c.usec_per_call
    );
    Ok(c)
}

async fn bench(opts: Opts) -> anyhow::Result<Report> {
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;
    if !opts.deductor.is_file() {
        bail!(
            "no deductor binary at {} (cargo build --release --bin deductor)",
            opts.deductor.display()
        );
    }
    let redis = redis::Redis::connect(&opts.redis_url).await?;
    let redis_pid = redis.pid().await;
    let stamp = format!("b{}", kafka::unix_ms() / 1000 % 1_000_000);
    let mut report = Report::start(&opts.deductor, opts.events, opts.partitions);
    let mut ctx = Ctx {
        opts,
        redis,
        redis_pid,
        stamp,
        topics: Vec::new(),
    };
    let result = match warm_up(&mut ctx).await {
        Err(e) => Err(e),
        Ok(()) if ctx.opts.variants.is_empty() => run_parts(&mut ctx, &mut report).await,
        Ok(()) => compare(&mut ctx, &mut report).await,
    };
    kafka::delete_topics(&ctx.opts.brokers, &ctx.topics).await;
    ctx.redis.quit().await;
    result?;
    report.finish();
    Ok(report)
}

/// The --variant comparison (see compare.rs).
async fn compare(ctx: &mut Ctx, report: &mut Report) -> anyhow::Result<()> {
    let _replica = if ctx.opts.replica {
        let port = ctx.redis.port() + 1;
        let dir = ctx.opts.out.join("replica");
        eprintln!("bench: starting a replica of the bench Redis on {port}");
        Some(compare::Replica::start(ctx.redis.host(), ctx.redis.port(), port, &dir).await?)
    } else {
        None
    };
    let sink = if ctx.opts.otlp_sink {
        let s = compare::OtlpSink::start().await?;
        eprintln!("bench: OTLP sink on {}", s.url);
        Some(s)
    } else {
        None
    };
    let variants: Vec<compare::Variant> = ctx
        .opts
        .variants
        .iter()
        .map(|v| compare::Variant {
            name: v.name.clone(),
            sets: v
                .sets
                .iter()
                .map(|x| x.replace("{otlp}", sink.as_ref().map_or("", |s| s.url.as_str())))
                .collect(),
        })
        .collect();
    let n = ctx.opts.events;
    let nl = ctx.opts.latency_events.unwrap_or(n / 2);
    let mut c = compare::Comparison {
        variants: variants.clone(),
        events: n,
        latency_events: nl,
        latency_rate: ctx.opts.latency_rate.unwrap_or(0.0),
        ..Default::default()
    };
    for round in 0..ctx.opts.rounds {
        for i in compare::order(variants.len(), round) {
            let v = &variants[i];
            let label = format!("{}-r{}", v.name, round + 1);
            let run = throughput(ctx, &label, Workload::Spread, n, &v.sets).await?;
            if c.latency_rate <= 0.0 {
                // Half the first spread maximum, as in the parts' latency run.
                c.latency_rate = run.events_per_s / 2.0;
            }
            let l = latency(ctx, &format!("{label}-lat"), c.latency_rate, nl, &v.sets).await?;
            c.rows.push(compare::Measured {
                variant: v.name.clone(),
                round,
                events_per_s: run.events_per_s,
                cpu_per_1k: run.cpu_per_1k,
                max_rss_mib: run.max_rss_mib.max(l.max_rss_mib),
                offered_rate: l.offered_rate,
                p50_ms: l.p50_ms,
                p99_ms: l.p99_ms,
                p999_ms: l.p999_ms,
                visible_p99_ms: l.visible_ms[1],
                redis_cpu_us: run.cpu_us_per_event()[1],
                broker_cpu_us: run.cpu_us_per_event()[2],
            });
        }
    }
    c.otlp_requests = sink.as_ref().map(compare::OtlpSink::count);
    report.comparison = Some(c);
    Ok(())
}

/// An unmeasured spread run of `--warmup-events`, so that no measured run
/// is the first a freshly started broker (or Redis) serves.
async fn warm_up(ctx: &mut Ctx) -> anyhow::Result<()> {
    let n = ctx.opts.warmup_events;
    if n == 0 {
        return Ok(());
    }
    eprintln!("bench: warm-up: {n} spread events, not measured");
    let run = throughput(ctx, "warmup", Workload::Spread, n, &[]).await?;
    let [_, redis, broker] = run.cpu_us_per_event();
    eprintln!(
        "bench: warm-up: {:.0} events/s, Redis / broker CPU {redis:.0} / {broker:.0} µs per event (not reported)",
        run.events_per_s
    );
    Ok(())
}

async fn run_parts(ctx: &mut Ctx, report: &mut Report) -> anyhow::Result<()> {
    if ctx.wants("ceiling") {
        report.ceilings.push(ceiling(ctx).await?);
        report.references.push(reference_ceiling(ctx).await?);
    }
    let n = ctx.opts.events;
    if ctx.wants("spread") {
        report.spread = Some(throughput(ctx, "spread", Workload::Spread, n, &[]).await?);
    }
    if ctx.wants("hot") {
        report.hot = Some(throughput(ctx, "hot", Workload::Hot, n, &[]).await?);
    }
    if ctx.wants("baseline") {
        let nb = ctx.opts.baseline_events.unwrap_or(n);
        let depth1 = ["pipeline.max_in_flight_per_partition=1".to_owned()];
        report.baseline = Some(throughput(ctx, "depth1", Workload::Spread, nb, &depth1).await?);
    }
    if ctx.wants("latency") {
        let rate = match (ctx.opts.latency_rate, &report.spread) {
            (Some(r), _) => r,
            (None, Some(s)) => s.events_per_s / 2.0,
            (None, None) => bail!("the latency run needs --latency-rate or the spread run"),
        };
        let nl = ctx.opts.latency_events.unwrap_or(n / 2);
        report.latency = Some(latency(ctx, "latency", rate, nl, &[]).await?);
    }
    for (mode, w) in [
        (spring::Mode::Batch, Workload::Spread),
        (spring::Mode::Record, Workload::Spread),
        (spring::Mode::Batch, Workload::Hot),
    ] {
        let part = spring::part(mode, w);
        if !ctx.wants(part) {
            continue;
        }
        let Some(jar) = ctx.opts.spring_jar.clone() else {
            bail!("the {part} part needs --spring-jar (scripts/bench builds it), or leave it out of --only");
        };
        let ns = ctx.opts.spring_events.unwrap_or(n);
        let run = spring::throughput(ctx, &jar, mode, w, ns).await?;
        match (mode, w) {
            (spring::Mode::Batch, Workload::Spread) => report.spring_batch = Some(run),
            (spring::Mode::Record, _) => report.spring_record = Some(run),
            (spring::Mode::Batch, Workload::Hot) => report.spring_hot = Some(run),
        }
    }
    if ctx.wants("ceiling") {
        report.references.push(reference_ceiling(ctx).await?);
        report.ceilings.push(ceiling(ctx).await?);
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let opts = Opts::parse();
    let out = opts.out.clone();
    let report = bench(opts).await?;
    let md = report.markdown();
    std::fs::write(out.join("results.md"), &md)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    println!("{md}");
    Ok(())
}
