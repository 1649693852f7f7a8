//! Issue 28, first part: the bucket protocol of docs/buckets.md as a model,
//! checked before any Lua is written. One hot promotion split into K
//! buckets; placements, refunds and operator transfers run as deliveries
//! of atomic per-bucket steps (`protocol`), interleaved at random by a
//! scheduler that also crashes deliveries at any step (the event is then
//! delivered again) and starts zombie deliveries (a second delivery of an
//! event while the first still runs).
//!
//! After every step: no bucket below zero, units conserved (in buckets, in
//! transit, deducted), the per-customer limit held across buckets. At every
//! "short" rejection: at some instant of that delivery's life, the whole
//! promotion (every bucket plus every unit in transit) could not cover the
//! line (no false sold-out). At the end: every event decided once (every
//! delivery agrees), nothing in transit, every bound true, and a fresh
//! one-unit line from any home bucket is accepted while a unit is left
//! (nothing stranded).
//!
//! Pure: no Redis here. Cases: `PROPTEST_CASES` (default 3,000).
//! Each mutant of the protocol (`Mutant`) must make the same property fail.

mod protocol;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use protocol::*;

#[derive(Clone, Debug)]
enum Act {
    Place { cust: Cust, units: i64 },
    Refund { order: usize, wrong: bool },
    Transfer { from: usize, to: usize, n: i64 },
}

#[derive(Clone, Debug)]
struct Case {
    k: usize,
    stock: i64,
    limit: Option<u32>,
    acts: Vec<Act>,
    /// (which live delivery steps, what befalls it): 0 crash, 1 zombie,
    /// else a step.
    ticks: Vec<(u8, u8)>,
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        6 => (0u32..5, 1i64..=3).prop_map(|(cust, units)| Act::Place { cust, units }),
        2 => (0usize..16, any::<bool>()).prop_map(|(order, wrong)| Act::Refund { order, wrong }),
        3 => (0usize..3, 0usize..3, 1i64..=3).prop_map(|(from, to, n)| Act::Transfer { from, to, n }),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![1 => Just(1usize), 2 => Just(2), 5 => Just(3)],
        0i64..=9,
        prop_oneof![1 => Just(None), 4 => (1u32..=2).prop_map(Some)],
        prop::collection::vec(act(), 4..=14),
        prop::collection::vec((any::<u8>(), 0u8..10), 40..=200),
    )
        .prop_map(|(k, stock, limit, acts, ticks)| Case {
            k,
            stock,
            limit,
            acts,
            ticks,
        })
}

#[derive(Clone, Debug)]
enum Run {
    Place(Place),
    Refund(RefundRun),
    Transfer(Transfer),
}

impl Run {
    fn step(&mut self, l: &mut Ledger) -> Report {
        match self {
            Run::Place(p) => p.step(l),
            Run::Refund(r) => r.step(l),
            Run::Transfer(t) => match t.step(l) {
                Some(()) => Report::Done(Outcome::Moved),
                None => Report::Running,
            },
        }
    }
}

struct Live {
    /// A serial number of the delivery.
    id: u64,
    act: usize,
    run: Run,
    started: bool,
    /// The least strict total seen since this delivery's first step.
    min_total: i64,
}

thread_local! {
    /// Print every step (set to replay a failing case).
    static TRACE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

static CASES: AtomicU64 = AtomicU64::new(0);
static STEPS: AtomicU64 = AtomicU64::new(0);
static CRASHES: AtomicU64 = AtomicU64::new(0);
static ZOMBIES: AtomicU64 = AtomicU64::new(0);
static GATHERED: AtomicU64 = AtomicU64::new(0);
static FAST_SHORT: AtomicU64 = AtomicU64::new(0);
static SLOW_SHORT: AtomicU64 = AtomicU64::new(0);
static RESTARTS: AtomicU64 = AtomicU64::new(0);
static TRANSFERS: AtomicU64 = AtomicU64::new(0);
static REFUNDS_APPLIED: AtomicU64 = AtomicU64::new(0);

fn ev(act: usize) -> Ev {
    act as Ev + 1
}

/// The order a refund act names: a placement's, or one never placed.
fn refund_target(acts: &[Act], i: usize, order: usize, wrong: bool) -> (Ev, Cust) {
    let o = order % acts.len();
    match acts[o] {
        Act::Place { cust, .. } => (ev(o), if wrong { (cust + 1) % 5 } else { cust }),
        _ => (1_000 + i as Ev, 0),
    }
}

fn delivery(c: &Case, i: usize) -> Option<Run> {
    Some(match c.acts[i] {
        Act::Place { cust, units } => Run::Place(Place::new(ev(i), cust, units, c.k)),
        Act::Refund { order, wrong } => {
            let (o, named) = refund_target(&c.acts, i, order, wrong);
            Run::Refund(RefundRun::new(ev(i), o, named))
        }
        Act::Transfer { from, to, n } => {
            let (from, to) = (from % c.k, to % c.k);
            if from == to {
                return None;
            }
            Run::Transfer(Transfer::new(ev(i), from, to, n))
        }
    })
}

fn check_step(l: &Ledger) -> Result<(), TestCaseError> {
    for (j, b) in l.b.iter().enumerate() {
        prop_assert!(b.avail >= 0, "bucket {j} below zero: {b:?}");
        prop_assert!(b.held >= 0, "bucket {j} held below zero: {b:?}");
        prop_assert!(b.tentative >= 0, "bucket {j} tentative below zero: {b:?}");
    }
    let transit: i64 = l.transit.values().sum();
    let avail: i64 = l.b.iter().map(|b| b.avail).sum();
    let tentative: i64 = l.b.iter().map(|b| b.tentative).sum();
    prop_assert_eq!(
        avail + tentative + transit + l.deducted(),
        l.initial,
        "units not conserved: avail {} tentative {} transit {} deducted {}",
        avail,
        tentative,
        transit,
        l.deducted()
    );
    // Per customer: deductions (settled), reservations, the used counter.
    let mut per_customer: BTreeMap<Cust, (BTreeSet<Ev>, BTreeSet<Ev>, u32)> = BTreeMap::new();
    for (j, b) in l.b.iter().enumerate() {
        for (o, r) in &b.records {
            prop_assert_eq!(l.order_home(*o), j, "a record away from its order's bucket");
            if let Record::Deducted { customer, .. } = r {
                per_customer.entry(*customer).or_default().0.insert(*o);
            }
        }
        for (o, (c, held)) in &b.resv {
            prop_assert_eq!(
                l.home(*c),
                j,
                "a reservation away from its customer's bucket"
            );
            if *held {
                per_customer.entry(*c).or_default().1.insert(*o);
            }
        }
        for (c, u) in &b.used {
            per_customer.entry(*c).or_default().2 += u;
        }
    }
    for (c, (deducted, reserved, used)) in per_customer {
        prop_assert_eq!(reserved.len() as u32, used, "customer {}'s used counter", c);
        if let Some(limit) = l.limit {
            prop_assert!(used <= limit, "customer {c} over the limit: {used}");
            prop_assert!(
                deducted.is_subset(&reserved),
                "customer {c}: a deduction without a reservation: {deducted:?} / {reserved:?}"
            );
        }
    }
    Ok(())
}

/// At rest, every reservation belongs to a deduction that stands.
fn check_reservations(l: &Ledger) -> Result<(), TestCaseError> {
    if l.limit.is_none() {
        return Ok(());
    }
    let mut deducted = BTreeSet::new();
    let mut reserved = BTreeSet::new();
    for b in &l.b {
        for (o, r) in &b.records {
            if matches!(r, Record::Deducted { .. }) {
                deducted.insert(*o);
            }
        }
        reserved.extend(b.resv.iter().filter(|(_, r)| r.1).map(|(o, _)| *o));
    }
    prop_assert_eq!(deducted, reserved, "reservations left behind");
    Ok(())
}

fn decide(
    decisions: &mut BTreeMap<usize, Outcome>,
    act: usize,
    o: Outcome,
) -> Result<(), TestCaseError> {
    if let Some(first) = decisions.get(&act) {
        prop_assert_eq!(*first, o, "event {} decided twice, differently", ev(act));
    } else {
        decisions.insert(act, o);
    }
    Ok(())
}

fn run_case(c: &Case, mutant: Mutant) -> Result<(), TestCaseError> {
    let mut l = Ledger::new(c.k, c.stock, c.limit, mutant);
    let mut live: Vec<Live> = Vec::new();
    let mut released = 0usize;
    let mut crashes = vec![0u32; c.acts.len()];
    let mut zombies = vec![0u32; c.acts.len()];
    let mut decisions: BTreeMap<usize, Outcome> = BTreeMap::new();
    let mut serial = 0u64;
    let mut spawn = |live: &mut Vec<Live>, i: usize| {
        if let Some(run) = delivery(c, i) {
            serial += 1;
            live.push(Live {
                id: serial,
                act: i,
                run,
                started: false,
                min_total: i64::MAX,
            });
        }
    };
    // What the sweeper knows: the operator's transfers.
    let transfers: BTreeMap<Ev, (usize, usize, i64)> = c
        .acts
        .iter()
        .enumerate()
        .filter_map(|(i, a)| match a {
            Act::Transfer { from, to, n } if from % c.k != to % c.k => {
                Some((ev(i), (from % c.k, to % c.k, *n)))
            }
            _ => None,
        })
        .collect();
    let mut steps = 0u64;
    let mut tick = 0usize;
    // (delivery, steps left): a burst runs one delivery several steps in a
    // row, as a fast consumer does while another one stalls.
    let mut burst: Option<(u64, u8)> = None;
    loop {
        let (pick, fate) = c.ticks.get(tick).copied().unwrap_or((tick as u8, 9));
        let calm = tick >= c.ticks.len();
        tick += 1;
        if released < c.acts.len() && (tick % 3 == 1 || live.is_empty()) {
            spawn(&mut live, released);
            released += 1;
        }
        if live.is_empty() {
            if released == c.acts.len() {
                break;
            }
            continue;
        }
        // The service's sweeper runs now and then (gifts a crashed zombie
        // left after its event was decided hold units and block juniors
        // until it does).
        if tick % 20 == 0 {
            l.sweep(&transfers);
            check_step(&l)?;
        }
        prop_assert!(
            steps < 5_000,
            "no progress: a livelock; buckets {:?}; live {:?}",
            l.b.iter()
                .map(|b| (
                    b.avail,
                    b.held,
                    &b.pending,
                    b.gifts
                        .iter()
                        .filter(|(_, g)| matches!(g.0, Gift::Given(_)))
                        .collect::<Vec<_>>(),
                    &b.attempt
                ))
                .collect::<Vec<_>>(),
            live.iter().map(|x| &x.run).collect::<Vec<_>>()
        );
        let idx = match burst {
            Some((id, left)) if left > 0 => {
                burst = Some((id, left - 1));
                live.iter()
                    .position(|x| x.id == id)
                    .unwrap_or(pick as usize % live.len())
            }
            _ => pick as usize % live.len(),
        };
        if !calm && fate == 2 {
            burst = Some((live[idx].id, 3 + pick % 6));
        }
        let act = live[idx].act;
        if !calm && fate == 0 && crashes[act] < 3 {
            crashes[act] += 1;
            CRASHES.fetch_add(1, Ordering::Relaxed);
            live.swap_remove(idx);
            spawn(&mut live, act);
            continue;
        }
        if !calm && fate == 1 && zombies[act] < 2 {
            zombies[act] += 1;
            ZOMBIES.fetch_add(1, Ordering::Relaxed);
            spawn(&mut live, act);
        }
        let total = l.strict_total();
        let me = &mut live[idx];
        if !me.started {
            me.started = true;
            me.min_total = total;
        }
        steps += 1;
        let before = format!("{:?}", me.run);
        let report = me.run.step(&mut l);
        let total = l.strict_total();
        for other in live.iter_mut().filter(|x| x.started) {
            other.min_total = other.min_total.min(total);
        }
        if TRACE.with(|t| t.get()) {
            println!(
                "tick {tick} act {act}: {before}\n  -> {report:?}; buckets {:?}",
                l.b.iter()
                    .map(|b| (b.avail, b.held, b.incr, b.bound, &b.pending, &b.records))
                    .collect::<Vec<_>>()
            );
        }
        check_step(&l)?;
        let me = &live[idx];
        match report {
            Report::Running => {}
            Report::Short { fast } => {
                let Run::Place(p) = &me.run else {
                    unreachable!("only placements are short")
                };
                prop_assert!(
                    me.min_total < p.units,
                    "false sold-out: event {} ({} units) rejected short ({}) while the promotion held at least {} units throughout",
                    p.ev,
                    p.units,
                    if fast { "fast path" } else { "after a gather" },
                    me.min_total
                );
                if fast {
                    FAST_SHORT.fetch_add(1, Ordering::Relaxed);
                } else {
                    SLOW_SHORT.fetch_add(1, Ordering::Relaxed);
                }
                decide(&mut decisions, act, Outcome::Placed(Placed::Short))?;
                if !p.cleaning() {
                    live.swap_remove(idx);
                }
            }
            Report::Done(o) => {
                if let Run::Place(p) = &me.run {
                    RESTARTS.fetch_add(u64::from(p.restarts), Ordering::Relaxed);
                    if p.cleaning() {
                        GATHERED.fetch_add(1, Ordering::Relaxed);
                    }
                }
                match o {
                    Outcome::Moved => {
                        TRANSFERS.fetch_add(1, Ordering::Relaxed);
                    }
                    Outcome::Refund(Refund::Applied(_)) => {
                        REFUNDS_APPLIED.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
                if o != Outcome::Moved {
                    decide(&mut decisions, act, o)?;
                }
                live.swap_remove(idx);
            }
        }
    }
    STEPS.fetch_add(steps, Ordering::Relaxed);

    // Every placement and refund decided.
    for (i, a) in c.acts.iter().enumerate() {
        if !matches!(a, Act::Transfer { .. }) {
            prop_assert!(decisions.contains_key(&i), "event {} never decided", ev(i));
        }
    }
    // A refund that found no deduction leaves none to come.
    for (i, a) in c.acts.iter().enumerate() {
        if let Act::Refund { order, wrong } = a {
            let (o, _) = refund_target(&c.acts, i, *order, *wrong);
            if decisions.get(&i) == Some(&Outcome::Refund(Refund::NoDeduction)) {
                let placed = decisions.get(&(o as usize).wrapping_sub(1));
                prop_assert!(
                    !matches!(placed, Some(Outcome::Placed(Placed::Accepted(_)))),
                    "order {o} accepted although its refund {} found no deduction",
                    ev(i)
                );
            }
        }
    }

    // The sweeper settles what crashed deliveries left in transit.
    l.sweep(&transfers);
    check_step(&l)?;
    check_reservations(&l)?;
    prop_assert!(
        l.transit.is_empty(),
        "units left in transit: {:?}",
        l.transit
    );
    for (m, b) in l.b.iter().enumerate() {
        prop_assert_eq!(b.held, 0, "bucket {} still holds given units", m);
        prop_assert!(
            b.pending.is_empty(),
            "bucket {m} still marked: {:?}",
            b.pending
        );
        if let Some(bound) = b.bound {
            let others: i64 =
                l.b.iter()
                    .enumerate()
                    .filter(|(j, _)| *j != m)
                    .map(|(_, x)| x.avail)
                    .sum();
            prop_assert!(
                bound >= others,
                "bucket {m}'s bound {bound} is below the others' {others}"
            );
        }
    }
    // Nothing stranded: while a unit is left, a new one-unit line is
    // accepted from every home bucket.
    if l.strict_total() > 0 {
        for m in 0..c.k {
            let mut probe_ledger = l.clone();
            let cust = (1_000 * c.k + m) as Cust;
            let mut probe = Place::new(90_000, cust, 1, c.k);
            let mut n = 0;
            let outcome = loop {
                n += 1;
                prop_assert!(n < 1_000, "the probe did not finish");
                match probe.step(&mut probe_ledger) {
                    Report::Running => {}
                    Report::Short { .. } => break Placed::Short,
                    Report::Done(Outcome::Placed(p)) => break p,
                    Report::Done(o) => prop_assert!(false, "probe ended {o:?}"),
                }
            };
            prop_assert_eq!(
                outcome,
                Placed::Accepted(1),
                "a unit left ({} in all) but a line from bucket {} was not sold it",
                l.strict_total(),
                m
            );
        }
    }
    CASES.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn the_bucket_protocol_keeps_every_promise() {
    let mut runner = TestRunner::new(Config {
        cases: cases(3_000).max(3_000),
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&case(), |c| run_case(&c, Mutant::None));
    println!(
        "bucket protocol model: {} cases, {} steps, {} crashes, {} zombie deliveries, {} lines that gathered units, {} short by the fast path, {} short after a gather, {} gather restarts, {} transfers, {} refunds applied",
        CASES.load(Ordering::Relaxed),
        STEPS.load(Ordering::Relaxed),
        CRASHES.load(Ordering::Relaxed),
        ZOMBIES.load(Ordering::Relaxed),
        GATHERED.load(Ordering::Relaxed),
        FAST_SHORT.load(Ordering::Relaxed),
        SLOW_SHORT.load(Ordering::Relaxed),
        RESTARTS.load(Ordering::Relaxed),
        TRANSFERS.load(Ordering::Relaxed),
        REFUNDS_APPLIED.load(Ordering::Relaxed),
    );
    if let Err(e) = result {
        if let proptest::test_runner::TestError::Fail(_, c) = &e {
            TRACE.with(|t| t.set(true));
            let _ = run_case(c, Mutant::None);
        }
        panic!("{e}");
    }
}

/// Every piece of the protocol is needed: without it, the same property
/// fails.
#[test]
fn each_mutant_of_the_bucket_protocol_is_caught() {
    for mutant in [
        Mutant::NoShortMemo,
        Mutant::RejectIgnoresNotify,
        Mutant::NoPendingMark,
        Mutant::NoGiftMemo,
    ] {
        let mut runner = TestRunner::new(Config {
            cases: cases(3_000).max(30_000),
            failure_persistence: None,
            max_shrink_iters: 64,
            ..Config::default()
        });
        let result = runner.run(&case(), |c| run_case(&c, mutant));
        match result {
            Err(e) => println!("mutant {mutant:?} caught: {e}"),
            Ok(()) => panic!("mutant {mutant:?} escaped the bucket protocol model"),
        }
    }
}

/// The cost model behind docs/buckets.md's estimate: a flash sale run
/// through the protocol (one unit per line, one order per customer, 10%
/// refunds of earlier orders; one delivery at a time, then 16 in flight
/// interleaved at random), counting the calls each bucket serves. A measurement of the
/// design, not of Redis:
///
/// ```sh
/// cargo test --test it ledger::buckets::flash_sale_calls -- --ignored --nocapture
/// ```
#[test]
#[ignore = "a measurement of the protocol's calls, not a test"]
fn flash_sale_calls() {
    const LINES: u32 = 20_000;
    const STOCK: i64 = 2_000;

    for in_flight in [1usize, 16] {
        println!("\n{in_flight} in flight:\n");
        println!("| K | calls per event, all buckets | busiest bucket's calls per event | lines that gathered units | short by the fast path | short after a gather | restarts and polls | false sold-outs | units unsold at the end | unsold after one more line on each bucket |");
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for k in [1usize, 2, 3, 10, 30] {
            let mut rng = fastrand::Rng::with_seed(28);
            let mut l = Ledger::new(k, STOCK, Some(1), Mutant::None);
            let mut live: Vec<(Run, i64)> = Vec::new();
            let mut placed: Vec<(Ev, Cust)> = Vec::new();
            let (mut next, mut events) = (1 as Ev, 0u32);
            let (mut gathered, mut fast, mut slow, mut false_short) = (0u64, 0u64, 0u64, 0u64);
            let mut restarts = 0u64;
            while events < LINES || !live.is_empty() {
                while live.len() < in_flight && events < LINES {
                    events += 1;
                    let run = if !placed.is_empty() && rng.u8(0..10) == 0 {
                        let (o, c) = placed[rng.usize(0..placed.len())];
                        Run::Refund(RefundRun::new(next, o, c))
                    } else {
                        let c = rng.u32(0..50_000);
                        placed.push((next, c));
                        Run::Place(Place::new(next, c, 1, k))
                    };
                    next += 1;
                    live.push((run, l.strict_total()));
                }
                let i = rng.usize(0..live.len());
                // A delivery that backs off asks again after a while: here, on
                // one pick in eight.
                if matches!(&live[i].0, Run::Place(p) if p.waiting()) && rng.u8(0..8) != 0 {
                    continue;
                }
                let report = live[i].0.step(&mut l);
                let total = l.strict_total();
                for x in live.iter_mut() {
                    x.1 = x.1.min(total);
                }
                let done = match (&live[i].0, report) {
                    (_, Report::Running) => false,
                    (Run::Place(p), Report::Short { fast: f }) => {
                        if f {
                            fast += 1
                        } else {
                            slow += 1
                        }
                        if live[i].1 >= p.units {
                            false_short += 1;
                        }
                        restarts += u64::from(p.restarts);
                        !p.cleaning()
                    }
                    (Run::Place(p), Report::Done(_)) => {
                        if p.cleaning() {
                            gathered += 1;
                        }
                        restarts += u64::from(p.restarts);
                        true
                    }
                    _ => true,
                };
                if done {
                    live.swap_remove(i);
                }
            }
            let unsold = l.strict_total();
            // One more line from each bucket, alone: nothing may be stranded
            // where no line reaches.
            let mut sold = 0i64;
            for _ in 0..k {
                // Orders on every bucket in turn (the order picks the bucket).
                let mut probe = Place::new(next, 9_000_000 + next, 1, k);
                next += 1;
                let outcome = loop {
                    match probe.step(&mut l) {
                        Report::Running => {}
                        r => break r,
                    }
                };
                if outcome == Report::Done(Outcome::Placed(Placed::Accepted(1))) {
                    sold += 1;
                }
            }
            assert_eq!(sold, unsold.min(k as i64), "K={k}: units stranded");
            let calls: u64 = l.calls.iter().sum();
            let busiest = *l.calls.iter().max().unwrap_or(&0);
            let per = busiest as f64 / f64::from(LINES);
            println!(
            "| {k} | {:.2} | {per:.2} | {gathered} | {fast} | {slow} | {restarts} | {false_short} | {unsold} | {} |",
            calls as f64 / f64::from(LINES),
            l.strict_total(),
        );
            assert_eq!(false_short, 0, "K={k}: a false sold-out");
        }
    }
}
