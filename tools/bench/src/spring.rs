//! Issue 14's Spring comparison: the spread backlog drained by a Spring
//! Kafka + RedisTemplate service (`tools/bench/spring`) that runs the
//! reference script (`reference.lua`) per promotion line, on the same broker
//! and Redis, in the same run as deductor.
//!
//! The service has no drain detection, so the bench reads its outcomes as
//! they arrive and stops it (SIGTERM) once every event has one. Its CPU is
//! counted between the first and the last outcome, so the JVM's start is
//! left out (deductor's figure includes its start); its peak RSS is the
//! whole process's, like deductor's.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context as _};

use crate::proc::{self, Usage};
use crate::report::Run;
use crate::workload::{self, Workload};
use crate::{backlog, blocking, read_marked, summarize, Ctx};

/// How the Spring service consumes (`bench.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A batch listener: one pipelined round trip for every line of a poll,
    /// asynchronous sends awaited together, then the commit.
    Batch,
    /// One record at a time: a script call per line, a blocking send.
    Record,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Batch => "batch",
            Mode::Record => "record",
        }
    }

    /// Its name in `--only`.
    pub fn part(self) -> &'static str {
        match self {
            Mode::Batch => "spring",
            Mode::Record => "spring-record",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Mode::Batch => "spring-batch",
            Mode::Record => "spring-record",
        }
    }
}

/// The `--only` name of a Spring run: `spring` and `spring-record` on the
/// spread workload, `spring-hot` (batch listener) on the hot one.
pub fn part(mode: Mode, w: Workload) -> &'static str {
    match w {
        Workload::Spread => mode.part(),
        Workload::Hot => "spring-hot",
    }
}

/// One run of the Spring service over a fresh backlog of `n` events of `w`.
pub async fn throughput(
    ctx: &mut Ctx,
    jar: &Path,
    mode: Mode,
    w: Workload,
    n: u64,
) -> anyhow::Result<Run> {
    let label = match w {
        Workload::Spread => mode.label(),
        Workload::Hot => "spring-batch-hot",
    };
    ctx.redis
        .reset_reference(&workload::promotions(w, ctx.opts.flash_stock))
        .await?;
    let b = backlog(ctx, label, w, n).await?;
    let (tag, input, out) = (b.tag, b.input, b.out);
    let (refunds, preload_s) = (b.refunds, b.preload_s);

    let script = ctx.opts.out.join("reference.lua");
    std::fs::write(&script, include_str!("../reference.lua"))
        .with_context(|| format!("writing {}", script.display()))?;
    let mut args: Vec<String> = vec![
        "-jar".into(),
        jar.display().to_string(),
        format!("--spring.kafka.bootstrap-servers={}", ctx.opts.brokers),
        format!("--spring.data.redis.url={}", ctx.opts.redis_url),
        format!("--spring.kafka.consumer.group-id={tag}"),
        format!("--bench.input={input}"),
        format!("--bench.output={out}"),
        format!("--bench.mode={}", mode.name()),
        format!("--bench.script={}", script.display()),
        // The spread promotions' per-customer limit (workload::promotions),
        // and the hot one's.
        "--bench.limit=5".into(),
        format!("--bench.limits={}=1", workload::FLASH),
    ];
    let threads = ctx
        .opts
        .spring_concurrency
        .unwrap_or(ctx.opts.partitions.max(1) as u32);
    args.push(format!("--bench.concurrency={threads}"));
    if mode == Mode::Record {
        // A blocking send should not wait for linger.ms (5 ms by default in
        // Kafka clients 4); the batch listener's asynchronous sends keep it.
        args.push("--spring.kafka.producer.properties.linger.ms=0".into());
    }
    eprintln!("bench: {label}: java -jar {}", jar.display());
    ctx.redis.reset_stats().await?;
    let memory0 = ctx.redis.used_memory().await?;
    let child = proc::spawn(&ctx.opts.java, &args, &ctx.log(&tag), None)?;
    let timeout = Duration::from_secs(ctx.opts.timeout_s);
    let read = read_marked(ctx, child.pid(), &out, &tag, n, timeout).await;
    child.terminate();
    let usage = blocking(move || child.wait(Duration::from_secs(60))).await;
    let (outcomes, marks) = read?;
    let usage = usage?;
    let Some((first, last)) = marks else {
        bail!(
            "run {label}: {} of {n} events had an outcome within {timeout:?}; see {}",
            outcomes.len(),
            ctx.log(&tag).display()
        );
    };
    let (calls, usec) = ctx.redis.script_stats().await?;
    let memory1 = ctx.redis.used_memory().await?;
    // The window between the first and the last outcome stands for the
    // process's life in the figures (CPU per event, the servers' shares).
    let window = Usage {
        exit_code: 0,
        wall_s: (last.at - first.at).as_secs_f64().max(0.001),
        user_s: last.service - first.service,
        sys_s: 0.0,
        max_rss_kib: usage.max_rss_kib,
    };
    let mut run = summarize(
        label,
        w,
        n,
        refunds,
        preload_s,
        window,
        &outcomes,
        calls,
        usec,
        last.redis - first.redis,
        last.kafka - first.kafka,
        &[],
    )?;
    run.redis_memory_growth_b = Some(memory1 as i64 - memory0 as i64);
    run.window = Some(last.since(&first));
    eprintln!(
        "bench: {label}: {:.0} events/s, {:.3} CPU s per 1,000 events, peak RSS {:.1} MiB",
        run.events_per_s, run.cpu_per_1k, run.max_rss_mib
    );
    Ok(run)
}
