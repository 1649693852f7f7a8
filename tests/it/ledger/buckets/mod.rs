//! Issue 28, first part: the bucket protocol of docs/buckets.md as a model,
//! checked before any Lua is written. One hot promotion split into K
//! buckets, beside a plain promotion; orders (a bucketed line, perhaps a
//! plain one before or after it), refunds and operator transfers run as
//! deliveries of atomic per-bucket steps (`protocol`), interleaved at
//! random by a scheduler that also crashes deliveries at any step (the
//! event is then delivered again), starts zombie deliveries (a second
//! delivery of an event while the first still runs) and turns one bucket's
//! counters corrupt for a while.
//!
//! After every step: no bucket below zero, budget and stock conserved (in
//! buckets, in transit, deducted; the plain promotion's too), the
//! per-customer limit held across buckets. At every "short" rejection: at
//! some instant of that delivery's life, the whole promotion (every bucket
//! plus every unit in transit) could not cover the line in the dimension
//! rejected (no false sold-out). At every refused reservation: the
//! customer held the limit's count of reservations of orders that deducted.
//! At the end: every event decided once (every delivery agrees), all or
//! nothing per order, nothing in transit, every bound true, and a fresh
//! line of one unit of each from any home bucket is accepted while one is
//! left (nothing stranded).
//!
//! The model is pure (no Redis); `scripts` replays its calls on
//! lua/bucket.lua on a real Redis. Cases: `PROPTEST_CASES` (default 3,000).
//! Each mutant of the protocol (`Mutant`) must make the same property fail.

mod bucket;
mod driver;
mod protocol;
mod scripts;
mod service;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use bucket::*;
use protocol::*;

#[derive(Clone, Debug)]
enum Act {
    /// An order: its bucketed line of `units`, and perhaps a line of the
    /// plain promotion (units, whether it comes first).
    Place {
        cust: Cust,
        units: Units,
        plain: Option<(i64, bool)>,
    },
    Refund {
        order: usize,
        wrong: bool,
    },
    Transfer {
        from: usize,
        to: usize,
        n: Units,
    },
    /// The operator adds `n` (or takes it away), spread over the buckets.
    Adjust {
        n: Units,
        add: bool,
    },
    /// Bucket `bucket`'s counters turn corrupt for `ticks` ticks, then the
    /// operator repairs them.
    Corrupt {
        bucket: usize,
        ticks: u8,
    },
}

#[derive(Clone, Debug)]
struct Case {
    k: usize,
    /// The bucketed promotion's budget and stock.
    initial: Units,
    /// The plain promotion's stock (for the mixed orders).
    plain_stock: i64,
    limit: Option<u32>,
    acts: Vec<Act>,
    /// (which live delivery steps, what befalls it): 0 crash, 1 zombie,
    /// else a step.
    ticks: Vec<(u8, u8)>,
}

/// A line's budget and stock: 1 to 3 of each, most often the same (one
/// unit of stock at a price).
fn units() -> impl Strategy<Value = Units> {
    prop_oneof![
        2 => (1i64..=3).prop_map(|u| Units::new(u, u)),
        1 => (1i64..=3, 1i64..=3).prop_map(|(b, s)| Units::new(b, s)),
    ]
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        6 => (
            0u32..5,
            units(),
            prop_oneof![2 => Just(None), 1 => (1i64..=2, any::<bool>()).prop_map(Some)]
        )
            .prop_map(|(cust, units, plain)| Act::Place { cust, units, plain }),
        2 => (0usize..16, any::<bool>()).prop_map(|(order, wrong)| Act::Refund { order, wrong }),
        3 => (0usize..3, 0usize..3, units()).prop_map(|(from, to, n)| Act::Transfer { from, to, n }),
        1 => (0usize..3, 1u8..40).prop_map(|(bucket, ticks)| Act::Corrupt { bucket, ticks }),
        1 => (units(), any::<bool>()).prop_map(|(n, add)| Act::Adjust { n, add }),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![1 => Just(1usize), 2 => Just(2), 5 => Just(3)],
        // Stock scarce (ample budget), budget scarce, or both.
        prop_oneof![
            2 => (0i64..=9).prop_map(|s| Units::new(100, s)),
            1 => (0i64..=9).prop_map(|b| Units::new(b, 100)),
            2 => (0i64..=12, 0i64..=9).prop_map(|(b, s)| Units::new(b, s)),
        ],
        0i64..=4,
        prop_oneof![1 => Just(None), 4 => (1u32..=2).prop_map(Some)],
        prop::collection::vec(act(), 4..=14),
        prop::collection::vec((any::<u8>(), 0u8..10), 40..=200),
    )
        .prop_map(|(k, initial, plain_stock, limit, acts, ticks)| Case {
            k,
            initial,
            plain_stock,
            limit,
            acts,
            ticks,
        })
}

#[derive(Clone, Debug)]
enum Run {
    Order(Order),
    /// A refund; `plain`: its order's plain line is still to revert
    /// (rollback.lua at `{Q}`, the first step of a mixed order's refund).
    Refund {
        plain: bool,
        run: RefundRun,
    },
    Transfer(Transfer),
    Adjust(Adjust),
    Place(Place),
}

impl Run {
    fn step(&mut self, l: &mut Ledger) -> Report {
        match self {
            Run::Place(p) => drive(p, l),
            Run::Order(o) => o.step(l),
            Run::Refund { plain, run } if *plain => {
                *plain = false;
                plain_rollback(l, run.order);
                Report::Running
            }
            Run::Refund { run, .. } => drive(run, l),
            Run::Transfer(t) => drive(t, l),
            Run::Adjust(a) => drive(a, l),
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
    min_total: Units,
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
static MIXED: AtomicU64 = AtomicU64::new(0);
static CORRUPTIONS: AtomicU64 = AtomicU64::new(0);
static LIMITS: AtomicU64 = AtomicU64::new(0);
static CORRUPT_DECISIONS: AtomicU64 = AtomicU64::new(0);
static MIXED_ACCEPTED: AtomicU64 = AtomicU64::new(0);

fn ev(act: usize) -> Ev {
    act as Ev + 1
}

/// The order a refund act names: a placement's, or one never placed; and
/// whether that order has a plain line.
fn refund_target(acts: &[Act], i: usize, order: usize, wrong: bool) -> (Ev, Cust, bool) {
    let o = order % acts.len();
    match acts[o] {
        Act::Place { cust, plain, .. } => (
            ev(o),
            if wrong { (cust + 1) % 5 } else { cust },
            plain.is_some(),
        ),
        _ => (1_000 + i as Ev, 0, false),
    }
}

fn delivery(c: &Case, i: usize) -> Option<Run> {
    Some(match c.acts[i] {
        Act::Place { cust, units, plain } => {
            let lines = match plain {
                None => vec![Line::Bucket],
                Some((u, true)) => vec![Line::Plain(u), Line::Bucket],
                Some((u, false)) => vec![Line::Bucket, Line::Plain(u)],
            };
            Run::Order(Order::new(Place::new(ev(i), cust, units, c.k), lines))
        }
        Act::Refund { order, wrong } => {
            // The customer a refund names plays no part: the order's
            // bucket keeps the stored one.
            let (o, _named, plain) = refund_target(&c.acts, i, order, wrong);
            Run::Refund {
                plain,
                run: RefundRun::new(ev(i), o, c.k),
            }
        }
        Act::Transfer { from, to, n } => {
            let (from, to) = (from % c.k, to % c.k);
            if from == to {
                return None;
            }
            Run::Transfer(Transfer::new(ev(i), from, to, n, c.k))
        }
        Act::Adjust { n, add } => Run::Adjust(Adjust::new(ev(i), n, add, c.k)),
        Act::Corrupt { .. } => return None,
    })
}

fn check_step(l: &Ledger) -> Result<(), TestCaseError> {
    prop_assert!(l.plain.avail >= 0, "the plain promotion below zero");
    prop_assert_eq!(
        l.plain.avail + l.plain.deducted(),
        l.plain.initial,
        "plain units not conserved"
    );
    for (j, b) in l.b.iter().enumerate() {
        prop_assert!(!b.avail.any_neg(), "bucket {j} below zero: {b:?}");
        prop_assert!(!b.held.any_neg(), "bucket {j} held below zero: {b:?}");
        prop_assert!(
            !b.tentative.any_neg(),
            "bucket {j} tentative below zero: {b:?}"
        );
    }
    // Every bound a healthy bucket keeps is true, at every step: a
    // notification raises it before the units it announces arrive. (A
    // corrupt bucket decides nothing and its bounds go at the repair.)
    for (m, b) in l.b.iter().enumerate().filter(|(_, b)| !b.corrupt) {
        for (j, x) in l.b.iter().enumerate() {
            if let (true, Some(bound)) = (j != m, b.bounds[j]) {
                let holds = x.avail + x.held + x.tentative;
                prop_assert!(
                    bound.covers(holds),
                    "bucket {m}'s bound of bucket {j}, {bound:?}, is below what it holds, {holds:?}"
                );
            }
        }
    }
    let transit: Units = l.transit.values().copied().sum();
    let avail: Units = l.b.iter().map(|b| b.avail).sum();
    let tentative: Units = l.b.iter().map(|b| b.tentative).sum();
    prop_assert_eq!(
        avail + tentative + transit + l.deducted(),
        l.initial + l.adjusted,
        "units not conserved: avail {:?} tentative {:?} transit {:?} deducted {:?}",
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

/// A line refused its reservation (decided `user_limit_reached` there) was
/// refused a true count: its customer then held `limit` reservations of other orders, each of an
/// order whose line deducted or is settling. A reservation of a deduction
/// that a refund or a release has just given back counts too: that
/// delivery frees the slot in its next call and publishes its outcome only
/// after, so the refusal is ordered before it, as an unbucketed multi-line
/// release orders a refusal before it. What must never count is a slot
/// held by an order that never deducted (a reservation taken before the
/// units, for a line that then fails short).
fn check_limit_justified(l: &Ledger, p: &Place) -> Result<(), TestCaseError> {
    let limit = l.limit.unwrap_or(u32::MAX);
    let b = &l.b[l.home(p.cust)];
    let held: Vec<Ev> = b
        .resv
        .iter()
        .filter(|(o, (c, held))| *held && *c == p.cust && **o != p.ev)
        .map(|(o, _)| *o)
        .collect();
    let standing = held
        .iter()
        .filter(|o| {
            matches!(
                l.b[l.order_home(**o)].records.get(o),
                Some(Record::Deducted { .. })
                    | Some(Record::Tentative { .. })
                    | Some(Record::Reverted { .. })
                    | Some(Record::Released { .. })
            )
        })
        .count();
    prop_assert!(
        standing as u32 >= limit,
        "event {} refused user_limit_reached while customer {} held {} standing reservations ({:?}) of a limit of {}",
        p.ev,
        p.cust,
        standing,
        held,
        limit
    );
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
    run_traced(c, mutant, false).map(|_| ())
}

/// A case run through the model; with `trace`, the ledger it ends with
/// holds every call on a bucket with its reply (for `scripts`).
fn run_traced(c: &Case, mutant: Mutant, trace: bool) -> Result<Ledger, TestCaseError> {
    let mut l = Ledger::new(c.k, c.initial, c.limit, mutant).with_plain(c.plain_stock);
    l.trace = trace.then(Vec::new);
    let mut live: Vec<Live> = Vec::new();
    let mut released = 0usize;
    let mut crashes = vec![0u32; c.acts.len()];
    let mut zombies = vec![0u32; c.acts.len()];
    let mut decisions: BTreeMap<usize, Outcome> = BTreeMap::new();
    let mut serial = 0u64;
    // (bucket, the tick it is repaired at)
    let mut corrupt: Option<(usize, usize)> = None;
    let mut spawn = |live: &mut Vec<Live>, i: usize| {
        if let Some(run) = delivery(c, i) {
            serial += 1;
            live.push(Live {
                id: serial,
                act: i,
                run,
                started: false,
                min_total: Units::new(i64::MAX, i64::MAX),
            });
        }
    };
    // What the sweeper knows: the operator's transfers.
    let transfers: BTreeMap<Ev, (usize, usize, Units)> = c
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
            if let Act::Corrupt { bucket, ticks } = c.acts[released] {
                if corrupt.is_none() {
                    corrupt = Some((bucket % c.k, tick + usize::from(ticks)));
                    l.corrupt(bucket % c.k);
                    CORRUPTIONS.fetch_add(1, Ordering::Relaxed);
                }
            }
            spawn(&mut live, released);
            released += 1;
        }
        if let Some((j, at)) = corrupt {
            if tick >= at {
                l.repair(j);
                corrupt = None;
            }
        }
        if live.is_empty() {
            if released == c.acts.len() && corrupt.is_none() {
                break;
            }
            continue;
        }
        // The service's sweeper runs now and then (gifts a crashed zombie
        // left after its event was decided hold units and block juniors
        // until it does).
        if tick % 20 == 0 {
            sweep(&mut l, &transfers);
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
        let refusals = match &me.run {
            Run::Order(o) => o.place.refusals,
            _ => 0,
        };
        let report = me.run.step(&mut l);
        let total = l.strict_total();
        for other in live.iter_mut().filter(|x| x.started) {
            other.min_total = other.min_total.min(total);
        }
        if TRACE.with(|t| t.get()) {
            println!(
                "tick {tick} act {act}: {before}\n  -> {report:?}; buckets {:?}",
                l.b.iter()
                    .map(|b| (b.avail, b.held, b.incr, &b.bounds, &b.pending, &b.records))
                    .collect::<Vec<_>>()
            );
        }
        check_step(&l)?;
        let me = &live[idx];
        if let Run::Order(o) = &me.run {
            if o.place.refusals > refusals {
                check_limit_justified(&l, &o.place)?;
                LIMITS.fetch_add(1, Ordering::Relaxed);
            }
        }
        match report {
            Report::Running => {}
            Report::Short { fast, dim } => {
                let Run::Order(o) = &me.run else {
                    unreachable!("only placements are short")
                };
                let p = &o.place;
                prop_assert!(
                    me.min_total.get(dim) < p.units.get(dim),
                    "false sold-out: event {} ({:?}) rejected short of {:?} ({}) while the promotion held at least {:?} throughout",
                    p.ev,
                    p.units,
                    dim,
                    if fast { "fast path" } else { "after a gather" },
                    me.min_total
                );
                if fast {
                    FAST_SHORT.fetch_add(1, Ordering::Relaxed);
                } else {
                    SLOW_SHORT.fetch_add(1, Ordering::Relaxed);
                }
                decide(&mut decisions, act, Outcome::Placed(Placed::Short(dim)))?;
                if !o.cleaning() {
                    live.swap_remove(idx);
                }
            }
            Report::Done(o) => {
                if let Run::Order(order) = &me.run {
                    let p = &order.place;
                    RESTARTS.fetch_add(u64::from(p.restarts), Ordering::Relaxed);
                    if p.cleaning() {
                        GATHERED.fetch_add(1, Ordering::Relaxed);
                    }
                    if order.lines.len() > 1 {
                        MIXED.fetch_add(1, Ordering::Relaxed);
                        if matches!(o, Outcome::Placed(Placed::Accepted(_))) {
                            MIXED_ACCEPTED.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                match o {
                    Outcome::Moved => {
                        TRANSFERS.fetch_add(1, Ordering::Relaxed);
                    }
                    Outcome::Refund(Refund::Applied(_)) => {
                        REFUNDS_APPLIED.fetch_add(1, Ordering::Relaxed);
                    }
                    Outcome::Refund(Refund::Corrupt) | Outcome::Placed(Placed::Corrupt) => {
                        CORRUPT_DECISIONS.fetch_add(1, Ordering::Relaxed);
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

    prop_assert!(corrupt.is_none(), "a bucket left corrupt");
    // Every placement and refund decided.
    for (i, a) in c.acts.iter().enumerate() {
        if matches!(a, Act::Place { .. } | Act::Refund { .. }) {
            prop_assert!(decisions.contains_key(&i), "event {} never decided", ev(i));
        }
    }
    // A refund that found no deduction leaves none to come.
    for (i, a) in c.acts.iter().enumerate() {
        if let Act::Refund { order, wrong } = a {
            let (o, _, _) = refund_target(&c.acts, i, *order, *wrong);
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

    // All or nothing: an accepted order holds (or held, until a refund)
    // both its lines; a rejected one holds neither.
    for (i, a) in c.acts.iter().enumerate() {
        if let Act::Place { plain, .. } = a {
            let o = ev(i);
            let accepted = matches!(
                decisions.get(&i),
                Some(Outcome::Placed(Placed::Accepted(_)))
            );
            let bucket = l.b[l.order_home(o)].records.get(&o);
            let held = matches!(bucket, Some(Record::Deducted { .. }));
            let ever = matches!(
                bucket,
                Some(Record::Deducted { .. }) | Some(Record::Reverted { .. })
            );
            if accepted {
                prop_assert!(
                    ever,
                    "order {o} accepted, its bucketed line holds {bucket:?}"
                );
            } else {
                prop_assert!(
                    !held,
                    "order {o} rejected, its bucketed line still deducted"
                );
            }
            if plain.is_some() {
                let q = l.plain.records.get(&o);
                if accepted {
                    prop_assert!(
                        matches!(
                            q,
                            Some(PlainRecord::Deducted(_)) | Some(PlainRecord::Reverted(_))
                        ),
                        "order {o} accepted, its plain line holds {q:?}"
                    );
                } else {
                    prop_assert!(
                        !matches!(q, Some(PlainRecord::Deducted(_))),
                        "order {o} rejected, its plain line still deducted"
                    );
                }
            }
        }
    }

    // The sweeper settles what crashed deliveries left in transit.
    sweep(&mut l, &transfers);
    check_step(&l)?;
    check_reservations(&l)?;
    prop_assert!(
        l.transit.is_empty(),
        "units left in transit: {:?}",
        l.transit
    );
    for (m, b) in l.b.iter().enumerate() {
        prop_assert_eq!(b.held, Units::ZERO, "bucket {} still holds given units", m);
        prop_assert!(
            b.pending.is_empty(),
            "bucket {m} still marked: {:?}",
            b.pending
        );
    }
    // Nothing stranded: while a unit of stock and of budget is left, a new
    // line of one of each is accepted from every home bucket.
    let one = Units::new(1, 1);
    if l.strict_total().covers(one) {
        for m in 0..c.k {
            let mut probe_ledger = l.clone();
            let cust = (1_000 * c.k + m) as Cust;
            let mut probe = Place::new(90_000, cust, one, c.k);
            let mut n = 0;
            let outcome = loop {
                n += 1;
                prop_assert!(n < 1_000, "the probe did not finish");
                match drive(&mut probe, &mut probe_ledger) {
                    Report::Running => {}
                    Report::Short { dim, .. } => break Placed::Short(dim),
                    Report::Done(Outcome::Placed(p)) => break p,
                    Report::Done(o) => prop_assert!(false, "probe ended {o:?}"),
                }
            };
            prop_assert_eq!(
                outcome,
                Placed::Accepted(one),
                "a unit left ({:?} in all) but a line from bucket {} was not sold it",
                l.strict_total(),
                m
            );
        }
    }
    CASES.fetch_add(1, Ordering::Relaxed);
    Ok(l)
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
        "bucket protocol model: {} cases, {} steps, {} crashes, {} zombie deliveries, {} lines that gathered units, {} short by the fast path, {} short after a gather, {} gather restarts, {} transfers and adjustments, {} refunds applied, {} mixed-order deliveries ({} accepted), {} corruptions, {} corrupt_promotion decisions, {} user_limit_reached decisions",
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
        MIXED.load(Ordering::Relaxed),
        MIXED_ACCEPTED.load(Ordering::Relaxed),
        CORRUPTIONS.load(Ordering::Relaxed),
        CORRUPT_DECISIONS.load(Ordering::Relaxed),
        LIMITS.load(Ordering::Relaxed),
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
        Mutant::AdjustNoNotify,
        Mutant::NoGiftMemo,
        Mutant::NoReleaseMark,
        Mutant::CorruptCountsAsEmpty,
        Mutant::ReserveCountsFreed,
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

/// The race behind `Bucket::refused`, found by a 100,000-case run and too
/// rare for the mutant test's 30,000: delivery A of order 11 is refused its
/// reservation; a zombie delivery of the same order then takes the slot a
/// refund has just freed; A undoes and decides `user_limit_reached`, and
/// until a release runs, the zombie's reservation holds the customer's slot
/// for an order with no deduction, so another order of the customer is
/// refused on it. With the refusal kept at the customer's bucket the zombie
/// is refused too. The case (shrunk by proptest) must pass, and fail without
/// the refusal kept.
#[test]
fn a_refused_reservation_stays_refused() {
    let u = |n: i64| Units::new(n, n);
    let place = |cust: Cust, n: i64, plain: Option<(i64, bool)>| Act::Place {
        cust,
        units: u(n),
        plain,
    };
    let c = Case {
        k: 3,
        initial: u(6),
        plain_stock: 4,
        limit: Some(1),
        acts: vec![
            Act::Refund {
                order: 3,
                wrong: false,
            },
            place(3, 2, Some((1, false))),
            place(0, 1, None),
            Act::Transfer {
                from: 2,
                to: 2,
                n: u(1),
            },
            Act::Transfer {
                from: 2,
                to: 2,
                n: u(1),
            },
            place(0, 1, None),
            place(3, 1, None),
            place(0, 1, Some((2, true))),
            Act::Corrupt {
                bucket: 1,
                ticks: 23,
            },
            Act::Transfer {
                from: 0,
                to: 1,
                n: u(1),
            },
            place(3, 1, Some((2, true))),
            place(0, 1, Some((1, true))),
            place(0, 1, None),
        ],
        ticks: vec![
            (0, 0),
            (0, 2),
            (0, 3),
            (65, 0),
            (128, 0),
            (104, 0),
            (72, 0),
            (8, 2),
            (0, 2),
            (0, 2),
            (0, 2),
            (0, 3),
            (55, 3),
            (128, 0),
            (13, 0),
            (114, 3),
            (189, 3),
            (142, 3),
            (92, 2),
            (2, 2),
            (0, 2),
            (0, 1),
            (0, 2),
            (68, 2),
            (0, 3),
            (0, 2),
            (0, 2),
            (0, 3),
            (0, 3),
            (0, 3),
            (26, 1),
            (15, 3),
            (25, 3),
            (8, 1),
            (194, 0),
            (116, 3),
            (22, 3),
            (238, 3),
            (173, 1),
            (70, 3),
            (188, 3),
            (209, 3),
            (136, 0),
            (29, 2),
            (85, 3),
            (112, 3),
            (230, 2),
            (7, 2),
            (0, 0),
            (9, 2),
            (0, 1),
            (0, 2),
            (0, 2),
            (0, 2),
            (44, 2),
            (49, 3),
            (152, 2),
            (0, 0),
            (107, 1),
            (16, 1),
            (33, 0),
            (30, 3),
            (28, 0),
            (0, 2),
            (0, 1),
            (0, 0),
        ],
    };
    if let Err(e) = run_case(&c, Mutant::None) {
        TRACE.with(|t| t.set(true));
        let _ = run_case(&c, Mutant::None);
        panic!("the pinned case fails: {e}");
    }
    let caught = run_case(&c, Mutant::RefusalForgotten);
    assert!(
        caught.is_err(),
        "without the refusal kept, the pinned case passes: it no longer reaches the race"
    );
    println!("RefusalForgotten caught: {caught:?}");
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
            // Budget ample: the sale is of stock.
            let mut l = Ledger::new(k, Units::new(1_000_000, STOCK), Some(1), Mutant::None);
            let one = Units::new(1, 1);
            let mut live: Vec<(Run, Units)> = Vec::new();
            let mut placed: Vec<(Ev, Cust)> = Vec::new();
            let (mut next, mut events) = (1 as Ev, 0u32);
            let (mut gathered, mut fast, mut slow, mut false_short) = (0u64, 0u64, 0u64, 0u64);
            let mut restarts = 0u64;
            while events < LINES || !live.is_empty() {
                while live.len() < in_flight && events < LINES {
                    events += 1;
                    let run = if !placed.is_empty() && rng.u8(0..10) == 0 {
                        let (o, _) = placed[rng.usize(0..placed.len())];
                        Run::Refund {
                            plain: false,
                            run: RefundRun::new(next, o, k),
                        }
                    } else {
                        let c = rng.u32(0..50_000);
                        placed.push((next, c));
                        Run::Place(Place::new(next, c, one, k))
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
                    (Run::Place(p), Report::Short { fast: f, dim }) => {
                        if f {
                            fast += 1
                        } else {
                            slow += 1
                        }
                        if live[i].1.get(dim) >= p.units.get(dim) {
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
            let unsold = l.strict_total().stock;
            // One more line from each bucket, alone: nothing may be stranded
            // where no line reaches.
            let mut sold = 0i64;
            for _ in 0..k {
                // Orders on every bucket in turn (the order picks the bucket).
                let mut probe = Place::new(next, 9_000_000 + next, one, k);
                next += 1;
                let outcome = loop {
                    match drive(&mut probe, &mut l) {
                        Report::Running => {}
                        r => break r,
                    }
                };
                if outcome == Report::Done(Outcome::Placed(Placed::Accepted(one))) {
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
            l.strict_total().stock,
        );
            assert_eq!(false_short, 0, "K={k}: a false sold-out");
        }
    }
}
