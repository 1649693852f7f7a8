//! The figures of one benchmark run, as JSON and as the markdown table of
//! docs/benchmarks.md: every figure beside its ceiling or baseline and the
//! target of issue 6.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::proc;
use crate::redis::Ceiling;

/// Targets of issue 6.
const SPREAD_TARGET: f64 = 0.60;
const HOT_TARGET: f64 = 0.50;
const BASELINE_TARGET: f64 = 10.0;
const P99_TARGET_MS: i64 = 20;
const RSS_TARGET_MIB: f64 = 64.0;

#[derive(Debug, Serialize)]
pub struct Run {
    pub label: String,
    pub workload: String,
    pub settings: Vec<String>,
    pub events: u64,
    pub refunds: u64,
    pub preload_s: f64,
    /// Outcome records read (repeats included).
    pub outcomes: u64,
    pub duplicates: u64,
    /// First to last outcome (broker append times).
    pub span_s: f64,
    pub events_per_s: f64,
    /// Process start to exit (startup, group join, drain detection included).
    pub wall_s: f64,
    pub events_per_s_wall: f64,
    pub cpu_s: f64,
    pub cpu_per_1k: f64,
    pub max_rss_mib: f64,
    pub script_calls: u64,
    pub script_calls_per_event: f64,
    /// Time inside Redis scripts per event (INFO commandstats), µs.
    pub redis_usec_per_event: f64,
    /// Share of the span Redis spent inside scripts.
    pub redis_busy: f64,
    /// CPU of the Redis and Kafka processes over the run, in cores.
    pub redis_cpu_share: f64,
    pub kafka_cpu_share: f64,
    pub tally: BTreeMap<String, u64>,
    /// Mean ms per stage of `deductor_event_stage_seconds`, from the last
    /// scrape (every 2 s) before the process exited.
    pub stages_ms: BTreeMap<String, f64>,
    /// Growth of Redis's `used_memory` over the run, bytes.
    pub redis_memory_growth_b: Option<i64>,
    /// `deduct_batch.lua` calls and the placement lines they carried
    /// (`deductor_batch_lines`, last scrape); None without batches.
    pub batch_calls_lines: Option<(f64, f64)>,
    /// CPU seconds of the service, Redis and the broker between the first
    /// and the last outcome, as a live reader saw them arrive: the window
    /// both services' CPU per event is compared over (issue 27's table).
    pub window: Option<Window>,
}

/// CPU over the window from the first to the last outcome.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Window {
    pub wall_s: f64,
    pub service_s: f64,
    pub redis_s: f64,
    pub kafka_s: f64,
}

impl Run {
    /// Redis memory per accepted order: `used_memory`'s growth over the
    /// run divided by the DeductAccepted outcomes.
    pub fn redis_b_per_accepted(&self) -> Option<f64> {
        let accepted = *self.tally.get("DeductAccepted")?;
        let growth = self.redis_memory_growth_b?;
        (accepted > 0).then(|| growth as f64 / accepted as f64)
    }

    /// CPU µs per event of the service, Redis and the broker: over the
    /// first-to-last-outcome window where the run has one, else over the
    /// process's life.
    pub fn cpu_us_per_event(&self) -> [f64; 3] {
        let per = |cpu_s: f64| cpu_s / self.events as f64 * 1e6;
        if let Some(w) = &self.window {
            return [per(w.service_s), per(w.redis_s), per(w.kafka_s)];
        }
        [
            per(self.cpu_s),
            per(self.redis_cpu_share * self.wall_s),
            per(self.kafka_cpu_share * self.wall_s),
        ]
    }
}

#[derive(Debug, Serialize)]
pub struct Latency {
    pub target_rate: f64,
    pub offered_rate: f64,
    pub events: u64,
    pub p50_ms: i64,
    pub p99_ms: i64,
    pub p999_ms: i64,
    pub max_ms: i64,
    /// p50, p99 of: produce timestamp -> the event's broker append time
    /// (load generator, broker); -> deductor's processed_at (fetch, parse,
    /// Redis); -> the outcome's append time (produce, ack).
    pub to_broker_ms: [i64; 2],
    pub to_processed_ms: [i64; 2],
    pub to_append_ms: [i64; 2],
    /// p50, p99 of: produce timestamp -> the bench's read_committed reader
    /// got the outcome (exactly_once: after its transaction committed).
    pub visible_ms: [i64; 2],
    /// Mean ms per stage of `deductor_event_stage_seconds` over the
    /// measured events (fetched, admitted, redis, publish, commit).
    pub stages_ms: BTreeMap<String, f64>,
    pub cpu_per_1k: f64,
    pub max_rss_mib: f64,
    pub exit_code: i32,
    pub redis_cpu_share: f64,
    pub kafka_cpu_share: f64,
}

#[derive(Debug, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub load_before: String,
    pub load_after: String,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub date: String,
    pub commit: String,
    pub deductor: String,
    pub events: u64,
    pub partitions: i32,
    pub machine: Machine,
    #[serde(serialize_with = "ceilings")]
    pub ceilings: Vec<Ceiling>,
    /// Issue 14's reference script, measured beside each ceiling run.
    #[serde(serialize_with = "ceilings")]
    pub references: Vec<Ceiling>,
    pub spread: Option<Run>,
    pub hot: Option<Run>,
    pub baseline: Option<Run>,
    pub latency: Option<Latency>,
    /// Issue 14's Spring comparison service on the spread backlog: the
    /// batch-tuned listener and the one-record-at-a-time one.
    pub spring_batch: Option<Run>,
    pub spring_record: Option<Run>,
    /// The batch-tuned Spring service on the hot backlog (issue 27's table).
    pub spring_hot: Option<Run>,
    /// A --variant comparison (then the parts above are not run).
    pub comparison: Option<crate::compare::Comparison>,
}

fn mean(c: &[Ceiling]) -> Option<f64> {
    if c.is_empty() {
        return None;
    }
    Some(c.iter().map(|c| c.calls_per_s).sum::<f64>() / c.len() as f64)
}

/// Issue 14's goals against the reference script's ceiling.
const REFERENCE_SPREAD_TARGET: f64 = 1.0;
const REFERENCE_HOT_TARGET: f64 = 1.5;
/// Issue 14's goals against the batch-tuned Spring service: at least 3x its
/// throughput at no more than 1/8 of its peak RSS.
const SPRING_THROUGHPUT_TARGET: f64 = 3.0;
const SPRING_RSS_TARGET: f64 = 1.0 / 8.0;

fn ceilings<S: serde::Serializer>(c: &[Ceiling], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(c.len()))?;
    for x in c {
        seq.serialize_element(&serde_json::json!({
            "calls_per_s": x.calls_per_s,
            "usec_per_call": x.usec_per_call,
            "command": x.command_line,
        }))?;
    }
    seq.end()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn git(args: &[&str]) -> String {
    std::process::Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

impl Report {
    pub fn start(deductor: &Path, events: u64, partitions: i32) -> Report {
        let cpuinfo = read("/proc/cpuinfo");
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
            .unwrap_or_default();
        let mem_kib: f64 = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let mut commit = git(&["rev-parse", "--short", "HEAD"]);
        if !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty() {
            commit.push_str(" + uncommitted changes");
        }
        Report {
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            commit,
            deductor: deductor.display().to_string(),
            events,
            partitions,
            machine: Machine {
                cpu,
                cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
                memory_gib: mem_kib / 1024.0 / 1024.0,
                kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
                load_before: proc::load_average(),
                load_after: String::new(),
            },
            ceilings: Vec::new(),
            references: Vec::new(),
            spread: None,
            hot: None,
            baseline: None,
            latency: None,
            spring_batch: None,
            spring_record: None,
            spring_hot: None,
            comparison: None,
        }
    }

    pub fn finish(&mut self) {
        self.machine.load_after = proc::load_average();
    }

    /// The ceiling: the mean of the runs before and after.
    pub fn ceiling(&self) -> Option<f64> {
        mean(&self.ceilings)
    }

    /// The reference script's ceiling: the mean of the runs before and after.
    pub fn reference(&self) -> Option<f64> {
        mean(&self.references)
    }

    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let m = &self.machine;
        if let Some(c) = &self.comparison {
            let _ = writeln!(
                s,
                "Run of {} on {}, {} cores, {:.0} GiB, Linux {}. deductor at commit {}. Load average (1/5/15 min) before: {}; after: {}.\n",
                self.date, m.cpu, m.cores, m.memory_gib, m.kernel, self.commit, m.load_before, m.load_after
            );
            s.push_str(&c.markdown());
            return s;
        }
        let _ = writeln!(
            s,
            "Run of {} on {}, {} cores, {:.0} GiB, Linux {} (broker, Redis, deductor and the load generator on the same machine). \
             deductor at commit {}. Load average (1/5/15 min) before: {}; after: {}.\n",
            self.date, m.cpu, m.cores, m.memory_gib, m.kernel, self.commit, m.load_before, m.load_after
        );
        self.issue27_table(&mut s);
        let _ = writeln!(
            s,
            "| figure | measured | ceiling / baseline | ratio | target | met |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|");
        let ceiling = self.ceiling();
        if let Some(c) = ceiling {
            let each: Vec<String> = self
                .ceilings
                .iter()
                .map(|c| format!("{:.0}", c.calls_per_s))
                .collect();
            let usec: Vec<String> = self
                .ceilings
                .iter()
                .map(|c| format!("{:.1}", c.usec_per_call))
                .collect();
            let _ = writeln!(
                s,
                "| Redis ceiling: EVALSHA deduct.lua, redis-benchmark -c 50 -P 16 | {c:.0} calls/s (runs: {}; {} µs per call inside Redis) | | | | |",
                each.join(", "),
                usec.join(", ")
            );
        }
        let reference = self.reference();
        if let Some(r) = reference {
            let each: Vec<String> = self
                .references
                .iter()
                .map(|c| format!("{:.0} ({:.1} µs)", c.calls_per_s, c.usec_per_call))
                .collect();
            let _ = writeln!(
                s,
                "| Reference ceiling (issue 14): EVALSHA tools/bench/reference.lua, the article's four-key script, redis-benchmark -c 50 -P 16 | {r:.0} calls/s (runs: {}) | | | | |",
                each.join(", ")
            );
            if let Some(c) = ceiling {
                let _ = writeln!(
                    s,
                    "| deduct.lua's ceiling over the reference's | {c:.0} calls/s | {r:.0} calls/s | {:.2}x | | |",
                    c / r
                );
            }
        }
        let ratio = |x: f64, base: Option<f64>| base.map(|b| x / b);
        let fmt_ratio = |r: Option<f64>, pct: bool| match r {
            Some(r) if pct => format!("{:.0}%", r * 100.0),
            Some(r) => format!("{r:.1}x"),
            None => "n/a".into(),
        };
        let met = |ok: Option<bool>| match ok {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "n/a",
        };
        for (run, target) in [(&self.spread, SPREAD_TARGET), (&self.hot, HOT_TARGET)] {
            let Some(r) = run else { continue };
            let q = ratio(r.events_per_s, ceiling);
            let _ = writeln!(
                s,
                "| {} throughput, {} events (first to last outcome) | {:.0} events/s | {} calls/s | {} | >= {:.0}% | {} |",
                r.workload,
                r.events,
                r.events_per_s,
                ceiling.map_or("n/a".into(), |c| format!("{c:.0}")),
                fmt_ratio(q, true),
                target * 100.0,
                met(q.map(|q| q >= target)),
            );
        }
        for (run, target) in [
            (&self.spread, REFERENCE_SPREAD_TARGET),
            (&self.hot, REFERENCE_HOT_TARGET),
        ] {
            let (Some(r), Some(reference)) = (run, reference) else {
                continue;
            };
            let q = r.events_per_s / reference;
            let _ = writeln!(
                s,
                "| {} throughput over the reference ceiling (issue 14) | {:.0} events/s | {reference:.0} calls/s | {q:.2}x | >= {target:.1}x | {} |",
                r.workload,
                r.events_per_s,
                met(Some(q >= target)),
            );
        }
        if let Some(b) = &self.baseline {
            let _ = writeln!(
                s,
                "| depth-1 baseline (spread, max_in_flight_per_partition=1), {} events | {:.0} events/s | {} | {} | | |",
                b.events,
                b.events_per_s,
                ceiling.map_or("n/a".into(), |c| format!("{c:.0} calls/s")),
                fmt_ratio(ratio(b.events_per_s, ceiling), true),
            );
            if let Some(r) = &self.spread {
                let q = r.events_per_s / b.events_per_s;
                let _ = writeln!(
                    s,
                    "| spread throughput over the depth-1 baseline | {:.0} events/s | {:.0} events/s | {} | >= {BASELINE_TARGET:.0}x | {} |",
                    r.events_per_s,
                    b.events_per_s,
                    fmt_ratio(Some(q), false),
                    met(Some(q >= BASELINE_TARGET)),
                );
            }
        }
        if let Some(l) = &self.latency {
            let max = self.spread.as_ref().map(|r| r.events_per_s);
            let _ = writeln!(
                s,
                "| event-to-outcome latency p50 / p99 / p99.9 (max) at {:.0} events/s offered, {} events | {} / {} / {} ({}) ms | {} | {} | p99 <= {P99_TARGET_MS} ms | {} |",
                l.offered_rate,
                l.events,
                l.p50_ms,
                l.p99_ms,
                l.p999_ms,
                l.max_ms,
                max.map_or("n/a".into(), |m| format!("max {m:.0} events/s")),
                fmt_ratio(ratio(l.offered_rate, max), true),
                met(Some(l.p99_ms <= P99_TARGET_MS)),
            );
            let _ = writeln!(
                s,
                "| latency split, p50 / p99: event produced -> in the broker (load generator); -> outcome built (deductor: fetch, parse, Redis); -> outcome in the broker (deductor: produce, ack); event produced -> outcome read by a read_committed reader | {} / {} ms; {} / {} ms; {} / {} ms; {} / {} ms | | | | |",
                l.to_broker_ms[0], l.to_broker_ms[1],
                l.to_processed_ms[0], l.to_processed_ms[1], l.to_append_ms[0], l.to_append_ms[1],
                l.visible_ms[0], l.visible_ms[1],
            );
            if !l.stages_ms.is_empty() {
                let _ = writeln!(
                    s,
                    "| where an event's time goes inside deductor, mean ms per stage (`deductor_event_stage_seconds`): record timestamp -> lane (fetched); -> started (admitted); Redis; outcome sent -> acknowledged (publish); acknowledged -> commit | {} | | | | |",
                    stages(&l.stages_ms),
                );
            }
        }
        for r in [&self.spread, &self.hot].into_iter().flatten() {
            if !r.stages_ms.is_empty() {
                let _ = writeln!(
                    s,
                    "| {}: where an event's time goes, mean ms per stage (as above; whole backlog at start, so `fetched` is mostly the backlog's wait) | {} | | | | |",
                    r.label,
                    stages(&r.stages_ms),
                );
            }
        }
        self.spring_rows(&mut s);
        let runs: Vec<&Run> = [&self.spread, &self.hot, &self.baseline]
            .into_iter()
            .flatten()
            .collect();
        let mut rss: Vec<(String, f64)> = runs
            .iter()
            .map(|r| (r.label.clone(), r.max_rss_mib))
            .collect();
        if let Some(l) = &self.latency {
            rss.push(("latency".into(), l.max_rss_mib));
        }
        if !rss.is_empty() {
            let peak = rss.iter().map(|(_, m)| *m).fold(0.0, f64::max);
            let each: Vec<String> = rss.iter().map(|(l, m)| format!("{l} {m:.1}")).collect();
            let _ = writeln!(
                s,
                "| peak RSS (VmHWM) of deductor, whole backlog at start | {peak:.1} MiB ({}) | | | <= {RSS_TARGET_MIB:.0} MiB | {} |",
                each.join(", "),
                met(Some(peak <= RSS_TARGET_MIB)),
            );
        }
        let mut cpu: Vec<String> = runs
            .iter()
            .map(|r| format!("{} {:.3}", r.label, r.cpu_per_1k))
            .collect();
        if let Some(l) = &self.latency {
            cpu.push(format!("latency {:.3}", l.cpu_per_1k));
        }
        if !cpu.is_empty() {
            let _ = writeln!(
                s,
                "| deductor CPU seconds per 1,000 events | {} | | | | |",
                cpu.join(", ")
            );
        }
        for r in &runs {
            let _ = writeln!(
                s,
                "| {}: wall clock incl. start, group join and drain detection | {:.1} s, {:.0} events/s | | | | |",
                r.label, r.wall_s, r.events_per_s_wall
            );
        }
        for r in &runs {
            let _ = writeln!(
                s,
                "| {}: Redis script calls per event; µs inside Redis scripts per event; Redis busy in scripts; placement lines per batch call | {:.2}; {:.1} µs; {:.0}% of the span; {} | | | | |",
                r.label,
                r.script_calls_per_event,
                r.redis_usec_per_event,
                r.redis_busy * 100.0,
                match r.batch_calls_lines {
                    Some((calls, lines)) if calls > 0.0 => {
                        format!("{:.1} ({:.0} calls)", lines / calls, calls)
                    }
                    _ => "no batches".to_owned(),
                },
            );
            let [service, redis, broker] = r.cpu_us_per_event();
            let _ = writeln!(
                s,
                "| {}: CPU per event of deductor / Redis / Kafka broker (whole process, wall-clock window) | {service:.0} / {redis:.0} / {broker:.0} µs | | | | |",
                r.label,
            );
        }
        s.push('\n');
        let springs = [&self.spring_batch, &self.spring_record, &self.spring_hot];
        for r in runs.iter().copied().chain(springs.into_iter().flatten()) {
            let tally: Vec<String> = r.tally.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            let _ = writeln!(
                s,
                "- {} outcomes ({} events, {} refunds, {} repeated outcomes): {}",
                r.label,
                r.events,
                r.refunds,
                r.outcomes - r.tally.values().sum::<u64>(),
                tally.join(", ")
            );
        }
        s
    }

    /// Issue 27's table: deductor over the batch-tuned Spring service, spread
    /// and hot, each figure as `deductor / Spring = ratio`, with its goal.
    /// Written only when both pairs of runs are there.
    fn issue27_table(&self, s: &mut String) {
        let (Some(ds), Some(ss), Some(dh), Some(sh)) = (
            &self.spread,
            &self.spring_batch,
            &self.hot,
            &self.spring_hot,
        ) else {
            return;
        };
        let cell = |d: Option<f64>, r: Option<f64>, unit: &str| {
            let u = if unit.is_empty() {
                String::new()
            } else {
                format!(" {unit}")
            };
            match (d, r) {
                (Some(d), Some(r)) if r > 0.0 => format!("{d:.0} / {r:.0}{u} = **{:.2}x**", d / r),
                (Some(d), _) => format!("{d:.0} / n/a{u}"),
                _ => "n/a".to_owned(),
            }
        };
        let cpu = |r: &Run, i: usize| Some(r.cpu_us_per_event()[i]);
        let all = |r: &Run| Some(r.cpu_us_per_event().iter().sum::<f64>());
        let _ = writeln!(
            s,
            "Issue 27's table: deductor / the batch-tuned Spring service (tools/bench/spring, the reference script), \
             same broker, Redis and events, in this run. CPU per event is over the same window for both: \
             from the first to the last outcome, as a live reader of the outcome topic saw them arrive \
             (deductor's start and drain detection, and the JVM's start, are left out).\n"
        );
        let _ = writeln!(s, "| figure, deductor / Spring | spread | hot | goal |");
        let _ = writeln!(s, "|---|---|---|---|");
        let rows: [Row27; 7] = [
            (
                "events/s",
                Some(ds.events_per_s),
                Some(ss.events_per_s),
                Some(dh.events_per_s),
                Some(sh.events_per_s),
                "",
                ">= 1.5x, both",
            ),
            (
                "CPU per event of the service",
                cpu(ds, 0),
                cpu(ss, 0),
                cpu(dh, 0),
                cpu(sh, 0),
                "µs",
                "no worse than today",
            ),
            (
                "Redis CPU per event",
                cpu(ds, 1),
                cpu(ss, 1),
                cpu(dh, 1),
                cpu(sh, 1),
                "µs",
                "hot <= 0.5x, spread <= 1.0x",
            ),
            (
                "broker CPU per event",
                cpu(ds, 2),
                cpu(ss, 2),
                cpu(dh, 2),
                cpu(sh, 2),
                "µs",
                "spread <= 1.0x",
            ),
            (
                "CPU per event, all three processes",
                all(ds),
                all(ss),
                all(dh),
                all(sh),
                "µs",
                "",
            ),
            (
                "Redis memory per accepted order (`used_memory` growth / DeductAccepted)",
                ds.redis_b_per_accepted(),
                ss.redis_b_per_accepted(),
                dh.redis_b_per_accepted(),
                sh.redis_b_per_accepted(),
                "B",
                "<= 1.0x",
            ),
            (
                "peak RSS",
                Some(ds.max_rss_mib),
                Some(ss.max_rss_mib),
                Some(dh.max_rss_mib),
                Some(sh.max_rss_mib),
                "MiB",
                "no worse than today",
            ),
        ];
        for (what, d1, r1, d2, r2, unit, goal) in rows {
            let _ = writeln!(
                s,
                "| {what} | {} | {} | {goal} |",
                cell(d1, r1, unit),
                cell(d2, r2, unit)
            );
        }
        s.push('\n');
    }

    /// Issue 14's Spring comparison: the services' own figures, then
    /// deductor's spread run over each.
    fn spring_rows(&self, s: &mut String) {
        for (r, what) in [
            (
                &self.spring_batch,
                "batch listener, one pipelined round trip per poll, asynchronous sends",
            ),
            (
                &self.spring_record,
                "one record at a time, blocking calls and sends",
            ),
        ] {
            let Some(r) = r else { continue };
            let _ = writeln!(
                s,
                "| Spring Kafka + RedisTemplate running the reference script ({what}), spread, {} events | {:.0} events/s; {:.3} CPU s per 1,000 events; peak RSS {:.1} MiB; {:.2} script calls and {:.1} µs inside Redis per event; CPU per event of the JVM / Redis / broker {:.0} / {:.0} / {:.0} µs (first to last outcome) | | | | |",
                r.events,
                r.events_per_s,
                r.cpu_per_1k,
                r.max_rss_mib,
                r.script_calls_per_event,
                r.redis_usec_per_event,
                r.cpu_s / r.events as f64 * 1e6,
                r.redis_cpu_share * r.wall_s / r.events as f64 * 1e6,
                r.kafka_cpu_share * r.wall_s / r.events as f64 * 1e6,
            );
        }
        let Some(d) = &self.spread else { return };
        let met = |ok: bool| if ok { "yes" } else { "**no**" };
        for (r, name, goal) in [
            (&self.spring_batch, "the batch-tuned Spring service", true),
            (
                &self.spring_record,
                "the one-record-at-a-time Spring service",
                false,
            ),
        ] {
            let Some(r) = r else { continue };
            let q = d.events_per_s / r.events_per_s;
            let m = d.max_rss_mib / r.max_rss_mib;
            let (t_target, t_met, m_target, m_met) = if goal {
                (
                    format!(">= {SPRING_THROUGHPUT_TARGET:.0}x"),
                    met(q >= SPRING_THROUGHPUT_TARGET),
                    "<= 1/8 (0.125x)".to_owned(),
                    met(m <= SPRING_RSS_TARGET),
                )
            } else {
                (String::new(), "", String::new(), "")
            };
            let _ = writeln!(
                s,
                "| spread throughput over {name} (issue 14) | {:.0} events/s | {:.0} events/s | {q:.2}x | {t_target} | {t_met} |",
                d.events_per_s, r.events_per_s,
            );
            let _ = writeln!(
                s,
                "| peak RSS of deductor (spread) over {name}'s | {:.1} MiB | {:.1} MiB | {m:.3}x | {m_target} | {m_met} |",
                d.max_rss_mib, r.max_rss_mib,
            );
        }
    }
}

/// One row of issue 27's table: the figure, deductor and Spring on spread,
/// the same on hot, the unit, the goal.
type Row27<'a> = (
    &'a str,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    &'a str,
    &'a str,
);

/// `fetched 1.0 / admitted 0.1 / ...`, in the order of an event's life.
fn stages(m: &BTreeMap<String, f64>) -> String {
    ["fetched", "admitted", "redis", "publish", "commit"]
        .iter()
        .filter_map(|k| m.get(*k).map(|v| format!("{k} {v:.1}")))
        .collect::<Vec<_>>()
        .join(" / ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(label: &str, events_per_s: f64, max_rss_mib: f64) -> Run {
        Run {
            label: label.to_owned(),
            workload: "spread".to_owned(),
            settings: Vec::new(),
            events: 1_000,
            refunds: 0,
            preload_s: 0.0,
            outcomes: 1_000,
            duplicates: 0,
            span_s: 1.0,
            events_per_s,
            wall_s: 1.0,
            events_per_s_wall: events_per_s,
            cpu_s: 0.1,
            cpu_per_1k: 0.1,
            max_rss_mib,
            script_calls: 1_000,
            script_calls_per_event: 1.0,
            redis_usec_per_event: 10.0,
            redis_busy: 0.5,
            redis_cpu_share: 0.5,
            kafka_cpu_share: 0.2,
            tally: BTreeMap::new(),
            stages_ms: BTreeMap::new(),
            redis_memory_growth_b: None,
            batch_calls_lines: None,
            window: None,
        }
    }

    fn row<'a>(md: &'a str, start: &str) -> &'a str {
        md.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no row starting {start:?} in:\n{md}"))
    }

    #[test]
    fn the_spring_rows_give_deductor_over_each_service_against_issue_14s_goals() {
        let mut r = Report::start(Path::new("deductor"), 1_000, 12);
        r.spread = Some(run("spread", 9_000.0, 50.0));
        r.spring_batch = Some(run("spring-batch", 3_000.0, 400.0));
        r.spring_record = Some(run("spring-record", 6_000.0, 300.0));
        let md = r.markdown();
        let batch = row(
            &md,
            "| spread throughput over the batch-tuned Spring service",
        );
        assert!(batch.contains("| 3.00x | >= 3x | yes |"), "{batch}");
        let rss = row(&md, "| peak RSS of deductor (spread) over the batch-tuned");
        assert!(rss.contains("| 0.125x | <= 1/8 (0.125x) | yes |"), "{rss}");
        let record = row(&md, "| spread throughput over the one-record-at-a-time");
        assert!(record.contains("| 1.50x |  |  |"), "{record}");

        r.spring_batch = Some(run("spring-batch", 4_000.0, 300.0));
        let md = r.markdown();
        let batch = row(
            &md,
            "| spread throughput over the batch-tuned Spring service",
        );
        assert!(batch.contains("| 2.25x | >= 3x | **no** |"), "{batch}");
        let rss = row(&md, "| peak RSS of deductor (spread) over the batch-tuned");
        assert!(
            rss.contains("| 0.167x | <= 1/8 (0.125x) | **no** |"),
            "{rss}"
        );
        assert!(md.contains("- spring-batch outcomes"), "{md}");
    }

    #[test]
    fn issue_27s_table_gives_each_figure_over_the_spring_service_spread_and_hot() {
        let mut r = Report::start(Path::new("deductor"), 1_000, 12);
        r.spread = Some(run("spread", 9_000.0, 50.0));
        r.hot = Some(run("hot", 6_000.0, 60.0));
        r.spring_batch = Some(run("spring-batch", 3_000.0, 400.0));
        assert!(
            !r.markdown().contains("Issue 27's table"),
            "written only with the hot pair too"
        );
        let mut sh = run("spring-batch-hot", 4_000.0, 500.0);
        sh.tally.insert("DeductAccepted".into(), 500);
        sh.redis_memory_growth_b = Some(100_000);
        r.spring_hot = Some(sh);
        let mut dh = run("hot", 6_000.0, 60.0);
        dh.tally.insert("DeductAccepted".into(), 400);
        dh.redis_memory_growth_b = Some(120_000);
        r.hot = Some(dh);
        let md = r.markdown();
        let rate = row(&md, "| events/s |");
        assert!(
            rate.contains("| 9000 / 3000 = **3.00x** | 6000 / 4000 = **1.50x** |"),
            "{rate}"
        );
        let mem = row(&md, "| Redis memory per accepted order");
        assert!(
            mem.contains("| n/a | 300 / 200 B = **1.50x** | <= 1.0x |"),
            "{mem}"
        );
        // run(): cpu_s 0.1 over 1,000 events, Redis 0.5 and broker 0.2 cores over 1 s.
        let redis = row(&md, "| Redis CPU per event |");
        assert!(redis.contains("500 / 500 µs = **1.00x**"), "{redis}");
        assert!(md.find("Issue 27's table") < md.find("| figure | measured |"));

        // With a first-to-last-outcome window, the table's CPU is the window's.
        let mut ds = run("spread", 9_000.0, 50.0);
        ds.window = Some(Window {
            wall_s: 0.5,
            service_s: 0.04,
            redis_s: 0.03,
            kafka_s: 0.01,
        });
        r.spread = Some(ds);
        let md = r.markdown();
        let redis = row(&md, "| Redis CPU per event |");
        assert!(redis.contains("| 30 / 500 µs = **0.06x** |"), "{redis}");
        let broker = row(&md, "| broker CPU per event |");
        assert!(broker.contains("| 10 / 200 µs = **0.05x** |"), "{broker}");
        let service = row(&md, "| CPU per event of the service |");
        assert!(service.contains("| 40 / 100 µs = **0.40x** |"), "{service}");
    }
}
