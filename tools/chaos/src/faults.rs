//! The fault schedule and how each fault is done. Faults happen one at a
//! time, at random moments of the production window (a fault that is due
//! while another runs starts right after it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use deductor_testkit::rng::Rng;
use serde::Serialize;
use tokio::sync::Mutex;

use crate::fleet::Fleet;

/// How many bytes of writes a stalled primary must take before the
/// failover fault kills it (about 15-25 decisions): fewer, and the control
/// run without the durability gate may have nothing to lose.
const FAILOVER_MIN_UNREPLICATED: u64 = 8 * 1024;
use crate::stack::{Broker, Cut, Redis};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// SIGKILL a consumer, restart it.
    ConsumerKill,
    /// SIGSTOP a consumer past the session timeout, then SIGCONT.
    Zombie,
    /// A consumer leaves (SIGTERM) and comes back, or an extra one joins and leaves.
    Rebalance,
    /// SIGKILL Redis, restart it from its AOF (empty script cache).
    RedisKill,
    /// SIGKILL the broker, restart it.
    BrokerKill,
    /// Redis's port cut inside its network namespace (drop or reset).
    RedisCut,
    /// The broker's port cut on the loopback.
    BrokerCut,
    /// SIGSTOP Redis, SIGKILL a consumer while its scripts are pending, SIGCONT.
    RedisStall,
    /// SIGSTOP the broker, SIGKILL a consumer while its outcomes and commits
    /// are unacknowledged, SIGCONT.
    BrokerStall,
    /// An operator changes a live promotion with `deductor promo`: pause
    /// and resume, adjust, or a forced re-seed (in turn).
    Operator,
    /// A promotion's budget or stock made corrupt during a burst, a
    /// consumer frozen with events in flight, the data repaired while it is
    /// a zombie.
    Corruption,
    /// The replica's link stalled while events flow, the primary SIGKILLed,
    /// the replica promoted by Sentinel (with --failovers only).
    Failover,
    /// Redis out of memory: `maxmemory` squeezed below what it uses
    /// (`noeviction`: every script write refused with OOM) during a burst,
    /// then released.
    RedisOom,
    /// A Cluster reshard: the hot promotion's slot, with its keys, moved to
    /// another primary while events flow (with --cluster only).
    SlotMigration,
    /// A primary and its replica added to the Cluster, and slots with their
    /// keys rebalanced onto it while events flow (with --cluster only).
    NodeAdd,
    /// --brokers3: the broker that coordinates the group (or, in
    /// exactly_once, a consumer's transactions) SIGKILLed, restarted 5 to
    /// 15 s later.
    CoordinatorKill,
    /// --brokers3: the leader of every partition of the input and the
    /// outcome topic moved to another in-sync replica while events flow.
    LeaderMove,
    /// --brokers3: one broker frozen (SIGSTOP) for 2 to 8 s, then SIGCONT
    /// (past 4 s the controller fences it and its leaderships move).
    BrokerFreeze,
}

/// How many of each kind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    pub consumer_kills: usize,
    pub zombies: usize,
    pub rebalances: usize,
    pub redis_kills: usize,
    pub broker_kills: usize,
    pub redis_cuts: usize,
    pub broker_cuts: usize,
    pub redis_stalls: usize,
    pub broker_stalls: usize,
    pub operator_changes: usize,
    pub corruptions: usize,
    pub failovers: usize,
    pub redis_ooms: usize,
    pub slot_migrations: usize,
    pub node_adds: usize,
    pub coordinator_kills: usize,
    pub leader_moves: usize,
    pub broker_freezes: usize,
}

/// Random moments in [5%, 90%] of `window` ([5%, 50%] for the operator
/// faults and corruptions), sorted.
pub fn schedule(c: &Counts, window: Duration, rng: &mut Rng) -> Vec<(Duration, Kind)> {
    let mut out = Vec::new();
    for (n, kind) in [
        (c.consumer_kills, Kind::ConsumerKill),
        (c.zombies, Kind::Zombie),
        (c.rebalances, Kind::Rebalance),
        (c.redis_kills, Kind::RedisKill),
        (c.broker_kills, Kind::BrokerKill),
        (c.redis_cuts, Kind::RedisCut),
        (c.broker_cuts, Kind::BrokerCut),
        (c.redis_stalls, Kind::RedisStall),
        (c.broker_stalls, Kind::BrokerStall),
        (c.operator_changes, Kind::Operator),
        (c.corruptions, Kind::Corruption),
        (c.failovers, Kind::Failover),
        (c.redis_ooms, Kind::RedisOom),
        (c.slot_migrations, Kind::SlotMigration),
        (c.node_adds, Kind::NodeAdd),
        (c.coordinator_kills, Kind::CoordinatorKill),
        (c.leader_moves, Kind::LeaderMove),
        (c.broker_freezes, Kind::BrokerFreeze),
    ] {
        // Faults run one at a time and the late ones slip past the end of
        // the production; the operator faults and corruptions need events
        // flowing to mean anything, so they come in the first half.
        let span = match kind {
            Kind::Operator | Kind::Corruption | Kind::SlotMigration | Kind::NodeAdd => 0.45,
            _ => 0.85,
        };
        for _ in 0..n {
            let f = 0.05 + span * (rng.range(0, 1_000_000) as f64 / 1_000_000.0);
            out.push((window.mul_f64(f), kind));
        }
    }
    out.sort_by_key(|(at, _)| *at);
    out
}

/// One fault as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct Done {
    pub at_s: f64,
    pub kind: Kind,
    pub detail: String,
    pub took_s: f64,
}

pub struct Env {
    pub fleet: Arc<Mutex<Fleet>>,
    pub redis: Arc<std::sync::Mutex<Redis>>,
    pub broker: Broker,
    pub session_timeout: Duration,
    pub started: Instant,
    pub production: Arc<crate::kafka::Production>,
    /// Longest wait for the next burst.
    pub burst_period: Duration,
    pub operator: Arc<crate::operator::Operator>,
    /// The replicated Redis of a run with failovers.
    pub replicated: Option<Arc<Mutex<crate::replicated::Topology>>>,
    /// Where the faults that take Redis away are marked, for the auditor.
    pub disturbances: Arc<crate::auditor::Disturbances>,
    /// The 3-node cluster of a --brokers3 run.
    pub cluster: Option<Arc<Target>>,
}

/// A --brokers3 run's cluster and what its faults aim at.
pub struct Target {
    pub cluster: crate::stack::Cluster3,
    pub group: String,
    pub input_topic: String,
    pub outcome_topic: String,
    /// exactly_once: the coordinator kills alternate between the
    /// transaction coordinator of a consumer and the group's.
    pub exactly_once: bool,
}

const GROUP_COORDINATORS: &str = "__consumer_offsets";
const TRANSACTION_COORDINATORS: &str = "__transaction_state";

/// The `transactional.id` a running consumer logged at its start
/// ("exactly_once: transactions started"), if any.
async fn running_transactional_id(env: &Env, rng: &mut Rng) -> Option<(usize, String)> {
    let f = env.fleet.lock().await;
    let mut running = f.running();
    while !running.is_empty() {
        let i = running.swap_remove(rng.below(running.len()));
        let text = std::fs::read_to_string(f.log_of(i)).unwrap_or_default();
        let needle = "\"transactional_id\":\"";
        if let Some(at) = text.find(needle) {
            let rest = &text[at + needle.len()..];
            if let Some(end) = rest.find('"') {
                return Some((i, rest[..end].to_owned()));
            }
        }
    }
    None
}

/// The coordinator of the group, and in exactly_once mode (every other
/// time) of a running consumer's transactional id, SIGKILLed and restarted
/// 5 to 15 s later.
async fn coordinator_kill(
    env: &Env,
    t: &Target,
    rng: &mut Rng,
    n: usize,
) -> anyhow::Result<String> {
    let brokers = t.cluster.brokers.clone();
    let group_node = {
        let (b, g) = (brokers.clone(), t.group.clone());
        blocking(move || crate::kafka::coordinator(&b, GROUP_COORDINATORS, &g))?
    };
    let mut what = format!("group coordinator (of {})", t.group);
    let mut node = group_node;
    if t.exactly_once && n % 2 == 0 {
        if let Some((i, id)) = running_transactional_id(env, rng).await {
            let b = brokers.clone();
            let idc = id.clone();
            let tx_node =
                blocking(move || crate::kafka::coordinator(&b, TRANSACTION_COORDINATORS, &idc))?;
            what = format!(
                "transaction coordinator of consumer {i} ({id}){}",
                if tx_node == group_node {
                    ", also the group coordinator"
                } else {
                    ""
                }
            );
            node = tx_node;
        } else {
            what.push_str(" (no consumer's transactional id found)");
        }
    }
    blocking(|| t.cluster.kill(node))?;
    let down = pause(rng, 5_000, 15_000).await;
    let t0 = Instant::now();
    blocking(|| t.cluster.start(node))?;
    Ok(format!(
        "broker {node}, the {what}, SIGKILLed, restarted after {down} ms (back in {:.1} s)",
        t0.elapsed().as_secs_f64()
    ))
}

/// One broker frozen for 2 to 8 s: in turn the group's coordinator and a
/// random one.
async fn broker_freeze(env: &Env, t: &Target, rng: &mut Rng, n: usize) -> anyhow::Result<String> {
    let _ = env;
    let node = if n % 2 == 0 {
        let (b, g) = (t.cluster.brokers.clone(), t.group.clone());
        blocking(move || crate::kafka::coordinator(&b, GROUP_COORDINATORS, &g))?
    } else {
        crate::stack::Cluster3::NODES[rng.below(3)]
    };
    t.cluster.pause(node)?;
    let held = pause(rng, 2_000, 8_000).await;
    t.cluster.resume(node)?;
    Ok(format!(
        "broker {node}{} SIGSTOPped for {held} ms, then SIGCONT",
        if n % 2 == 0 {
            " (the group coordinator)"
        } else {
            ""
        }
    ))
}

/// Corrupt data met by a zombie. A limited promotion's budget or stock is
/// overwritten with a non-canonical value just before a burst, so the
/// burst's lines on it are rejected `corrupt_promotion` (and remembered);
/// 20 to 250 ms after the first such rejection (Redis's count of CORRUPT
/// replies rises; at most 10 s), within the commit interval, a running
/// consumer is frozen (SIGSTOP) with events decided but not committed, and the data is repaired 0.1 to 0.8 s later, while it
/// is frozen. Its events are then redelivered to the others and run on the
/// repaired promotion, where they must repeat the decisions already made;
/// the zombie is thawed 2 to 5 s past the session timeout and may publish
/// its own late outcomes.
async fn corruption(env: &Env, rng: &mut Rng) -> anyhow::Result<String> {
    let Some(c) = env.operator.corrupt(rng).await? else {
        return Ok("no limited promotion: skipped".to_owned());
    };
    let t = Instant::now();
    let met_so_far = || async { env.fleet.lock().await.corrupt_lines(&c.promo) };
    let before = met_so_far().await;
    next_burst(env).await;
    // Until events meet the corrupt field, at most 10 s: the consumers may
    // be rebalancing. The consumers' logs say when (Redis's count of
    // CORRUPT error replies, read here before, misses every batched line:
    // a batch answers a corrupt line inside its reply, so no corruption
    // ever saw one, and each froze a consumer 10 s late, after the events
    // that met it were committed).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut met = 0;
    while Instant::now() < deadline {
        met = met_so_far().await.saturating_sub(before);
        if met > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Within the consumers' commit interval (500 ms): some of the events
    // are decided and published, their offsets not yet committed.
    pause(rng, 20, 250).await;
    let zombie = pick_running(env, rng, Fleet::freeze).await;
    let frozen_at = Instant::now();
    pause(rng, 100, 800).await;
    let met_by_repair = met_so_far().await.saturating_sub(before);
    let what = format!(
        "promo {} {} = {:?} for {} ms, met {met_by_repair} times ({met} before the freeze)",
        c.promo,
        c.field,
        c.value,
        t.elapsed().as_millis()
    );
    env.operator.repair(c).await?;
    let Some(i) = zombie else {
        return Ok(format!("{what}; no running consumer to freeze"));
    };
    let frozen = env.session_timeout + Duration::from_millis(rng.range(2_000, 5_000));
    if let Some(left) = frozen.checked_sub(frozen_at.elapsed()) {
        tokio::time::sleep(left).await;
    }
    env.fleet.lock().await.thaw(i);
    Ok(format!(
        "{what}; consumer {i} SIGSTOPped meanwhile, SIGCONT after {} ms",
        frozen_at.elapsed().as_millis()
    ))
}

/// Waits for the next burst of events and a little more, so that the fault
/// lands while the consumers have events in flight (no wait once the
/// production is over).
async fn busy_moment(env: &Env, rng: &mut Rng) {
    next_burst(env).await;
    pause(rng, 20, 300).await;
}

/// Waits until the next burst of events starts (at most two burst periods;
/// no wait once the production is over); returns the milliseconds waited.
async fn next_burst(env: &Env) -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    let started = Instant::now();
    let seen = env.production.bursts.load(Relaxed);
    let deadline = started + env.burst_period * 2;
    while env.production.bursts.load(Relaxed) == seen
        && !env.production.done.load(Relaxed)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed().as_millis() as u64
}

async fn pause(rng: &mut Rng, lo_ms: u64, hi_ms: u64) -> u64 {
    let ms = rng.range(lo_ms, hi_ms);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    ms
}

/// Waits until slot `i` has exited after a SIGTERM (the monitor reaps it).
async fn wait_left(env: &Env, i: usize, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if env.fleet.lock().await.is_off(i) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Picks a running consumer at random and applies `act` to it (under the
/// fleet's lock); `None` when none runs.
async fn pick_running(env: &Env, rng: &mut Rng, act: fn(&mut Fleet, usize)) -> Option<usize> {
    let mut f = env.fleet.lock().await;
    let running = f.running();
    if running.is_empty() {
        return None;
    }
    let i = running[rng.below(running.len())];
    act(&mut f, i);
    Some(i)
}

/// A Redis stall. A consumer handles a burst in milliseconds, so a fault
/// timed by the bursts mostly finds nothing in flight; here Redis is frozen
/// first (SIGSTOP: connections stay open, nothing is answered), then the
/// next burst arrives and its events start and stay pending on their
/// scripts. 1.5 to 2.2 s later (three commit intervals of the chaos
/// consumers at least, so that an offset marked done too early is
/// committed) the running consumer started longest ago is SIGKILLed with
/// those events in flight;
/// Redis is thawed 0.3 to 1 s later (it then runs the dead consumer's
/// pending scripts) and the consumer restarted 0.2 to 1 s after that.
async fn redis_stall(env: &Env, rng: &mut Rng) -> anyhow::Result<String> {
    let redis = || env.redis.lock().expect("redis lock");
    redis().pause()?;
    let waited = next_burst(env).await;
    let before = pause(rng, 1_500, 2_200).await;
    let pick = kill_oldest(env).await;
    let after = pause(rng, 300, 1_000).await;
    redis().resume()?;
    let frozen = waited + before + after;
    let Some(i) = pick else {
        return Ok(format!(
            "redis SIGSTOPped for {frozen} ms; no running consumer to kill"
        ));
    };
    let down = pause(rng, 200, 1_000).await;
    env.fleet.lock().await.spawn(i)?;
    Ok(format!(
        "redis SIGSTOPped for {frozen} ms (next burst after {waited} ms); consumer {i} SIGKILLed {before} ms after the burst, restarted {down} ms after SIGCONT"
    ))
}

/// A broker stall with outcomes in flight. Redis is frozen until the next
/// burst's events are pending on it (0.3 to 0.6 s after the burst starts),
/// then the broker is frozen and Redis thawed: the scripts complete and
/// their outcomes (and the offset commits) wait on the broker. 1.7 to 2.2 s
/// later, past the consumers' produce timeout (1.5 s), so that the
/// outcomes queued meanwhile have failed and must be sent again, the
/// running consumer started longest ago is SIGKILLed; the broker is
/// thawed 0.3 to 1 s later and the consumer restarted. The broker is frozen at most 3.2 s, so the group's
/// sessions (6 s, heartbeats every 1.5 s) survive its frozen clock and the
/// commits sent meanwhile are accepted after it.
async fn broker_stall(env: &Env, rng: &mut Rng) -> anyhow::Result<String> {
    let redis = || env.redis.lock().expect("redis lock");
    redis().pause()?;
    let waited = next_burst(env).await;
    let fetched = pause(rng, 300, 600).await;
    if let Err(e) = env.broker.pause() {
        let _ = redis().resume();
        return Err(e);
    }
    redis().resume()?;
    let before = pause(rng, 1_700, 2_200).await;
    let pick = kill_oldest(env).await;
    let after = pause(rng, 300, 1_000).await;
    env.broker.resume()?;
    let frozen = before + after;
    let Some(i) = pick else {
        return Ok(format!(
            "broker SIGSTOPped for {frozen} ms; no running consumer to kill"
        ));
    };
    let down = pause(rng, 200, 1_000).await;
    env.fleet.lock().await.spawn(i)?;
    Ok(format!(
        "redis SIGSTOPped for {} ms (next burst after {waited} ms), then broker SIGSTOPped for {frozen} ms; consumer {i} SIGKILLed {before} ms into it, restarted {down} ms after SIGCONT",
        waited + fetched
    ))
}

/// The hash of a seeded promotion, one with a limit when there is one (the
/// workload's hot promotions are limited), picked at random.
fn hot_key(env: &Env, rng: &mut Rng) -> anyhow::Result<String> {
    let promos = &env.operator.promos;
    let limited: Vec<&crate::workload::Promo> = promos
        .iter()
        .filter(|p| p.seeded && (p.stock.is_some() || p.budget.is_some()))
        .collect();
    let pool: Vec<&crate::workload::Promo> = if limited.is_empty() {
        promos.iter().filter(|p| p.seeded).collect()
    } else {
        limited
    };
    anyhow::ensure!(!pool.is_empty(), "no seeded promotion");
    let p = pool[rng.below(pool.len())];
    let id = deductor::domain::event::Id::parse(&p.id)
        .map_err(|e| anyhow::anyhow!("promotion id {:?}: {e}", p.id))?;
    Ok(deductor::domain::keys::Keys::new(env.operator.key_prefix.clone()).promotion(&id))
}

/// Redis out of memory during a burst: `maxmemory` set to 1 byte
/// (`noeviction`, the dev stack's policy: every script write is refused
/// with OOM; reads still answer), held 2 to 6 s while the next burst's
/// events are refused and retried, then released (0: no limit). The
/// consumers must wait (no outcome for a refused event, no exit) and decide
/// each event once afterwards. Redis's own count of OOM replies says
/// whether the squeeze met events.
async fn redis_oom(env: &Env, rng: &mut Rng) -> anyhow::Result<String> {
    let cli = |args: &[&str]| blocking(|| env.redis.lock().expect("redis lock").cli(args));
    let ooms = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("errorstat_OOM:count="))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let before = ooms(cli(&["INFO", "errorstats"]));
    let policy = cli(&["CONFIG", "GET", "maxmemory-policy"]);
    anyhow::ensure!(
        policy.lines().nth(1) == Some("noeviction"),
        "the OOM fault needs maxmemory-policy noeviction, the server has {policy:?}"
    );
    let set = cli(&["CONFIG", "SET", "maxmemory", "1"]);
    anyhow::ensure!(set == "OK", "CONFIG SET maxmemory 1: {set:?}");
    let waited = next_burst(env).await;
    let held = pause(rng, 2_000, 6_000).await;
    let reset = cli(&["CONFIG", "SET", "maxmemory", "0"]);
    anyhow::ensure!(reset == "OK", "CONFIG SET maxmemory 0: {reset:?}");
    let met = ooms(cli(&["INFO", "errorstats"])).saturating_sub(before);
    Ok(format!(
        "redis maxmemory squeezed to 1 byte for {} ms (next burst after {waited} ms): {met} OOM replies, then released",
        waited + held
    ))
}

/// SIGKILLs the running consumer started longest ago (the stalls: a
/// consumer with partitions, so with events in flight); `None` when none runs.
async fn kill_oldest(env: &Env) -> Option<usize> {
    let mut f = env.fleet.lock().await;
    let i = f.oldest_running()?;
    f.kill(i);
    Some(i)
}

/// Does one fault; returns what was done.
pub async fn inject(kind: Kind, env: &Env, rng: &mut Rng, n: usize) -> anyhow::Result<Done> {
    // The stalls time themselves on the next burst.
    if !matches!(
        kind,
        Kind::RedisStall | Kind::BrokerStall | Kind::Corruption | Kind::Failover | Kind::RedisOom
    ) {
        busy_moment(env, rng).await;
    }
    let at = env.started.elapsed();
    let t0 = Instant::now();
    // Redis away (down, cut, frozen, failing over) from here to the end of
    // the fault: an audit meanwhile may find it unreachable.
    let redis_away = matches!(
        kind,
        Kind::RedisKill
            | Kind::RedisCut
            | Kind::RedisStall
            | Kind::BrokerStall
            | Kind::Failover
            | Kind::SlotMigration
            | Kind::NodeAdd
    )
    .then(|| env.disturbances.redis_fault_begins());
    let detail = match kind {
        Kind::ConsumerKill => {
            let pick = pick_running(env, rng, Fleet::kill).await;
            match pick {
                Some(i) => {
                    let down = pause(rng, 200, 2_000).await;
                    env.fleet.lock().await.spawn(i)?;
                    format!("consumer {i} SIGKILLed, restarted after {down} ms")
                }
                None => "no running consumer: skipped".to_owned(),
            }
        }
        Kind::Zombie => {
            let pick = pick_running(env, rng, Fleet::freeze).await;
            match pick {
                Some(i) => {
                    let extra = rng.range(2_000, 5_000);
                    let frozen = env.session_timeout + Duration::from_millis(extra);
                    tokio::time::sleep(frozen).await;
                    env.fleet.lock().await.thaw(i);
                    format!(
                        "consumer {i} SIGSTOPped for {} ms, then SIGCONT",
                        frozen.as_millis()
                    )
                }
                None => "no running consumer: skipped".to_owned(),
            }
        }
        Kind::Rebalance => {
            if n % 2 == 0 {
                // A member leaves gracefully and comes back.
                let pick = pick_running(env, rng, Fleet::terminate).await;
                match pick {
                    Some(i) => {
                        let left = wait_left(env, i, Duration::from_secs(60)).await;
                        let away = pause(rng, 1_000, 3_000).await;
                        let mut f = env.fleet.lock().await;
                        if !left {
                            f.kill(i);
                        }
                        f.spawn(i)?;
                        format!(
                            "consumer {i} left (SIGTERM){}, rejoined after {away} ms",
                            if left {
                                ""
                            } else {
                                " but did not exit in 60 s: SIGKILLed"
                            }
                        )
                    }
                    None => "no running consumer: skipped".to_owned(),
                }
            } else {
                // An extra member joins, stays a while, leaves.
                let i = {
                    let mut f = env.fleet.lock().await;
                    let i = f.len();
                    f.spawn(i)?;
                    i
                };
                let stay = pause(rng, 3_000, 8_000).await;
                env.fleet.lock().await.terminate(i);
                let left = wait_left(env, i, Duration::from_secs(60)).await;
                if !left {
                    env.fleet.lock().await.kill(i);
                }
                format!(
                    "extra consumer {i} joined, left after {stay} ms{}",
                    if left {
                        ""
                    } else {
                        " (SIGKILLed: no exit in 60 s)"
                    }
                )
            }
        }
        Kind::RedisKill => {
            blocking(|| env.redis.lock().expect("redis lock").kill());
            let down = pause(rng, 500, 3_000).await;
            blocking(|| {
                let mut r = env.redis.lock().expect("redis lock");
                r.restarts += 1;
                r.start()
            })?;
            format!("redis SIGKILLed, restarted from its AOF after {down} ms")
        }
        Kind::BrokerKill => {
            blocking(|| env.broker.kill())?;
            let down = pause(rng, 1_000, 4_000).await;
            blocking(|| env.broker.start())?;
            format!("broker SIGKILLed, restarted after {down} ms (+ its start time)")
        }
        Kind::RedisCut => {
            let how = if n % 2 == 0 { Cut::Drop } else { Cut::Reset };
            let (port, netns) = {
                let r = env.redis.lock().expect("redis lock");
                (r.port, r.netns().cloned())
            };
            let Some(ns) = netns else {
                anyhow::bail!("redis cut needs --netns")
            };
            ns.cut(port, how)?;
            let held = pause(rng, 3_000, 8_000).await;
            ns.heal()?;
            format!(
                "redis port {port} cut ({}) in netns {} for {held} ms",
                how.as_str(),
                ns.name
            )
        }
        Kind::RedisStall => redis_stall(env, rng).await?,
        Kind::Operator => {
            let hold = Duration::from_millis(rng.range(1_000, 3_000));
            env.operator.live_change(rng, n, hold).await?
        }
        Kind::Corruption => corruption(env, rng).await?,
        Kind::Failover => {
            let Some(set) = &env.replicated else {
                anyhow::bail!("a failover needs --failovers' replicated Redis")
            };
            // Like the stalls: the link stalls first, then the next burst
            // arrives, so the primary takes writes its replica lacks.
            let mut set = set.lock().await;
            let stalled = set.stall(rng.below(3)).await?;
            next_burst(env).await;
            pause(rng, 300, 1_000).await;
            // The fault has teeth only if the primary took writes its
            // replica lacks: consumers that are rebalancing or restarting
            // may not have written yet, so wait for them (bounded), then
            // give the outcomes of those writes a moment to go out.
            let deadline = Instant::now() + Duration::from_secs(15);
            while set.unreplicated() < FAILOVER_MIN_UNREPLICATED && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let unreplicated = set.unreplicated();
            pause(rng, 200, 600).await;
            format!(
                "{}; {unreplicated} bytes unreplicated when killed",
                set.fail_over(stalled).await?
            )
        }
        Kind::BrokerStall => broker_stall(env, rng).await?,
        Kind::RedisOom => redis_oom(env, rng).await?,
        Kind::SlotMigration => {
            let Some(set) = &env.replicated else {
                anyhow::bail!("a slot migration needs --cluster")
            };
            let key = hot_key(env, rng)?;
            let hold = Duration::from_millis(rng.range(3_000, 8_000));
            let mut set = set.lock().await;
            let Some(c) = set.cluster() else {
                anyhow::bail!("a slot migration needs --cluster")
            };
            c.migrate_slot(&key, hold, 10).await?
        }
        Kind::NodeAdd => {
            let Some(set) = &env.replicated else {
                anyhow::bail!("a node add needs --cluster")
            };
            let mut set = set.lock().await;
            let Some(c) = set.cluster() else {
                anyhow::bail!("a node add needs --cluster")
            };
            c.add_node().await?
        }
        Kind::CoordinatorKill | Kind::LeaderMove | Kind::BrokerFreeze => {
            let Some(t) = env.cluster.clone() else {
                anyhow::bail!("{kind:?} needs --brokers3")
            };
            match kind {
                Kind::CoordinatorKill => coordinator_kill(env, &t, rng, n).await?,
                Kind::BrokerFreeze => broker_freeze(env, &t, rng, n).await?,
                _ => {
                    let moved = blocking(|| {
                        t.cluster
                            .move_leaders(&[t.input_topic.as_str(), t.outcome_topic.as_str()])
                    })?;
                    format!(
                        "leaders of {} and {}: {moved}",
                        t.input_topic, t.outcome_topic
                    )
                }
            }
        }
        Kind::BrokerCut => {
            env.broker.cut()?;
            let held = pause(rng, 3_000, 8_000).await;
            env.broker.heal()?;
            format!(
                "broker port {} dropped on lo for {held} ms",
                env.broker.port
            )
        }
    };
    if let Some(i) = redis_away {
        env.disturbances.redis_fault_ends(i);
    }
    Ok(Done {
        at_s: at.as_secs_f64(),
        kind,
        detail,
        took_s: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_has_every_fault_asked_for_within_the_window() {
        let c = Counts {
            consumer_kills: 3,
            redis_stalls: 2,
            broker_stalls: 4,
            ..Counts::default()
        };
        let window = Duration::from_secs(70);
        let plan = schedule(&c, window, &mut Rng::new(7));
        let count = |k: Kind| plan.iter().filter(|(_, kind)| *kind == k).count();
        assert_eq!(count(Kind::ConsumerKill), 3);
        assert_eq!(count(Kind::RedisStall), 2);
        assert_eq!(count(Kind::BrokerStall), 4);
        assert_eq!(plan.len(), 9);
        assert!(plan.windows(2).all(|w| w[0].0 <= w[1].0), "sorted");
        assert!(plan
            .iter()
            .all(|(at, _)| *at >= window.mul_f64(0.05) && *at <= window.mul_f64(0.9)));
        let c = Counts {
            operator_changes: 20,
            corruptions: 20,
            ..Counts::default()
        };
        let plan = schedule(&c, window, &mut Rng::new(9));
        assert_eq!(plan.len(), 40);
        assert!(plan.iter().all(|(at, _)| *at <= window.mul_f64(0.5)));
    }
}
