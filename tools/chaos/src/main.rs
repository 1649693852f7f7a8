//! `deductor-chaos`: the chaos suite. Seeds promotions with scarce stock,
//! budgets and per-customer limits, produces a stream of order events, runs
//! 1 to 3 `deductor run` processes in one consumer group, injects faults at
//! random moments (consumer SIGKILL, zombies, rebalances, Redis SIGKILL,
//! broker SIGKILL, network cuts, Redis and broker stalls that SIGKILL a
//! consumer with events in flight), drains, then checks the topics, the
//! committed offsets and Redis (see `check.rs`) and prints the figures.
//! Exit status 0 iff every promised zero is zero.
//!
//! Normally started by `scripts/chaos`, which builds the binaries and runs a
//! separate dev-stack broker for it. See docs/reliability.md.

mod auditor;
mod check;
mod faults;
mod fleet;
mod kafka;
mod model;
mod operator;
mod replicated;
mod stack;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand};
use deductor::admin::{self, PromoSpec};
use deductor::domain::event::Id;
use deductor::ledger::Ledger;
use deductor_testkit::rng::Rng;
use deductor_testkit::topics;

use check::{Delivery, RunInfo};
use faults::{Counts, Env};
use fleet::Fleet;
use stack::{Broker, Netns, Redis};

#[derive(Parser)]
#[command(
    name = "deductor-chaos",
    about = "Fault injection and a checker for deductor"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Seed, produce, run consumers, inject faults, drain, check.
    Run(Box<RunArgs>),
    /// Check a finished run again (its run dir must still have its broker and Redis).
    /// Check a finished run again: its Redis is restarted from the run dir
    /// (on loopback), its broker must be up (scripts/chaos starts it).
    Check {
        #[arg(long)]
        run_dir: PathBuf,
        /// The repository (for config/dev-stack/redis-common.conf).
        #[arg(long, default_value = ".")]
        repo: PathBuf,
    },
}

#[derive(Args, Clone, serde::Serialize)]
struct RunArgs {
    /// Records to produce (whole orders, so a few more).
    #[arg(long, default_value_t = 3_000)]
    events: usize,
    /// Share of invalid events.
    #[arg(long, default_value_t = 0.03)]
    invalid_share: f64,
    /// `deductor run` processes in the group (1 to 3).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=3))]
    consumers: u8,
    /// Seconds over which events are produced and faults injected.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    #[arg(long, default_value_t = 0)]
    consumer_kills: usize,
    #[arg(long, default_value_t = 0)]
    zombies: usize,
    #[arg(long, default_value_t = 0)]
    rebalances: usize,
    #[arg(long, default_value_t = 0)]
    redis_kills: usize,
    #[arg(long, default_value_t = 0)]
    broker_kills: usize,
    /// Network cuts of Redis (needs --netns).
    #[arg(long, default_value_t = 0)]
    redis_cuts: usize,
    /// Network cuts of the broker's port (host iptables on lo).
    #[arg(long, default_value_t = 0)]
    broker_cuts: usize,
    /// Redis frozen (SIGSTOP) while a consumer is SIGKILLed, then SIGCONT.
    #[arg(long, default_value_t = 0)]
    redis_stalls: usize,
    /// The broker frozen (SIGSTOP) while a consumer is SIGKILLed, then SIGCONT.
    #[arg(long, default_value_t = 0)]
    broker_stalls: usize,
    /// Live promotion changes with `deductor promo`, in turn: pause (1 to
    /// 3 s) and resume, adjust, a forced re-seed.
    #[arg(long, default_value_t = 0)]
    operator_changes: usize,
    /// Corrupt data met by a zombie: a promotion's budget or stock made
    /// non-canonical during a burst, a consumer frozen, the data repaired
    /// while it is frozen.
    #[arg(long, default_value_t = 0)]
    corruptions: usize,
    /// Redis failovers: Redis runs as a primary and a replica (each behind
    /// a proxy) with three sentinels, and the consumers use its
    /// `redis-sentinel://` url; each failover stalls the replica's link
    /// while events flow, SIGKILLs the primary and lets Sentinel promote the
    /// replica. Not with the single-Redis faults (--redis-kills, --redis-cuts,
    /// --redis-stalls, --netns).
    #[arg(long, default_value_t = 0)]
    failovers: usize,
    /// Redis out of memory: `maxmemory` squeezed to 1 byte during a burst
    /// (every script write refused with OOM), held 2 to 6 s, then released.
    /// Not with --failovers.
    #[arg(long, default_value_t = 0)]
    redis_ooms: usize,
    /// With --cluster: a reshard of a hot promotion's slot (its keys moved
    /// in chunks over 3 to 8 s) while events flow.
    #[arg(long, default_value_t = 0)]
    slot_migrations: usize,
    /// With --cluster: a primary and its replica added, and slots with
    /// their keys rebalanced onto it while events flow (at most 2).
    #[arg(long, default_value_t = 0)]
    node_adds: usize,
    /// With --failovers: the consumers' `redis.wait_replicas` (the
    /// durability gate). 0 turns the gate off: the run then loses
    /// acknowledged deductions, which the check must report.
    #[arg(long, default_value_t = 1)]
    wait_replicas: u32,
    /// With --failovers: a Redis Cluster of three primaries with one
    /// replica each (the cluster fails over by itself) instead of Sentinel.
    #[arg(long)]
    cluster: bool,
    /// A 3-node cluster instead of one broker (scripts/dev-stack's
    /// `brokers3-*`, started by scripts/chaos --brokers3): --brokers lists
    /// its nodes, the run's topics get replication factor 3 and
    /// min.insync.replicas 2, and its faults are --coordinator-kills,
    /// --leader-moves and --broker-freezes (not the one broker's
    /// --broker-kills, --broker-cuts, --broker-stalls).
    #[arg(long)]
    brokers3: bool,
    /// --brokers3: the group's coordinator (in exactly_once, every other
    /// time the transaction coordinator of a consumer's transactional.id)
    /// SIGKILLed, restarted 5 to 15 s later.
    #[arg(long, default_value_t = 0)]
    coordinator_kills: usize,
    /// --brokers3: every partition leader of the input and the outcome
    /// topic moved to another in-sync replica while events flow.
    #[arg(long, default_value_t = 0)]
    leader_moves: usize,
    /// --brokers3: a broker (in turn the group coordinator and a random
    /// one) frozen with SIGSTOP for 2 to 8 s, then SIGCONT.
    #[arg(long, default_value_t = 0)]
    broker_freezes: usize,
    /// Run a deliberately broken service (a build with the test-only cargo
    /// feature `mutants`): the consumers get DEDUCTOR_MUTANT=<name>
    /// (commit-early, no-ack-wait, double-deduct). The run must then fail.
    #[arg(long)]
    mutant: Option<String>,
    /// How the service publishes (its `kafka.delivery`): with exactly_once
    /// every consumer gets --set=kafka.delivery=exactly_once (outcomes and
    /// dead letters in Kafka transactions with the consumed offsets) and the
    /// check requires one outcome per input record and one dead letter per
    /// invalid record as a read_committed reader sees them; with
    /// at_least_once (the default) nothing is passed and their duplicates
    /// are information.
    #[arg(long, value_enum, default_value_t = Delivery::AtLeastOnce)]
    delivery: Delivery,
    /// Seed of the workload and the schedule (default: the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Where logs, the workload summary and the figures go.
    #[arg(long)]
    run_dir: PathBuf,
    /// The separate chaos broker.
    #[arg(long, default_value = "127.0.0.1:9292")]
    brokers: String,
    /// Port of the run's own Redis.
    #[arg(long, default_value_t = 6490)]
    redis_port: u16,
    /// Put Redis behind a network namespace (veth), so its port can be cut.
    #[arg(long)]
    netns: bool,
    /// The service binary.
    #[arg(long, default_value = "target/release/deductor")]
    deductor: PathBuf,
    /// scripts/dev-stack (kill-kafka / start-kafka, brokers3-*; its env names the instance).
    #[arg(long, default_value = "scripts/dev-stack")]
    stack_cmd: PathBuf,
    /// The dev-stack instance's state dir (for the broker's pidfile).
    #[arg(
        long,
        env = "DEDUCTOR_STACK_DIR",
        default_value = "/tmp/deductor-chaos-stack"
    )]
    stack_dir: PathBuf,
    /// The repository (for config/dev-stack/redis-common.conf).
    #[arg(long, default_value = ".")]
    repo: PathBuf,
    /// The consumers' session.timeout.ms; a zombie sleeps longer than this.
    #[arg(long, default_value_t = 6_000)]
    session_timeout_ms: u64,
    /// The consumers' kafka.produce_timeout_ms (librdkafka's
    /// message.timeout.ms). Below the broker stalls, so an outcome queued
    /// during one fails and must be sent again (the service retries).
    #[arg(long, default_value_t = 1_500)]
    produce_timeout_ms: u64,
    /// Most seconds to wait for the drain after the last fault.
    #[arg(long, default_value_t = 600)]
    drain_timeout: u64,
    /// Seconds between two `deductor audit`s while the run is in flight
    /// (from the consumers' start to the end of the drain), in turn of
    /// every promotion and of one named promotion; 0: none. A breach any
    /// of them reports fails the run (see `auditor.rs`).
    #[arg(long, default_value_t = 5)]
    audit_every: u64,
}

/// Seconds between two bursts of the production; a fault waits for the
/// next burst.
const BURST_EVERY_SECS: u64 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("deductor-chaos: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match cli.command {
            Command::Run(a) => run(*a).await,
            Command::Check { run_dir, repo } => recheck(run_dir, repo).await,
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("deductor-chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn log(started: Instant, msg: impl AsRef<str>) {
    eprintln!(
        "chaos [{:>6.1}s] {}",
        started.elapsed().as_secs_f64(),
        msg.as_ref()
    );
}

async fn recheck(dir: PathBuf, repo: PathBuf) -> anyhow::Result<bool> {
    // Absolute, as in a run: redis.conf names its paths from it.
    let dir = dir
        .canonicalize()
        .with_context(|| format!("run dir {}", dir.display()))?;
    let mut run: RunInfo = serde_json::from_slice(&std::fs::read(dir.join("run.json"))?)?;
    let promos: Vec<workload::Promo> =
        serde_json::from_slice(&std::fs::read(dir.join("promotions.json"))?)?;
    let args: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("args.json"))?)?;
    let port = args["args"]["redis_port"].as_u64().unwrap_or(6490) as u16;
    // The rules the run was held to (runs from before the setting: at_least_once).
    let delivery: Delivery = match args["args"].get("delivery") {
        Some(v) => serde_json::from_value(v.clone()).context("args.json: delivery")?,
        None => Delivery::AtLeastOnce,
    };
    eprintln!(
        "chaos: checking {} again, delivery {delivery}",
        dir.display()
    );
    // The run's Redis again, from its AOF, on loopback (its namespace is gone).
    let mut redis = Redis::new(&repo, &dir.join("redis"), port, None)?;
    redis.start()?;
    run.redis_url = redis.url();
    let result = check::check(&run, &promos, &dir, delivery).await;
    redis.kill();
    let f = result?;
    print!("{}", check::print(&f));
    Ok(f.failed().is_empty())
}

async fn seed_promotions(ledger: &Ledger, promos: &[workload::Promo]) -> anyhow::Result<()> {
    for p in promos.iter().filter(|p| p.seeded) {
        let spec = PromoSpec {
            budget: p.budget,
            stock: p.stock,
            per_customer: p.per_customer,
            starts_at: p.starts_at,
            ends_at: p.ends_at,
            paused: p.paused,
        };
        let id = Id::parse(&p.id).map_err(|e| anyhow::anyhow!("{e}"))?;
        match p.buckets {
            Some(k) => {
                admin::bucketed::create(ledger, &id, spec, k).await?;
            }
            None => {
                admin::promo_set(ledger, &id, spec, true).await?;
            }
        }
    }
    Ok(())
}

async fn run(a: RunArgs) -> anyhow::Result<bool> {
    let started = Instant::now();
    if (a.redis_cuts > 0) && !a.netns {
        bail!("--redis-cuts needs --netns");
    }
    if a.brokers3 && a.broker_kills + a.broker_cuts + a.broker_stalls > 0 {
        bail!("--brokers3 runs a 3-node cluster: its faults are --coordinator-kills, --leader-moves and --broker-freezes, not --broker-kills, --broker-cuts or --broker-stalls");
    }
    if !a.brokers3 && a.coordinator_kills + a.leader_moves + a.broker_freezes > 0 {
        bail!("--coordinator-kills, --leader-moves and --broker-freezes need --brokers3 (a 3-node cluster)");
    }
    std::fs::create_dir_all(&a.run_dir)?;
    let dir = a.run_dir.canonicalize()?;
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let mut rng = Rng::new(seed ^ 0x5EED);
    let tag = format!("{:06x}", rng.next_u64() & 0xff_ffff);
    std::fs::write(
        dir.join("args.json"),
        serde_json::to_vec_pretty(
            &serde_json::json!({"seed": seed, "tag": tag, "args": a.clone()}),
        )?,
    )?;
    log(
        started,
        format!(
            "run {tag}, seed {seed}, delivery {}, {}, dir {}",
            a.delivery,
            if a.brokers3 { "3 brokers" } else { "1 broker" },
            dir.display()
        ),
    );

    let w = workload::generate(a.events, a.invalid_share, seed);
    std::fs::write(
        dir.join("promotions.json"),
        serde_json::to_vec_pretty(&w.promos)?,
    )?;
    std::fs::write(
        dir.join("workload.json"),
        serde_json::to_vec_pretty(&w.stats)?,
    )?;
    log(
        started,
        format!(
            "workload: {} records, {} orders, {} invalid, {} with a ~1 MB header",
            w.stats.records, w.stats.orders, w.stats.invalid, w.stats.huge_header_records
        ),
    );

    if (a.slot_migrations > 0 || a.node_adds > 0) && !(a.cluster && a.failovers > 0) {
        bail!("--slot-migrations and --node-adds need the replicated Cluster (--failovers N --cluster)");
    }
    if a.node_adds > 2 {
        bail!("--node-adds: at most 2");
    }
    if a.failovers > 0 {
        if a.netns || a.redis_kills + a.redis_cuts + a.redis_stalls + a.redis_ooms > 0 {
            bail!("--failovers runs a replicated Redis: not with --netns, --redis-kills, --redis-cuts, --redis-stalls or --redis-ooms");
        }
        let set = if a.cluster {
            replicated::Topology::Cluster(
                replicated::ReplicatedCluster::start(&a.repo, &dir.join("redis"), a.redis_port)
                    .await?,
            )
        } else {
            replicated::Topology::Sentinel(
                replicated::Replicated::start(&a.repo, &dir.join("redis"), a.redis_port).await?,
            )
        };
        let url = set.url();
        let primary = set.first_node();
        let set_shared = Arc::new(tokio::sync::Mutex::new(set));
        let result = run_with_redis(
            &a,
            &dir,
            &tag,
            seed,
            &mut rng,
            w,
            primary,
            Some((set_shared.clone(), url)),
            started,
        )
        .await;
        set_shared.lock().await.stop();
        return result;
    }
    // Redis of our own, maybe behind a namespace.
    let netns = if a.netns {
        Some(
            Netns::create(&tag, (rng.range(1, 250)) as u8)
                .context("creating the network namespace")?,
        )
    } else {
        None
    };
    let redis = Redis::new(&a.repo, &dir.join("redis"), a.redis_port, netns)?;
    let redis = Arc::new(std::sync::Mutex::new(redis));
    let result = run_with_redis(
        &a,
        &dir,
        &tag,
        seed,
        &mut rng,
        w,
        redis.clone(),
        None,
        started,
    )
    .await;
    redis.lock().expect("redis lock").stop();
    result
}

#[allow(clippy::too_many_arguments)]
async fn run_with_redis(
    a: &RunArgs,
    dir: &std::path::Path,
    tag: &str,
    seed: u64,
    rng: &mut Rng,
    w: workload::Workload,
    redis: Arc<std::sync::Mutex<Redis>>,
    replicated: Option<(Arc<tokio::sync::Mutex<replicated::Topology>>, String)>,
    started: Instant,
) -> anyhow::Result<bool> {
    let redis_url = match &replicated {
        Some((_, url)) => url.clone(),
        None => {
            let mut r = redis.lock().expect("redis lock");
            r.start()?;
            r.url()
        }
    };
    let run = RunInfo {
        brokers: a.brokers.clone(),
        input_topic: format!("chaos-{tag}-orders"),
        outcome_topic: format!("chaos-{tag}-outcomes"),
        dlq_topic: format!("chaos-{tag}-dlq"),
        group: format!("chaos-{tag}"),
        redis_url: redis_url.clone(),
        key_prefix: format!("chaos{tag}"),
    };
    std::fs::write(dir.join("run.json"), serde_json::to_vec_pretty(&run)?)?;
    let settings = stack::redis_settings(&redis_url, &run.key_prefix);
    let ledger = Ledger::connect(&settings)
        .await
        .context("connecting to the chaos Redis")?;
    seed_promotions(&ledger, &w.promos).await?;
    ledger.quit().await;
    let topic = |name, partitions| topics::Topic {
        name,
        partitions,
        append_time: false,
    };
    // --brokers3: replication factor 3, min.insync.replicas 2.
    topics::create_replicated(
        &a.brokers,
        &[
            topic(&run.input_topic, 6),
            topic(&run.outcome_topic, 6),
            topic(&run.dlq_topic, 3),
        ],
        Duration::from_secs(60),
        if a.brokers3 { 3 } else { 1 },
    )
    .await?;
    log(
        started,
        format!(
            "redis {redis_url}, topics {} / {} / {}",
            run.input_topic, run.outcome_topic, run.dlq_topic
        ),
    );

    let kafka_port: u16 = a
        .brokers
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(9292);
    let consumer_args: Vec<String> = [
        "run".to_owned(),
        format!("--brokers={}", a.brokers),
        format!("--redis-url={redis_url}"),
        "--log-format=json".to_owned(),
        "--log-level=info,rdkafka=warn".to_owned(),
        format!("--set=kafka.group_id={}", run.group),
        format!("--set=kafka.input_topic={}", run.input_topic),
        format!("--set=kafka.outcome_topic={}", run.outcome_topic),
        format!("--set=kafka.dlq_topic={}", run.dlq_topic),
        format!("--set=redis.key_prefix={}", run.key_prefix),
        "--set=http.listen=".to_owned(),
        format!(
            "--set=kafka.consumer.session.timeout.ms={}",
            a.session_timeout_ms
        ),
        format!(
            "--set=kafka.consumer.heartbeat.interval.ms={}",
            (a.session_timeout_ms / 4).max(500)
        ),
        format!("--set=kafka.produce_timeout_ms={}", a.produce_timeout_ms),
        "--set=pipeline.commit_interval_ms=500".to_owned(),
        "--set=pipeline.drain_timeout_secs=15".to_owned(),
    ]
    .into();
    let mut consumer_args = consumer_args;
    if replicated.is_some() {
        consumer_args.push(format!("--set=redis.wait_replicas={}", a.wait_replicas));
    }
    // Only when asked: a service without the setting refuses unknown keys.
    if a.delivery == Delivery::ExactlyOnce {
        consumer_args.push(format!("--set=kafka.delivery={}", a.delivery));
    }
    let mut fleet = Fleet::new(a.deductor.clone(), consumer_args, dir.to_owned());
    fleet.mutant = a.mutant.clone();
    let fleet = Arc::new(tokio::sync::Mutex::new(fleet));
    {
        let mut f = fleet.lock().await;
        for i in 0..a.consumers as usize {
            f.spawn(i)?;
        }
    }
    let result = drive(
        a,
        dir,
        &run,
        seed,
        rng,
        w,
        redis,
        replicated.map(|(set, _)| set),
        fleet.clone(),
        kafka_port,
        started,
    )
    .await;
    fleet.lock().await.kill_all();
    result
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    a: &RunArgs,
    dir: &std::path::Path,
    run: &RunInfo,
    seed: u64,
    rng: &mut Rng,
    w: workload::Workload,
    redis: Arc<std::sync::Mutex<Redis>>,
    replicated: Option<Arc<tokio::sync::Mutex<replicated::Topology>>>,
    fleet: Arc<tokio::sync::Mutex<Fleet>>,
    kafka_port: u16,
    started: Instant,
) -> anyhow::Result<bool> {
    // Reap exits in the background: a consumer that dies unasked is restarted.
    let monitor = AbortOnDrop({
        let fleet = fleet.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                if let Err(e) = fleet.lock().await.poll() {
                    eprintln!("chaos: restarting a consumer failed: {e:#}");
                }
            }
        })
    });

    let window = Duration::from_secs(a.duration.max(1));
    let bursts = (a.duration / BURST_EVERY_SECS).max(1) as usize;
    let progress = Arc::new(kafka::Production::default());
    let mut producer = {
        let (brokers, topic, progress) =
            (a.brokers.clone(), run.input_topic.clone(), progress.clone());
        let records = w.records;
        let burst = (records.len() / bursts).max(1);
        tokio::spawn(async move {
            kafka::produce(&brokers, &topic, &records, window, burst, progress).await
        })
    };

    let counts = Counts {
        consumer_kills: a.consumer_kills,
        zombies: a.zombies,
        rebalances: a.rebalances,
        redis_kills: a.redis_kills,
        broker_kills: a.broker_kills,
        redis_cuts: a.redis_cuts,
        broker_cuts: a.broker_cuts,
        redis_stalls: a.redis_stalls,
        broker_stalls: a.broker_stalls,
        operator_changes: a.operator_changes,
        corruptions: a.corruptions,
        failovers: a.failovers,
        redis_ooms: a.redis_ooms,
        slot_migrations: a.slot_migrations,
        node_adds: a.node_adds,
        coordinator_kills: a.coordinator_kills,
        leader_moves: a.leader_moves,
        broker_freezes: a.broker_freezes,
    };
    let plan = faults::schedule(&counts, window, rng);
    let disturbances = Arc::new(auditor::Disturbances::default());
    // The audits, from now to the end of the drain.
    let (stop_audits, audits_stopped) = tokio::sync::watch::channel(false);
    let audits = (a.audit_every > 0).then(|| {
        let promos = load_promos(dir).unwrap_or_default();
        tokio::spawn(
            auditor::Auditor {
                bin: a.deductor.clone(),
                settings: vec![
                    format!("--redis-url={}", run.redis_url),
                    format!("--brokers={}", run.brokers),
                    format!("--set=redis.key_prefix={}", run.key_prefix),
                    format!("--set=kafka.group_id={}", run.group),
                    format!("--set=kafka.input_topic={}", run.input_topic),
                ],
                promos: promos
                    .iter()
                    .filter(|p| p.seeded)
                    .map(|p| p.id.clone())
                    .collect(),
                every: Duration::from_secs(a.audit_every),
                timeout: Duration::from_secs(60),
                disturbances: disturbances.clone(),
                started,
            }
            .run(audits_stopped),
        )
    });
    let env = Env {
        fleet: fleet.clone(),
        redis: redis.clone(),
        broker: Broker {
            stack_cmd: a.stack_cmd.clone(),
            port: kafka_port,
            stack_dir: a.stack_dir.clone(),
        },
        session_timeout: Duration::from_millis(a.session_timeout_ms),
        started,
        production: progress.clone(),
        burst_period: window / bursts as u32,
        operator: Arc::new(operator::Operator {
            bin: a.deductor.clone(),
            redis_url: run.redis_url.clone(),
            key_prefix: run.key_prefix.clone(),
            promos: load_promos(dir)?,
            dir: dir.to_owned(),
            log: Default::default(),
            disturbances: disturbances.clone(),
        }),
        replicated,
        disturbances: disturbances.clone(),
        cluster: a.brokers3.then(|| {
            Arc::new(faults::Target {
                cluster: stack::Cluster3 {
                    stack_cmd: a.stack_cmd.clone(),
                    stack_dir: a.stack_dir.clone(),
                    brokers: a.brokers.clone(),
                },
                group: run.group.clone(),
                input_topic: run.input_topic.clone(),
                outcome_topic: run.outcome_topic.clone(),
                exactly_once: a.delivery == Delivery::ExactlyOnce,
            })
        }),
    };
    let t0 = Instant::now();
    let mut done = Vec::new();
    let mut per_kind: std::collections::HashMap<String, usize> = Default::default();
    for (at, kind) in plan {
        if let Some(wait) = at.checked_sub(t0.elapsed()) {
            sleep_watching(&fleet, a.delivery, wait).await?;
        }
        refused(&fleet, a.delivery).await?;
        let k = format!("{kind:?}");
        let n = *per_kind.entry(k).and_modify(|n| *n += 1).or_insert(0);
        match faults::inject(kind, &env, rng, n).await {
            Ok(d) => {
                log(started, format!("fault: {} ({:.1} s)", d.detail, d.took_s));
                done.push(d);
            }
            Err(e) => {
                // Put things back as well as possible, then stop: a fault
                // that cannot be undone invalidates the run.
                let _ = redis.lock().map(|r| r.netns().map(|n| n.heal()));
                let _ = redis.lock().map(|r| r.resume());
                let _ = env.broker.heal();
                let _ = env.broker.resume();
                if let Some(t) = &env.cluster {
                    t.cluster.heal_all();
                }
                bail!("fault {kind:?} failed: {e:#}");
            }
        }
    }
    std::fs::write(dir.join("faults.json"), serde_json::to_vec_pretty(&done)?)?;

    loop {
        tokio::select! {
            r = &mut producer => {
                r.context("producer task")??;
                break;
            }
            () = tokio::time::sleep(Duration::from_millis(250)) => {
                if let Err(e) = refused(&fleet, a.delivery).await {
                    producer.abort();
                    return Err(e);
                }
            }
        }
    }
    log(
        started,
        format!(
            "produced {} records; draining",
            progress.acked.load(Ordering::Relaxed)
        ),
    );

    // Drain: every member running, until the committed offsets reach the log end.
    {
        let mut f = fleet.lock().await;
        for i in 0..f.len() {
            f.thaw(i);
        }
    }
    let drain_started = Instant::now();
    let deadline = drain_started + Duration::from_secs(a.drain_timeout);
    let mut drained = false;
    while Instant::now() < deadline {
        refused(&fleet, a.delivery).await?;
        let (b, t, g) = (
            run.brokers.clone(),
            run.input_topic.clone(),
            run.group.clone(),
        );
        let r = tokio::task::spawn_blocking(move || {
            anyhow::Ok((topics::log_ends(&b, &t)?, kafka::committed(&b, &g, &t)?))
        })
        .await?;
        if let Ok((ends, committed)) = r {
            if ends
                .iter()
                .all(|(p, e)| committed.get(p) == Some(e) || *e == 0)
            {
                drained = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    log(
        started,
        if drained {
            format!(
                "drained in {:.1} s; stopping the consumers (SIGTERM)",
                drain_started.elapsed().as_secs_f64()
            )
        } else {
            format!(
                "NOT drained after {} s; stopping the consumers",
                a.drain_timeout
            )
        },
    );
    drop(monitor);
    let _ = stop_audits.send(true);
    let audits = match audits {
        Some(task) => Some(task.await.context("the auditor task")?),
        None => None,
    };
    let stats = {
        let mut f = fleet.lock().await;
        f.stop_all(Duration::from_secs(40)).await?;
        f.stats.clone()
    };

    log(started, "checking");
    let mut figures = check::check(run, &load_promos(dir)?, dir, a.delivery).await?;
    figures.rows.push((
        "consumer processes started".into(),
        stats.started as i64,
        false,
    ));
    figures
        .rows
        .push(("consumer SIGKILLs".into(), stats.killed as i64, false));
    figures.rows.push((
        "consumer SIGSTOPs (zombies)".into(),
        stats.frozen as i64,
        false,
    ));
    figures
        .rows
        .push(("consumer SIGTERMs".into(), stats.terminated as i64, false));
    for (kind, label) in [
        (faults::Kind::Rebalance, "rebalances (leave/join)"),
        (faults::Kind::RedisKill, "redis SIGKILLs"),
        (faults::Kind::BrokerKill, "broker SIGKILLs"),
        (faults::Kind::RedisCut, "redis network cuts"),
        (faults::Kind::BrokerCut, "broker network cuts"),
        (
            faults::Kind::RedisStall,
            "redis stalls (SIGSTOP + consumer SIGKILL)",
        ),
        (
            faults::Kind::BrokerStall,
            "broker stalls (SIGSTOP + consumer SIGKILL)",
        ),
        (
            faults::Kind::Operator,
            "operator changes (pause/resume, adjust, re-seed)",
        ),
        (
            faults::Kind::Corruption,
            "corrupt data met by a zombie (corrupt, freeze, repair)",
        ),
        (
            faults::Kind::Failover,
            "redis failovers (replica lagging, primary SIGKILLed)",
        ),
        (
            faults::Kind::RedisOom,
            "redis out of memory (maxmemory squeezed, released)",
        ),
        (
            faults::Kind::SlotMigration,
            "cluster slot migrations (a hot promotion's slot resharded)",
        ),
        (
            faults::Kind::NodeAdd,
            "cluster nodes added (slots rebalanced onto them)",
        ),
        (
            faults::Kind::CoordinatorKill,
            "coordinator brokers SIGKILLed (3 brokers)",
        ),
        (
            faults::Kind::LeaderMove,
            "partition leader moves (3 brokers)",
        ),
        (
            faults::Kind::BrokerFreeze,
            "broker freezes (SIGSTOP, 3 brokers)",
        ),
    ] {
        let n = done.iter().filter(|d| d.kind == kind).count();
        figures.rows.push((label.into(), n as i64, false));
    }
    figures.rows.push((
        "SIGTERMed consumers not exiting 0 in time (G4)".into(),
        stats.bad_term_exits.len() as i64,
        true,
    ));
    figures.rows.push((
        "consumers exiting unasked".into(),
        stats.unexpected_exits.len() as i64,
        true,
    ));
    figures.rows.push((
        "consumer starts refused while Redis was down (exit 1)".into(),
        stats.refused_starts.len() as i64,
        false,
    ));
    figures
        .rows
        .push(("drain timed out".into(), i64::from(!drained), true));
    if let Some(t) = &audits {
        figures.rows.extend(t.rows(a.audit_every));
        std::fs::write(dir.join("audits.json"), serde_json::to_vec_pretty(t)?)?;
    }
    for e in stats.bad_term_exits.iter().chain(&stats.unexpected_exits) {
        eprintln!("chaos: {e}");
    }
    // What scripts/chaos prints last when a run failed (CI shows the end).
    std::fs::write(dir.join("exits.txt"), stats.unexpected_tails.concat())?;
    std::fs::write(dir.join("fleet.json"), serde_json::to_vec_pretty(&stats)?)?;
    std::fs::write(
        dir.join("figures.json"),
        serde_json::to_vec_pretty(&figures)?,
    )?;
    let table = check::print(&figures);
    std::fs::write(dir.join("report.txt"), &table)?;
    // The broken promises, one "figure<TAB>value" a line (scripts/chaos
    // --mutants reads which figures caught a mutant).
    let failed_lines: String = figures
        .rows
        .iter()
        .filter(|(_, v, must_be_zero)| *must_be_zero && *v != 0)
        .map(|(n, v, _)| format!("{n}\t{v}\n"))
        .collect();
    std::fs::write(dir.join("failed.txt"), failed_lines)?;
    println!(
        "seed {seed}, delivery {}, run dir {}, {:.0} s\n",
        a.delivery,
        dir.display(),
        started.elapsed().as_secs_f64()
    );
    print!("{table}");
    let failed = figures.failed();
    if failed.is_empty() {
        println!("\nCHAOS OK: every promised zero is zero");
    } else {
        println!(
            "\nCHAOS FAILED: {}; evidence in {}/anomalies.txt",
            failed.join(", "),
            dir.display()
        );
    }
    Ok(failed.is_empty())
}

/// A task aborted when this is dropped (also when the run bails out).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Fails once a consumer refused its settings (exit 2 at its start, see
/// `Fleet::refused`): every restart would refuse them too.
async fn refused(fleet: &tokio::sync::Mutex<Fleet>, delivery: Delivery) -> anyhow::Result<()> {
    let Some(what) = fleet.lock().await.refused.clone() else {
        return Ok(());
    };
    let hint = if delivery == Delivery::ExactlyOnce && what.contains("kafka.delivery") {
        "\n  --delivery exactly_once passes --set=kafka.delivery=exactly_once to the \
         consumers, and this deductor does not know that setting: run it against a \
         service that has kafka.delivery, or with --delivery at_least_once"
    } else {
        ""
    };
    bail!(
        "a consumer refused its settings (exit 2, a usage or config error, at its start; \
         every restart would too), so the run stops: {what}{hint}"
    )
}

/// Sleeps `d`, checking every 250 ms that no consumer refused its settings.
async fn sleep_watching(
    fleet: &tokio::sync::Mutex<Fleet>,
    delivery: Delivery,
    d: Duration,
) -> anyhow::Result<()> {
    let until = Instant::now() + d;
    loop {
        refused(fleet, delivery).await?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        tokio::time::sleep(left.min(Duration::from_millis(250))).await;
    }
}

fn load_promos(dir: &std::path::Path) -> anyhow::Result<Vec<workload::Promo>> {
    Ok(serde_json::from_slice(&std::fs::read(
        dir.join("promotions.json"),
    )?)?)
}
