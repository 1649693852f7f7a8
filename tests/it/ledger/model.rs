//! Model-based test of the ledger: random sequences of placements (1 to 3
//! lines), refunds (full, partial, some before their placement, some naming
//! another customer), replays of earlier events, zombie deliveries that die
//! half way and are delivered whole later, and operator changes (pause,
//! per-customer limit added or removed, a forced re-seed, a delete and
//! re-create, corrupt data and its repair), run against the real scripts on Redis AND
//! against a small pure model of CONTRACT.md section 3 written here. After
//! every step the decisions, every key under the test's prefix, and the
//! ledger invariant must agree.
//!
//! Cases: `PROPTEST_CASES` (default 64).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::redis::*;
use deductor::admin::{self, PromoSpec};
use deductor::domain::decision::{
    AcceptedLine, PlaceDecision, Reason, RefundDecision, RefundLineResult, Remaining,
};
use deductor::domain::event::{OrderPlaced, OrderRefunded};
use deductor::domain::keys::Keys;
use deductor::ledger::scripts;
use fred::prelude::HashesInterface;
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
        /// The refund event names another customer than the order's.
        other_customer: bool,
    },
    /// Redeliver an earlier event (index into the history).
    Replay(prop::sample::Index),
    /// An operator pauses or resumes promotion 2.
    Pause(bool),
    /// An operator sets (or removes) promotion 0's or 1's per-customer limit.
    Limit(usize, Option<u64>),
    /// An operator re-seeds a promotion while orders hold it: `promo set
    /// --force`, or (true) a delete and re-create.
    Reseed(usize, bool),
    /// Promotion 1's hash gets a corrupt field (true) or is repaired (false).
    Corrupt(bool),
    /// A delivery that dies after deducting the first `upto` lines of a new
    /// placement (a zombie, or a consumer killed mid-event); the event is
    /// delivered whole later by `Finish`.
    Zombie {
        order: usize,
        t: i64,
        lines: Vec<(usize, u64, u64)>,
        upto: usize,
    },
    /// Delivers an event a zombie left half done (index into those).
    Finish(prop::sample::Index),
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
    let lines = || prop::collection::vec((promo_index(), 0..=40u64, 0..=2u64), 1..=3);
    let place = (0..ORDERS, times.clone(), lines()).prop_map(|(order, t, lines)| Action::Place {
        order,
        t,
        lines: dedup(lines),
    });
    let zombie = (0..ORDERS, times, lines(), 0..=2usize).prop_map(|(order, t, lines, upto)| {
        Action::Zombie {
            order,
            t,
            lines: dedup(lines),
            upto,
        }
    });
    let amount = |max: u64| prop_oneof![Just(None), (0..=max).prop_map(Some)];
    let refund = (
        0..ORDERS,
        prop::collection::vec((promo_index(), amount(40), amount(2)), 1..=3),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(order, lines, other_customer)| Action::Refund {
            order,
            lines: dedup(lines),
            other_customer,
        });
    let limit = (
        0..2usize,
        prop_oneof![Just(None), (1..=3u64).prop_map(Some)],
    )
        .prop_map(|(p, n)| Action::Limit(p, n));
    prop_oneof![
        6 => place,
        3 => refund,
        3 => any::<prop::sample::Index>().prop_map(Action::Replay),
        1 => any::<bool>().prop_map(Action::Pause),
        1 => limit,
        1 => (0..3usize, any::<bool>()).prop_map(|(p, recreate)| Action::Reseed(p, recreate)),
        1 => any::<bool>().prop_map(Action::Corrupt),
        1 => zombie,
        1 => any::<prop::sample::Index>().prop_map(Action::Finish),
    ]
}

// ---------------------------------------------------------------- the model

#[derive(Debug, Clone)]
struct Promo {
    fields: BTreeMap<String, String>,
}

/// A promotion field that is not a canonical number (the Corrupt action).
const CORRUPT_FIELD: (&str, &str) = ("starts_at", "1e3");
const MAX_AMOUNT: u64 = 999_999_999_999_999;

impl Promo {
    fn num(&self, f: &str) -> Option<u64> {
        self.fields.get(f).map(|v| v.parse().unwrap())
    }
    fn corrupt(&self) -> bool {
        self.fields.get(CORRUPT_FIELD.0).map(String::as_str) == Some(CORRUPT_FIELD.1)
    }
    fn sub(&mut self, f: &str, by: u64) {
        if let Some(v) = self.num(f) {
            assert!(v >= by, "model went negative");
            self.fields.insert(f.into(), (v - by).to_string());
        }
    }
    /// A refund or release: never past the initial amount (nor the bound).
    fn credit(&mut self, f: &str, by: u64) {
        let Some(v) = self.num(f) else { return };
        let cap = self
            .num(&format!("initial_{f}"))
            .unwrap_or(MAX_AMOUNT)
            .min(MAX_AMOUNT);
        if by > 0 && v < cap {
            self.fields
                .insert(f.into(), (v + by.min(cap - v)).to_string());
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
    /// The customer the deduction counted for (None: a refund's tombstone).
    customer: Option<usize>,
    counted: Option<bool>,
    gen: Option<String>,
    absorbed: Option<String>,
    /// refund event -> stored result.
    refunds: BTreeMap<String, String>,
}

impl Rec {
    fn tombstone() -> Rec {
        Rec {
            reverted: true,
            event: None,
            budget: 0,
            stock: 0,
            budget0: 0,
            stock0: 0,
            customer: None,
            counted: None,
            gen: None,
            absorbed: None,
            refunds: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Default)]
struct Model {
    promos: BTreeMap<usize, Promo>,
    /// promotion -> its last incarnation number (key `promo:{P}:gen`).
    gens: BTreeMap<usize, u64>,
    /// promotion -> the highest per-customer limit it ever had.
    max_limit: BTreeMap<usize, u64>,
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
    /// (promotion, refund event): a refund line that met corrupt data
    /// (memo `refund:{E}` = "rejected corrupt_promotion").
    refund_corrupt: std::collections::BTreeSet<(usize, String)>,
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
    /// What a reply says the promotion has left (nothing when it is corrupt).
    fn remaining(&self, p: usize) -> Remaining {
        match self.promos.get(&p) {
            None => Remaining::default(),
            Some(pr) if pr.corrupt() => Remaining::default(),
            Some(pr) => Remaining {
                budget: pr.num("budget"),
                stock: pr.num("stock"),
            },
        }
    }

    fn corrupt(&self, p: usize) -> bool {
        self.promos.get(&p).is_some_and(Promo::corrupt)
    }

    /// What promo_set.lua does: a new incarnation.
    fn seeded(&mut self, p: usize, fields: BTreeMap<String, String>) {
        *self.gens.entry(p).or_insert(0) += 1;
        if let Some(n) = fields.get("per_customer") {
            let n = n.parse().unwrap();
            let m = self.max_limit.entry(p).or_insert(0);
            *m = (*m).max(n);
        }
        self.promos.insert(p, Promo { fields });
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
        if self.released.contains(&(p, e.to_owned())) {
            // Answered by the caller from the event's other lines.
            return line(Err(Reason::OrderReverted), true, 0, 0);
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
        // The record decides before the promotion is read.
        if let Some(rec) = self.records.get_mut(&(p, o)) {
            if !rec.reverted || rec.event.as_deref() == Some(e) {
                let (b0, s0) = (rec.budget0, rec.stock0);
                if rec.event.as_deref() != Some(e) {
                    if !rec.reverted && rec.absorbed.is_none() {
                        rec.absorbed = Some(e.to_owned());
                    }
                    self.absorbed.insert((p, e.to_owned()));
                }
                return line(Ok(()), true, b0, s0);
            }
        }
        if self.corrupt(p) {
            // Remembered: every later delivery repeats it.
            self.rejected
                .insert((p, e.to_owned()), Reason::CorruptPromotion);
            return line(Err(Reason::CorruptPromotion), false, 0, 0);
        }
        let reason = if self.records.contains_key(&(p, o)) {
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
        pr.sub("budget", b);
        pr.sub("stock", s);
        let counted = pr.num("per_customer").is_some();
        if counted {
            *self.used.entry((p, c)).or_insert(0) += 1;
        }
        let gen = pr.fields.get("gen").cloned();
        self.records.insert(
            (p, o),
            Rec {
                reverted: false,
                event: Some(e.to_owned()),
                budget: b,
                stock: s,
                budget0: b,
                stock0: s,
                customer: Some(c),
                counted: Some(counted),
                gen,
                absorbed: None,
                refunds: BTreeMap::new(),
            },
        );
        line(Ok(()), false, b, s)
    }

    /// release.lua; a line whose promotion is corrupt is skipped whole
    /// (the script refuses before writing anything, the ledger moves on).
    fn release(&mut self, p: usize, o: usize, c: usize, e: &str) {
        if self.corrupt(p) {
            return;
        }
        let key = (p, e.to_owned());
        if !self.rejected.contains_key(&key) {
            self.absorbed.remove(&key);
            self.released.insert(key);
        }
        let Some(rec) = self.records.get_mut(&(p, o)) else {
            return;
        };
        let absorbed = rec.absorbed.clone();
        if absorbed.as_deref() == Some(e) {
            rec.absorbed = None;
        }
        if rec.reverted || rec.event.as_deref() != Some(e) {
            return;
        }
        if let Some(a) = absorbed {
            // Handed over to the event absorbed into it.
            rec.event = Some(a);
            rec.absorbed = None;
            return;
        }
        let rec = rec.clone();
        if let Some(pr) = self.promos.get_mut(&p) {
            if pr.fields.get("gen") == rec.gen.as_ref() {
                pr.credit("budget", rec.budget);
                pr.credit("stock", rec.stock);
            }
        }
        let mine = rec.customer.is_none_or(|x| x == c);
        if mine && rec.counted != Some(false) {
            if let Some(u) = self.used.get_mut(&(p, c)) {
                *u = u.saturating_sub(1);
            }
        }
        if rec.refunds.is_empty() {
            self.records.remove(&(p, o));
        } else {
            let r = self.records.get_mut(&(p, o)).unwrap();
            r.reverted = true;
            r.budget = 0;
            r.stock = 0;
            r.event = None;
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
        let stored = |m: &Model, from: usize| {
            (from..ps.len()).find_map(|i| m.rejected.get(&(ps[i], ev.to_owned())).map(|r| (i, *r)))
        };
        if ps.len() > 1 {
            // The first line's stored rejection is answered by deduct step 0
            // (nothing of the event was deducted before its first line);
            // the other lines' are looked up before anything is deducted.
            if let Some((i, r)) = stored(self, 1) {
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
        let mut lines = Vec::new();
        let mut all_dup = true;
        for (i, l) in e.lines.iter().enumerate() {
            let released = self.released.contains(&(ps[i], ev.to_owned()));
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
                Err(_) if released => {
                    for q in &ps[..i] {
                        self.release(*q, o, c, ev);
                    }
                    let (j, reason) = stored(self, 0).unwrap_or((i, Reason::OrderReverted));
                    return PlaceDecision::Rejected {
                        duplicate: true,
                        reason,
                        promotion_id: e.lines[j].promotion_id.clone(),
                    };
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

    /// A delivery that deducts the first `upto` lines and dies.
    fn zombie(&mut self, e: &OrderPlaced, upto: usize) {
        let h = &e.header;
        let (o, c, ev) = (
            oidx(h.order_id.as_str()),
            cidx(h.customer_id.as_str()),
            h.event_id.as_str(),
        );
        for l in e.lines.iter().take(upto) {
            let p = pidx(l.promotion_id.as_str());
            self.deduct(p, o, c, ev, l.budget, l.stock, h.occurred_at);
        }
    }

    fn rollback(&mut self, p: usize, o: usize, e: &str, b: Option<u64>, s: Option<u64>) -> Line {
        let line = |status, duplicate, budget, stock| Line {
            status,
            duplicate,
            budget,
            stock,
        };
        if self.refund_corrupt.contains(&(p, e.to_owned())) {
            return line(Err(Reason::CorruptPromotion), true, 0, 0);
        }
        if let Some(stored) = self.records.get(&(p, o)).and_then(|r| r.refunds.get(e)) {
            let parts: Vec<&str> = stored.split(' ').collect();
            return match parts[..] {
                ["applied", b, s] => line(Ok(()), true, b.parse().unwrap(), s.parse().unwrap()),
                ["rejected", r] => line(Err(Reason::parse(r).unwrap()), true, 0, 0),
                _ => unreachable!("{stored}"),
            };
        }
        if self.corrupt(p) {
            // Remembered under the refund memo key: every delivery repeats it.
            self.refund_corrupt.insert((p, e.to_owned()));
            return line(Err(Reason::CorruptPromotion), false, 0, 0);
        }
        let rec = self.records.entry((p, o)).or_insert_with(|| {
            let mut t = Rec::tombstone();
            t.refunds
                .insert(e.to_owned(), "rejected no_deduction".into());
            t
        });
        if rec.refunds.contains_key(e) {
            return line(Err(Reason::NoDeduction), false, 0, 0);
        }
        let reject = |rec: &mut Rec, r: Reason| {
            rec.refunds.insert(e.to_owned(), format!("rejected {r}"));
            line(Err(r), false, 0, 0)
        };
        if rec.reverted {
            return reject(rec, Reason::AlreadyReverted);
        }
        let (b, s) = (b.unwrap_or(rec.budget), s.unwrap_or(rec.stock));
        if b > rec.budget || s > rec.stock {
            return reject(rec, Reason::ExceedsDeducted);
        }
        rec.budget -= b;
        rec.stock -= s;
        rec.refunds.insert(e.to_owned(), format!("applied {b} {s}"));
        let rec = rec.clone();
        if let Some(pr) = self.promos.get_mut(&p) {
            if pr.fields.get("gen") == rec.gen.as_ref() {
                pr.credit("budget", b);
                pr.credit("stock", s);
            }
        }
        if rec.budget == 0 && rec.stock == 0 {
            self.records.get_mut(&(p, o)).unwrap().reverted = true;
            // The customer the deduction counted for, whoever the refund names.
            let c = rec.customer.expect("a deducted record names its customer");
            if rec.counted != Some(false) {
                if let Some(u) = self.used.get_mut(&(p, c)) {
                    *u = u.saturating_sub(1);
                }
            }
        }
        line(Ok(()), false, b, s)
    }

    fn refund(&mut self, e: &OrderRefunded) -> RefundDecision {
        let h = &e.header;
        let (o, ev) = (oidx(h.order_id.as_str()), h.event_id.as_str());
        let lines = e
            .lines
            .iter()
            .map(|l| {
                let p = pidx(l.promotion_id.as_str());
                let r = self.rollback(p, o, ev, l.budget, l.stock);
                RefundLineResult {
                    promotion_id: l.promotion_id.clone(),
                    status: r.status,
                    duplicate: r.duplicate,
                    budget: r.budget,
                    stock: r.stock,
                    remaining: if self.corrupt(p) || r.status == Err(Reason::CorruptPromotion) {
                        Remaining::default()
                    } else {
                        self.remaining(p)
                    },
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
        for (i, n) in &self.gens {
            d.insert(
                keys.generation(&p(*i)),
                Dumped {
                    value: DumpedValue::String(n.to_string()),
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
            let mut put = |f: &str, v: Option<String>| {
                if let Some(v) = v {
                    h.insert(f.to_owned(), v);
                }
            };
            put("event", r.event.clone());
            put("customer", r.customer.map(|c| format!("c{c}")));
            put(
                "counted",
                r.counted.map(|c| if c { "1" } else { "0" }.to_owned()),
            );
            put("gen", r.gen.clone());
            put("absorbed", r.absorbed.clone());
            for (f, v) in [
                ("budget", r.budget),
                ("stock", r.stock),
                ("budget0", r.budget0),
                ("stock0", r.stock0),
            ] {
                h.insert(f.into(), v.to_string());
            }
            for (e, v) in &r.refunds {
                h.insert(format!("refund:{e}"), v.clone());
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
        for (i, e) in &self.refund_corrupt {
            d.insert(
                keys.refund(&p(*i), &id(e)),
                ttl(DumpedValue::String("rejected corrupt_promotion".into())),
            );
        }
        for (i, e) in &self.absorbed {
            d.insert(
                keys.rejected(&p(*i), &id(e)),
                ttl(DumpedValue::String("accepted".into())),
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
    for i in 0..specs().len() {
        seed(&r, &mut model, i, false).await;
    }
    // event id -> (event, first decision)
    let mut history: Vec<(Event, Decision)> = Vec::new();
    // Placements a zombie delivery left half done.
    let mut pending: Vec<OrderPlaced> = Vec::new();
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
            Action::Refund {
                order,
                lines,
                other_customer,
            } => {
                let lines: Vec<(&str, Option<u64>, Option<u64>)> =
                    lines.iter().map(|&(p, b, s)| (PROMOS[p], b, s)).collect();
                let customer = (order + usize::from(*other_customer)) % CUSTOMERS;
                Some(Event::Refunded(refunded(
                    &format!("e{step}"),
                    &format!("o{order}"),
                    &format!("c{customer}"),
                    &lines,
                )))
            }
            Action::Limit(p, limit) => {
                let key = keys.promotion(&id(PROMOS[*p]));
                let fields = &mut model.promos.get_mut(p).unwrap().fields;
                match limit {
                    Some(n) => {
                        r.hset(&key, &[("per_customer", &n.to_string())]).await;
                        fields.insert("per_customer".into(), n.to_string());
                        let m = model.max_limit.entry(*p).or_insert(0);
                        *m = (*m).max(*n);
                    }
                    None => {
                        let _: () = r.pool().hdel(&key, "per_customer").await.unwrap();
                        fields.remove("per_customer");
                    }
                }
                None
            }
            Action::Reseed(p, recreate) => {
                seed(&r, &mut model, *p, !*recreate).await;
                None
            }
            Action::Corrupt(on) => {
                let key = keys.promotion(&id(PROMOS[1]));
                let fields = &mut model.promos.get_mut(&1).unwrap().fields;
                if *on {
                    r.hset(&key, &[CORRUPT_FIELD]).await;
                    fields.insert(CORRUPT_FIELD.0.into(), CORRUPT_FIELD.1.into());
                } else {
                    let _: () = r.pool().hdel(&key, CORRUPT_FIELD.0).await.unwrap();
                    fields.remove(CORRUPT_FIELD.0);
                }
                None
            }
            Action::Zombie {
                order,
                t,
                lines,
                upto,
            } => {
                let lines: Vec<(&str, u64, u64)> =
                    lines.iter().map(|&(p, b, s)| (PROMOS[p], b, s)).collect();
                let e = placed(
                    &format!("e{step}"),
                    &format!("o{order}"),
                    &format!("c{}", order % CUSTOMERS),
                    *t,
                    &lines,
                );
                zombie(&r, &e, *upto).await;
                model.zombie(&e, *upto);
                pending.push(e);
                None
            }
            Action::Finish(ix) if !pending.is_empty() => {
                let i = ix.index(pending.len());
                Some(Event::Placed(pending.remove(i)))
            }
            Action::Finish(_) => None,
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
        check_invariant(&keys, &actual, &model)?;
        STEPS.fetch_add(1, Ordering::Relaxed);
    }
    CASES.fetch_add(1, Ordering::Relaxed);
    r.ledger.quit().await;
    Ok(())
}

/// `promo set` of promotion `i`'s spec: created (after a delete when
/// `force` is false and it exists) or force-replaced; a new incarnation.
async fn seed(r: &TestRedis, model: &mut Model, i: usize, force: bool) {
    let p = id(PROMOS[i]);
    if !force {
        r.del(&r.keys().promotion(&p)).await;
    }
    admin::promo_set(&r.ledger, &p, specs()[i].clone(), force)
        .await
        .unwrap();
    // The spec's fields as stored; `gen` is the model's own expectation
    // (the dump comparison checks it).
    let mut fields = r.hgetall(&r.keys().promotion(&p)).await;
    let gen = model.gens.get(&i).copied().unwrap_or(0) + 1;
    fields.insert("gen".into(), gen.to_string());
    model.seeded(i, fields);
}

/// A delivery that runs deduct.lua for the first `upto` lines, then dies.
async fn zombie(r: &TestRedis, e: &OrderPlaced, upto: usize) {
    let h = &e.header;
    for l in e.lines.iter().take(upto) {
        let k = r
            .keys()
            .deduct_line(&l.promotion_id, &h.order_id, &h.customer_id, &h.event_id);
        let args = vec![
            l.budget.to_string(),
            l.stock.to_string(),
            h.occurred_at.to_string(),
            h.event_id.to_string(),
            "2592000".to_owned(),
            "604800".to_owned(),
            h.customer_id.to_string(),
        ];
        // A corrupt line's error reply is what the zombie saw before dying.
        let _ = r.eval(scripts::DEDUCT.body, k.as_vec(), args).await;
    }
}

fn event_key(e: &Event) -> String {
    match e {
        Event::Placed(e) => e.header.event_id.to_string(),
        Event::Refunded(e) => e.header.event_id.to_string(),
    }
}

/// CONTRACT.md section 5, read from Redis alone: initial - remaining ==
/// outstanding of the current incarnation's records, 0 <= remaining <=
/// initial; no customer holds more counted orders than their counter, and
/// no counter is above the highest limit the promotion ever had.
fn check_invariant(keys: &Keys, dump: &Dump, model: &Model) -> Result<(), TestCaseError> {
    let hash = |k: &str| match dump.get(k).map(|d| &d.value) {
        Some(DumpedValue::Hash(h)) => Some(h.clone()),
        _ => None,
    };
    for (i, p) in PROMOS[..3].iter().enumerate() {
        let promo = hash(&keys.promotion(&id(p))).expect("promotion exists");
        let records = keys.record_pattern(&id(p));
        let prefix = records.trim_end_matches('*');
        let recs: Vec<&BTreeMap<String, String>> = dump
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, d)| match &d.value {
                DumpedValue::Hash(h) => h,
                other => panic!("record {other:?}"),
            })
            .collect();
        for dim in ["budget", "stock"] {
            let Some(left) = promo.get(dim) else { continue };
            let left: u64 = left
                .parse()
                .map_err(|_| TestCaseError::fail(format!("{p} {dim} = {left}")))?;
            let initial: u64 = promo[&format!("initial_{dim}")].parse().unwrap();
            prop_assert!(
                left <= initial,
                "{} {} {} > initial {}",
                p,
                dim,
                left,
                initial
            );
            let outstanding: u64 = recs
                .iter()
                .filter(|h| h.get("gen") == promo.get("gen"))
                .map(|h| h[dim].parse::<u64>().unwrap())
                .sum();
            prop_assert_eq!(initial - left, outstanding, "{} {}", p, dim);
        }
        let ceiling = model.max_limit.get(&i).copied();
        for c in 0..CUSTOMERS {
            let cust = format!("c{c}");
            let used = match dump.get(&keys.used(&id(p), &id(&cust))) {
                Some(Dumped {
                    value: DumpedValue::String(n),
                    ..
                }) => n.parse::<u64>().unwrap(),
                _ => 0,
            };
            let held = recs
                .iter()
                .filter(|h| {
                    h.get("state").map(String::as_str) == Some("deducted")
                        && h.get("customer") == Some(&cust)
                        && h.get("counted").map(String::as_str) == Some("1")
                })
                .count() as u64;
            prop_assert!(
                held <= used,
                "{} {} holds {} counted, used {}",
                p,
                cust,
                held,
                used
            );
            if let Some(max) = ceiling {
                prop_assert!(used <= max, "{} {} used {} > {}", p, cust, used, max);
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
