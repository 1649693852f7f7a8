//! Model-based test of the ledger: random sequences of placements (1 to 3
//! lines), refunds (full, partial, some before their placement), replays of
//! earlier events and pauses, run against the real scripts on Redis AND
//! against a small pure model of CONTRACT.md section 3 written here. After
//! every step the decisions, every key under the test's prefix, and the
//! ledger invariant must agree.
//!
//! Cases: `PROPTEST_CASES` (default 64).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::redis::*;
use deductor::admin::{self, PromoSpec};
use deductor::domain::decision::{
    AcceptedLine, PlaceDecision, Reason, RefundDecision, RefundLineResult, Remaining,
};
use deductor::domain::event::{OrderPlaced, OrderRefunded};
use deductor::domain::keys::Keys;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const PROMOS: [&str; 4] = ["scarce", "budget", "pausable", "missing"];
const CUSTOMERS: usize = 3;
const ORDERS: usize = 6;
const WINDOW: (i64, i64) = (1_000, 5_000);

/// The promotions every case starts with; index 3 never exists.
fn specs() -> Vec<PromoSpec> {
    vec![
        // Scarce stock, a per-customer limit and a window.
        PromoSpec {
            budget: Some(100),
            stock: Some(4),
            per_customer: Some(1),
            starts_at: Some(WINDOW.0),
            ends_at: Some(WINDOW.1),
            paused: false,
        },
        // Scarce budget, unlimited stock, two orders per customer.
        PromoSpec {
            budget: Some(60),
            per_customer: Some(2),
            ..PromoSpec::default()
        },
        // Starts paused; the Pause action toggles it.
        PromoSpec {
            budget: Some(1_000),
            stock: Some(100),
            paused: true,
            ..PromoSpec::default()
        },
    ]
}

#[derive(Debug, Clone)]
enum Action {
    Place {
        order: usize,
        t: i64,
        lines: Vec<(usize, u64, u64)>,
    },
    Refund {
        order: usize,
        lines: Vec<(usize, Option<u64>, Option<u64>)>,
    },
    /// Redeliver an earlier event (index into the history).
    Replay(prop::sample::Index),
    /// An operator pauses or resumes promotion 2.
    Pause(bool),
}

fn promo_index() -> impl Strategy<Value = usize> {
    prop_oneof![6 => 0..3usize, 1 => Just(3usize)]
}

fn dedup<T>(lines: Vec<(usize, T, T)>) -> Vec<(usize, T, T)> {
    let mut seen = Vec::new();
    lines
        .into_iter()
        .filter(|l| {
            let new = !seen.contains(&l.0);
            seen.push(l.0);
            new
        })
        .collect()
}

fn action() -> impl Strategy<Value = Action> {
    let times = prop::sample::select(vec![500i64, 999, 1_000, 3_000, 4_999, 5_000, 6_000]);
    let place = (
        0..ORDERS,
        times,
        prop::collection::vec((promo_index(), 0..=40u64, 0..=2u64), 1..=3),
    )
        .prop_map(|(order, t, lines)| Action::Place {
            order,
            t,
            lines: dedup(lines),
        });
    let amount = |max: u64| prop_oneof![Just(None), (0..=max).prop_map(Some)];
    let refund = (
        0..ORDERS,
        prop::collection::vec((promo_index(), amount(40), amount(2)), 1..=3),
    )
        .prop_map(|(order, lines)| Action::Refund {
            order,
            lines: dedup(lines),
        });
    prop_oneof![
        6 => place,
        3 => refund,
        3 => any::<prop::sample::Index>().prop_map(Action::Replay),
        1 => any::<bool>().prop_map(Action::Pause),
    ]
}

// ---------------------------------------------------------------- the model

#[derive(Debug, Clone)]
struct Promo {
    fields: BTreeMap<String, String>,
}

impl Promo {
    fn num(&self, f: &str) -> Option<u64> {
        self.fields.get(f).map(|v| v.parse().unwrap())
    }
    fn add(&mut self, f: &str, delta: i64) {
        if let Some(v) = self.num(f) {
            let n = v as i64 + delta;
            assert!(n >= 0, "model went negative");
            self.fields.insert(f.into(), n.to_string());
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Rec {
    reverted: bool,
    event: Option<String>,
    budget: u64,
    stock: u64,
    budget0: u64,
    stock0: u64,
}

#[derive(Debug, Default)]
struct Model {
    promos: BTreeMap<usize, Promo>,
    /// (promotion, customer) -> used; present once counted.
    used: BTreeMap<(usize, usize), u64>,
    /// (promotion, order) -> record.
    records: BTreeMap<(usize, usize), Rec>,
    /// (promotion, event) -> reason.
    rejected: BTreeMap<(usize, String), Reason>,
    /// (promotion, event): placements absorbed by step 1 into another
    /// event's record (memo "accepted").
    absorbed: std::collections::BTreeSet<(usize, String)>,
    /// (promotion, event): lines released for a rejected event (memo
    /// "released"; never over a reason, replaces "accepted").
    released: std::collections::BTreeSet<(usize, String)>,
    /// (promotion, event) -> stored refund result.
    refunds: BTreeMap<(usize, String), String>,
}

struct Line {
    status: Result<(), Reason>,
    duplicate: bool,
    budget: u64,
    stock: u64,
}

fn pidx(p: &str) -> usize {
    PROMOS.iter().position(|x| *x == p).unwrap()
}

fn oidx(o: &str) -> usize {
    o[1..].parse().unwrap()
}

fn cidx(c: &str) -> usize {
    c[1..].parse().unwrap()
}

impl Model {
    fn remaining(&self, p: usize) -> Remaining {
        match self.promos.get(&p) {
            None => Remaining::default(),
            Some(pr) => Remaining {
                budget: pr.num("budget"),
                stock: pr.num("stock"),
            },
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn deduct(&mut self, p: usize, o: usize, c: usize, e: &str, b: u64, s: u64, t: i64) -> Line {
        let line = |status, duplicate, budget, stock| Line {
            status,
            duplicate,
            budget,
            stock,
        };
        if let Some(r) = self.rejected.get(&(p, e.to_owned())) {
            return line(Err(*r), true, 0, 0);
        }
        if self.absorbed.contains(&(p, e.to_owned())) {
            let rec = self.records.get(&(p, o));
            return line(
                Ok(()),
                true,
                rec.map_or(0, |r| r.budget0),
                rec.map_or(0, |r| r.stock0),
            );
        }
        let reason = if let Some(rec) = self.records.get(&(p, o)) {
            if !rec.reverted || rec.event.as_deref() == Some(e) {
                let (b0, s0) = (rec.budget0, rec.stock0);
                if rec.event.as_deref() != Some(e) {
                    self.absorbed.insert((p, e.to_owned()));
                }
                return line(Ok(()), true, b0, s0);
            }
            Some(Reason::OrderReverted)
        } else if let Some(pr) = self.promos.get(&p) {
            let used = self.used.get(&(p, c)).copied().unwrap_or(0);
            let start = pr
                .fields
                .get("starts_at")
                .map(|v| v.parse::<i64>().unwrap());
            let end = pr.fields.get("ends_at").map(|v| v.parse::<i64>().unwrap());
            if pr.fields.get("status").map(String::as_str) == Some("paused")
                || start.is_some_and(|st| t < st)
                || end.is_some_and(|en| t >= en)
            {
                Some(Reason::PromotionInactive)
            } else if pr.num("budget").is_some_and(|v| v < b) {
                Some(Reason::BudgetExceeded)
            } else if pr.num("stock").is_some_and(|v| v < s) {
                Some(Reason::StockInsufficient)
            } else if pr.num("per_customer").is_some_and(|v| used >= v) {
                Some(Reason::UserLimitReached)
            } else {
                None
            }
        } else {
            Some(Reason::PromotionNotFound)
        };
        if let Some(r) = reason {
            self.rejected.insert((p, e.to_owned()), r);
            return line(Err(r), false, 0, 0);
        }
        let pr = self.promos.get_mut(&p).unwrap();
        pr.add("budget", -(b as i64));
        pr.add("stock", -(s as i64));
        if pr.num("per_customer").is_some() {
            *self.used.entry((p, c)).or_insert(0) += 1;
        }
        self.records.insert(
            (p, o),
            Rec {
                reverted: false,
                event: Some(e.to_owned()),
                budget: b,
                stock: s,
                budget0: b,
                stock0: s,
            },
        );
        line(Ok(()), false, b, s)
    }

    fn release(&mut self, p: usize, o: usize, c: usize, e: &str) {
        let key = (p, e.to_owned());
        if !self.rejected.contains_key(&key) {
            self.absorbed.remove(&key);
            self.released.insert(key);
        }
        let Some(rec) = self.records.get(&(p, o)) else {
            return;
        };
        if rec.reverted || rec.event.as_deref() != Some(e) {
            return;
        }
        let rec = self.records.remove(&(p, o)).unwrap();
        if let Some(pr) = self.promos.get_mut(&p) {
            pr.add("budget", rec.budget as i64);
            pr.add("stock", rec.stock as i64);
        }
        if let Some(u) = self.used.get_mut(&(p, c)) {
            *u = u.saturating_sub(1);
        }
    }

    fn place(&mut self, e: &OrderPlaced) -> PlaceDecision {
        let h = &e.header;
        let (o, c, ev) = (
            oidx(h.order_id.as_str()),
            cidx(h.customer_id.as_str()),
            h.event_id.as_str(),
        );
        let ps: Vec<usize> = e
            .lines
            .iter()
            .map(|l| pidx(l.promotion_id.as_str()))
            .collect();
        if ps.len() > 1 {
            // The first line's stored rejection is answered by deduct step 0
            // (nothing of the event was deducted before its first line);
            // the other lines' are looked up before anything is deducted.
            for (i, p) in ps.iter().enumerate().skip(1) {
                if let Some(r) = self.rejected.get(&(*p, ev.to_owned())).copied() {
                    for q in &ps {
                        self.release(*q, o, c, ev);
                    }
                    return PlaceDecision::Rejected {
                        duplicate: true,
                        reason: r,
                        promotion_id: e.lines[i].promotion_id.clone(),
                    };
                }
            }
        }
        let mut lines = Vec::new();
        let mut all_dup = true;
        for (i, l) in e.lines.iter().enumerate() {
            let r = self.deduct(ps[i], o, c, ev, l.budget, l.stock, h.occurred_at);
            match r.status {
                Ok(()) => {
                    all_dup &= r.duplicate;
                    lines.push(AcceptedLine {
                        promotion_id: l.promotion_id.clone(),
                        budget: r.budget,
                        stock: r.stock,
                        remaining: self.remaining(ps[i]),
                    });
                }
                Err(reason) => {
                    for q in &ps[..i] {
                        self.release(*q, o, c, ev);
                    }
                    return PlaceDecision::Rejected {
                        duplicate: r.duplicate,
                        reason,
                        promotion_id: l.promotion_id.clone(),
                    };
                }
            }
        }
        PlaceDecision::Accepted {
            duplicate: all_dup,
            lines,
        }
    }

    fn rollback(
        &mut self,
        p: usize,
        o: usize,
        c: usize,
        e: &str,
        b: Option<u64>,
        s: Option<u64>,
    ) -> Line {
        let key = (p, e.to_owned());
        if let Some(stored) = self.refunds.get(&key) {
            let parts: Vec<&str> = stored.split(' ').collect();
            return match parts[..] {
                ["applied", b, s] => Line {
                    status: Ok(()),
                    duplicate: true,
                    budget: b.parse().unwrap(),
                    stock: s.parse().unwrap(),
                },
                ["rejected", r] => Line {
                    status: Err(Reason::parse(r).unwrap()),
                    duplicate: true,
                    budget: 0,
                    stock: 0,
                },
                _ => unreachable!("{stored}"),
            };
        }
        let reject = |m: &mut Model, r: Reason| {
            m.refunds.insert(key.clone(), format!("rejected {r}"));
            Line {
                status: Err(r),
                duplicate: false,
                budget: 0,
                stock: 0,
            }
        };
        let Some(rec) = self.records.get(&(p, o)).cloned() else {
            self.records.insert(
                (p, o),
                Rec {
                    reverted: true,
                    event: None,
                    budget: 0,
                    stock: 0,
                    budget0: 0,
                    stock0: 0,
                },
            );
            return reject(self, Reason::NoDeduction);
        };
        if rec.reverted {
            return reject(self, Reason::AlreadyReverted);
        }
        let (b, s) = (b.unwrap_or(rec.budget), s.unwrap_or(rec.stock));
        if b > rec.budget || s > rec.stock {
            return reject(self, Reason::ExceedsDeducted);
        }
        if let Some(pr) = self.promos.get_mut(&p) {
            pr.add("budget", b as i64);
            pr.add("stock", s as i64);
        }
        let r = self.records.get_mut(&(p, o)).unwrap();
        r.budget -= b;
        r.stock -= s;
        if r.budget == 0 && r.stock == 0 {
            r.reverted = true;
            if let Some(u) = self.used.get_mut(&(p, c)) {
                *u = u.saturating_sub(1);
            }
        }
        self.refunds.insert(key, format!("applied {b} {s}"));
        Line {
            status: Ok(()),
            duplicate: false,
            budget: b,
            stock: s,
        }
    }

    fn refund(&mut self, e: &OrderRefunded) -> RefundDecision {
        let h = &e.header;
        let (o, c, ev) = (
            oidx(h.order_id.as_str()),
            cidx(h.customer_id.as_str()),
            h.event_id.as_str(),
        );
        let lines = e
            .lines
            .iter()
            .map(|l| {
                let p = pidx(l.promotion_id.as_str());
                let r = self.rollback(p, o, c, ev, l.budget, l.stock);
                RefundLineResult {
                    promotion_id: l.promotion_id.clone(),
                    status: r.status,
                    duplicate: r.duplicate,
                    budget: r.budget,
                    stock: r.stock,
                    remaining: self.remaining(p),
                }
            })
            .collect();
        RefundDecision { lines }
    }

    /// Every key the model says Redis holds under the prefix.
    fn dump(&self, keys: &Keys) -> Dump {
        let p = |i: usize| id(PROMOS[i]);
        let mut d = Dump::new();
        let ttl = |value| Dumped {
            value,
            expires: true,
        };
        for (i, pr) in &self.promos {
            let value = DumpedValue::Hash(pr.fields.clone());
            d.insert(
                keys.promotion(&p(*i)),
                Dumped {
                    value,
                    expires: false,
                },
            );
        }
        for ((i, c), n) in &self.used {
            let k = keys.used(&p(*i), &id(&format!("c{c}")));
            d.insert(k, ttl(DumpedValue::String(n.to_string())));
        }
        for ((i, o), r) in &self.records {
            let mut h = BTreeMap::new();
            h.insert(
                "state".into(),
                if r.reverted { "reverted" } else { "deducted" }.into(),
            );
            if let Some(e) = &r.event {
                h.insert("event".into(), e.clone());
            }
            for (f, v) in [
                ("budget", r.budget),
                ("stock", r.stock),
                ("budget0", r.budget0),
                ("stock0", r.stock0),
            ] {
                h.insert(f.into(), v.to_string());
            }
            d.insert(
                keys.record(&p(*i), &id(&format!("o{o}"))),
                ttl(DumpedValue::Hash(h)),
            );
        }
        for ((i, e), r) in &self.rejected {
            d.insert(
                keys.rejected(&p(*i), &id(e)),
                ttl(DumpedValue::String(r.to_string())),
            );
        }
        for (i, e) in &self.released {
            d.insert(
                keys.rejected(&p(*i), &id(e)),
                ttl(DumpedValue::String("released".into())),
            );
        }
        for (i, e) in &self.absorbed {
            d.insert(
                keys.rejected(&p(*i), &id(e)),
                ttl(DumpedValue::String("accepted".into())),
            );
        }
        for ((i, e), v) in &self.refunds {
            d.insert(
                keys.refund(&p(*i), &id(e)),
                ttl(DumpedValue::String(v.clone())),
            );
        }
        d
    }
}

// ------------------------------------------------------------ the harness

#[derive(Debug, Clone)]
enum Event {
    Placed(OrderPlaced),
    Refunded(OrderRefunded),
}

#[derive(Debug, Clone, PartialEq)]
enum Decision {
    Place(PlaceDecision),
    Refund(RefundDecision),
}

/// What must not change between deliveries of one event: type, reason,
/// failing promotion, line amounts (not `duplicate` or `remaining`).
fn essence(d: &Decision) -> String {
    match d {
        Decision::Place(PlaceDecision::Accepted { lines, .. }) => format!(
            "accepted {:?}",
            lines
                .iter()
                .map(|l| (l.promotion_id.to_string(), l.budget, l.stock))
                .collect::<Vec<_>>()
        ),
        Decision::Place(PlaceDecision::Rejected {
            reason,
            promotion_id,
            ..
        }) => {
            format!("rejected {reason} {promotion_id}")
        }
        Decision::Refund(r) => format!(
            "refund {:?}",
            r.lines
                .iter()
                .map(|l| (l.promotion_id.to_string(), l.status, l.budget, l.stock))
                .collect::<Vec<_>>()
        ),
    }
}

static CASES: AtomicUsize = AtomicUsize::new(0);
static STEPS: AtomicUsize = AtomicUsize::new(0);
static REPLAYS: AtomicUsize = AtomicUsize::new(0);
static ACCEPTED: AtomicUsize = AtomicUsize::new(0);

async fn run_case(actions: Vec<Action>) -> Result<(), TestCaseError> {
    let r = standalone().await;
    let keys = r.keys().clone();
    let mut model = Model::default();
    for (i, spec) in specs().into_iter().enumerate() {
        admin::promo_set(&r.ledger, &id(PROMOS[i]), spec, false)
            .await
            .unwrap();
        let fields = r.hgetall(&keys.promotion(&id(PROMOS[i]))).await;
        model.promos.insert(i, Promo { fields });
    }
    // event id -> (event, first decision)
    let mut history: Vec<(Event, Decision)> = Vec::new();
    for (step, action) in actions.iter().enumerate() {
        let event = match action {
            Action::Place { order, t, lines } => {
                let lines: Vec<(&str, u64, u64)> =
                    lines.iter().map(|&(p, b, s)| (PROMOS[p], b, s)).collect();
                let e = placed(
                    &format!("e{step}"),
                    &format!("o{order}"),
                    &format!("c{}", order % CUSTOMERS),
                    *t,
                    &lines,
                );
                Some(Event::Placed(e))
            }
            Action::Refund { order, lines } => {
                let lines: Vec<(&str, Option<u64>, Option<u64>)> =
                    lines.iter().map(|&(p, b, s)| (PROMOS[p], b, s)).collect();
                Some(Event::Refunded(refunded(
                    &format!("e{step}"),
                    &format!("o{order}"),
                    &format!("c{}", order % CUSTOMERS),
                    &lines,
                )))
            }
            Action::Replay(ix) if !history.is_empty() => {
                Some(history[ix.index(history.len())].0.clone())
            }
            Action::Replay(_) => None,
            Action::Pause(paused) => {
                let status = if *paused { "paused" } else { "active" };
                r.hset(&keys.promotion(&id(PROMOS[2])), &[("status", status)])
                    .await;
                model
                    .promos
                    .get_mut(&2)
                    .unwrap()
                    .fields
                    .insert("status".into(), status.into());
                None
            }
        };
        if let Some(event) = event {
            let (got, want) = match &event {
                Event::Placed(e) => (
                    Decision::Place(
                        r.ledger
                            .place(e)
                            .await
                            .map_err(|e| TestCaseError::fail(e.to_string()))?,
                    ),
                    Decision::Place(model.place(e)),
                ),
                Event::Refunded(e) => (
                    Decision::Refund(
                        r.ledger
                            .refund(e)
                            .await
                            .map_err(|e| TestCaseError::fail(e.to_string()))?,
                    ),
                    Decision::Refund(model.refund(e)),
                ),
            };
            prop_assert_eq!(&got, &want, "step {}: {:?}", step, event);
            if matches!(got, Decision::Place(PlaceDecision::Accepted { .. })) {
                ACCEPTED.fetch_add(1, Ordering::Relaxed);
            }
            let event_id = match &event {
                Event::Placed(e) => e.header.event_id.to_string(),
                Event::Refunded(e) => e.header.event_id.to_string(),
            };
            match history.iter().find(|(e, _)| event_key(e) == event_id) {
                Some((_, first)) => {
                    REPLAYS.fetch_add(1, Ordering::Relaxed);
                    // One decision per event, also for a second placement
                    // event of one order (absorbed into the first's record).
                    prop_assert_eq!(
                        essence(first),
                        essence(&got),
                        "step {}: replay of {}",
                        step,
                        event_id
                    );
                }
                None => history.push((event, got)),
            }
        }
        let actual = r.dump().await;
        let expected = model.dump(&keys);
        prop_assert_eq!(
            diff(&expected, &actual),
            Vec::<String>::new(),
            "step {}: {:?}",
            step,
            action
        );
        check_invariant(&keys, &actual)?;
        STEPS.fetch_add(1, Ordering::Relaxed);
    }
    CASES.fetch_add(1, Ordering::Relaxed);
    r.ledger.quit().await;
    Ok(())
}

fn event_key(e: &Event) -> String {
    match e {
        Event::Placed(e) => e.header.event_id.to_string(),
        Event::Refunded(e) => e.header.event_id.to_string(),
    }
}

/// CONTRACT.md section 5: initial - remaining == outstanding, remaining >= 0,
/// used <= per_customer; read from Redis alone.
fn check_invariant(keys: &Keys, dump: &Dump) -> Result<(), TestCaseError> {
    let hash = |k: &str| match dump.get(k).map(|d| &d.value) {
        Some(DumpedValue::Hash(h)) => Some(h.clone()),
        _ => None,
    };
    for p in &PROMOS[..3] {
        let promo = hash(&keys.promotion(&id(p))).expect("promotion exists");
        let records = keys.record_pattern(&id(p));
        let prefix = records.trim_end_matches('*');
        for dim in ["budget", "stock"] {
            let Some(left) = promo.get(dim) else { continue };
            let left: u64 = left
                .parse()
                .map_err(|_| TestCaseError::fail(format!("{p} {dim} = {left}")))?;
            let initial: u64 = promo[&format!("initial_{dim}")].parse().unwrap();
            let outstanding: u64 = dump
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(_, d)| match &d.value {
                    DumpedValue::Hash(h) => h[dim].parse::<u64>().unwrap(),
                    other => panic!("record {other:?}"),
                })
                .sum();
            prop_assert_eq!(initial - left, outstanding, "{} {}", p, dim);
        }
        if let Some(max) = promo.get("per_customer") {
            let max: u64 = max.parse().unwrap();
            for c in 0..CUSTOMERS {
                if let Some(Dumped {
                    value: DumpedValue::String(n),
                    ..
                }) = dump.get(&keys.used(&id(p), &id(&format!("c{c}"))))
                {
                    prop_assert!(n.parse::<u64>().unwrap() <= max, "{} c{} used {}", p, c, n);
                }
            }
        }
    }
    Ok(())
}

#[test]
fn ledger_agrees_with_the_model() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(action(), 40..=80), |actions| {
        rt.block_on(run_case(actions))
    });
    println!(
        "ledger model: {} cases passed, {} steps, {} replays, {} accepted placements (configured cases: {cases})",
        CASES.load(Ordering::Relaxed),
        STEPS.load(Ordering::Relaxed),
        REPLAYS.load(Ordering::Relaxed),
        ACCEPTED.load(Ordering::Relaxed),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
