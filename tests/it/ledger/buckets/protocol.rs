//! The bucket protocol of docs/buckets.md, executable: each bucket's state
//! and its atomic steps (what one Lua call on slot `{P~k}` will do), and the
//! deliveries that walk them (what the service will do between calls).
//!
//! Every amount has both dimensions, budget and stock (`Units`): a line
//! needs both, from one bucket's units and the gifts it gathered, and a
//! short line is rejected on the first dimension the whole promotion
//! cannot cover, budget before stock (the contract's precedence).
//!
//! A placement is an order of one bucketed line, or of a bucketed line and
//! a line of a plain (unbucketed) promotion in either order (`Order`):
//! all or nothing, as docs/contract.md section 3 has it. When a line is
//! rejected, the lines before it are released (`release.lua`'s rule: what
//! the event deducted goes back, and the line is marked released so that a
//! slower delivery of the event repeats the decision).
//!
//! Corrupt data: one bucket's counters (its hash `promo:{P~k}`) may turn
//! unreadable for a while, until the operator repairs them (the model
//! keeps the true values behind `Bucket::corrupt`). Records, memos, gift
//! memos, reservations and the pending marks (a set of its own) are keys of
//! their own and stay readable. A step
//! that must read or write the counters of a corrupt bucket meets CORRUPT
//! and writes nothing. What the delivery does then:
//! - a step that decides (a line's first call at home, its final accept or
//!   reject, a refund's first look) decides `corrupt_promotion` and
//!   remembers it, as an unbucketed promotion does;
//! - a look or a give at another bucket counts it as unknown: the line may
//!   still be served from the healthy buckets, but it is never rejected
//!   short (that would claim a sold-out nobody can tell): it is rejected
//!   `corrupt_promotion` instead;
//! - a step that finishes what a decision started (a settle, an undo, a
//!   give-back, a cleanup, a refund's or a release's give-back, a
//!   transfer's step) backs off and retries: it cannot be decided any other
//!   way without losing or doubling units, and the repair lets it finish;
//! - notifications skip a corrupt bucket; the repair clears its bound and
//!   counts as a notification.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Add, AddAssign, Sub, SubAssign};

pub type Ev = u32;
pub type Cust = u32;

/// An amount of budget and of stock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Units {
    pub budget: i64,
    pub stock: i64,
}

/// The dimension a short line is rejected on: `budget_exceeded` or
/// `stock_insufficient`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    Budget,
    Stock,
}

impl Units {
    pub const ZERO: Units = Units {
        budget: 0,
        stock: 0,
    };

    pub fn new(budget: i64, stock: i64) -> Units {
        Units { budget, stock }
    }

    pub fn covers(self, need: Units) -> bool {
        self.short_of(need).is_none()
    }

    /// The first dimension, budget before stock, in which `self` cannot
    /// cover `need`.
    pub fn short_of(self, need: Units) -> Option<Dim> {
        if self.budget < need.budget {
            Some(Dim::Budget)
        } else if self.stock < need.stock {
            Some(Dim::Stock)
        } else {
            None
        }
    }

    pub fn get(self, d: Dim) -> i64 {
        match d {
            Dim::Budget => self.budget,
            Dim::Stock => self.stock,
        }
    }

    pub fn min(self, o: Units) -> Units {
        Units::new(self.budget.min(o.budget), self.stock.min(o.stock))
    }

    pub fn max(self, o: Units) -> Units {
        Units::new(self.budget.max(o.budget), self.stock.max(o.stock))
    }

    /// Each dimension at least 0.
    pub fn pos(self) -> Units {
        self.max(Units::ZERO)
    }

    pub fn any_pos(self) -> bool {
        self.budget > 0 || self.stock > 0
    }

    pub fn any_neg(self) -> bool {
        self.budget < 0 || self.stock < 0
    }

    /// `total` split over `k` buckets as `promo set --buckets K` will: the
    /// first buckets take the remainder.
    pub fn share(self, k: usize, i: usize) -> Units {
        let part = |t: i64| t / k as i64 + i64::from((i as i64) < t % k as i64);
        Units::new(part(self.budget), part(self.stock))
    }
}

impl Add for Units {
    type Output = Units;
    fn add(self, o: Units) -> Units {
        Units::new(self.budget + o.budget, self.stock + o.stock)
    }
}

impl Sub for Units {
    type Output = Units;
    fn sub(self, o: Units) -> Units {
        Units::new(self.budget - o.budget, self.stock - o.stock)
    }
}

impl AddAssign for Units {
    fn add_assign(&mut self, o: Units) {
        *self = *self + o;
    }
}

impl SubAssign for Units {
    fn sub_assign(&mut self, o: Units) {
        *self = *self - o;
    }
}

impl std::iter::Sum for Units {
    fn sum<I: Iterator<Item = Units>>(it: I) -> Units {
        it.fold(Units::ZERO, |a, b| a + b)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    Accepted(Units),
    /// Rejected `budget_exceeded` or `stock_insufficient`.
    Short(Dim),
    Limit,
    Refunded,
    /// Rejected `corrupt_promotion`: the line met a corrupt bucket.
    Corrupt,
    /// The plain line was short (an event's decision).
    PlainShort,
    /// A line's answer only, never an event's decision: the line was
    /// released for the event's rejection on another line.
    Released,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refund {
    Applied(Units),
    NoDeduction,
    AlreadyReverted,
    /// Rejected `corrupt_promotion` (the order's bucket was corrupt).
    Corrupt,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Placed(Placed),
    Refund(Refund),
    /// A transfer finished.
    Moved,
}

/// A deliberately broken piece of the protocol, to prove the checks catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    None,
    /// The final rejection after a gather writes no memo.
    NoShortMemo,
    /// A gather rejects although a notification came in while it looked
    /// (units were on their way somewhere it had already looked at).
    RejectIgnoresNotify,
    /// A refund adds its units without marking the bucket and notifying
    /// the others first.
    NoPendingMark,
    /// An adjustment adds units to a bucket without marking it and
    /// notifying the others first.
    AdjustNoNotify,
    /// A give takes units but leaves no gift memo (the "moved on" memo of
    /// the issue: nothing says where they went).
    NoGiftMemo,
    /// A release of a bucketed line gives its units back without marking
    /// the bucket and notifying the others first.
    NoReleaseMark,
    /// A gather that met a corrupt bucket counts it as empty and may
    /// reject the line short.
    CorruptCountsAsEmpty,
    /// A reservation counts the customer's freed slots (refunded or
    /// released orders) as used.
    ReserveCountsFreed,
    /// A refused reservation leaves nothing behind: a zombie delivery of
    /// the same order may take a slot after the refusal.
    RefusalForgotten,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// Taken, waiting for the customer's reservation: `own` units of the
    /// home bucket set aside (`Bucket::tentative`), the gifts not yet
    /// credited.
    Tentative {
        customer: Cust,
        units: Units,
        own: Units,
        credits: Vec<Credit>,
    },
    /// `credits`: every gift this deduction consumed.
    Deducted {
        customer: Cust,
        units: Units,
        credits: Vec<Credit>,
    },
    Reverted {
        customer: Cust,
        units: Units,
        credits: Vec<Credit>,
        by: Ev,
    },
    Tomb {
        by: Ev,
    },
    /// Released for the event's rejection on another line: nothing
    /// outstanding. `credits` stays, for the gifts' settlement.
    Released {
        customer: Cust,
        units: Units,
        credits: Vec<Credit>,
    },
}

/// A record of the plain promotion Q (slot `{Q}`), by order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlainRecord {
    Deducted(i64),
    /// Refunded after the event deducted it.
    Reverted(i64),
    /// A refund that found nothing: the order may not deduct here later.
    Tomb,
}

/// The plain promotion of the mixed orders: one slot, each step one call.
#[derive(Clone, Debug, Default)]
pub struct Plain {
    pub avail: i64,
    pub initial: i64,
    pub records: BTreeMap<Ev, PlainRecord>,
    /// A line's rejection (`PlainShort`, `Refunded`) or `Released`, by event.
    pub memos: BTreeMap<Ev, Placed>,
}

impl Plain {
    pub fn deducted(&self) -> i64 {
        self.records
            .values()
            .map(|r| match r {
                PlainRecord::Deducted(u) => *u,
                _ => 0,
            })
            .sum()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gift {
    Given(Units),
    Settled(Units),
    Returned,
}

#[derive(Clone, Debug, Default)]
pub struct Bucket {
    /// Units this bucket can deduct now.
    pub avail: Units,
    /// Units given away (to a line's gather or a transfer), not yet settled
    /// or returned.
    pub held: Units,
    /// Units set aside by tentative deductions (waiting for the
    /// customer's reservation).
    pub tentative: Units,
    /// Bumped whenever `avail` rises.
    pub incr: u64,
    /// Bumped by every notification of an increase elsewhere.
    pub notify: u64,
    /// Per other bucket j, while set: an upper bound on j's avail + held +
    /// set aside. Set by a gather's rejection for the buckets it looked at;
    /// raised by every notification of units on their way to j (a hint:
    /// the destination and at most how much).
    pub bounds: Vec<Option<Units>>,
    /// Ids (refunds, transfers) about to add units here.
    pub pending: BTreeSet<Ev>,
    /// Per-customer limit, at the customer's home bucket: the orders
    /// holding a reservation (`true`) or whose reservation was released
    /// (`false`: kept, so a late delivery cannot take it again), and the
    /// count of those holding one.
    pub used: BTreeMap<Cust, u32>,
    pub resv: BTreeMap<Ev, (Cust, bool)>,
    /// Orders refused their reservation (`user_limit_reached` decided
    /// here): a later delivery of the order is refused too, so no zombie
    /// takes a slot for an order already rejected.
    pub refused: BTreeSet<Ev>,
    /// Deduction records by order (= placement event id).
    pub records: BTreeMap<Ev, Record>,
    pub memos: BTreeMap<Ev, Placed>,
    pub refunds: BTreeMap<Ev, Refund>,
    /// The current gather attempt of each event homed here.
    pub attempt: BTreeMap<Ev, u32>,
    /// Gifts given from here: (event or transfer, attempt) -> state, receiver.
    pub gifts: BTreeMap<(Ev, u32), (Gift, usize)>,
    /// Transfers and adjustments credited here, with the units credited.
    pub credited_in: BTreeMap<Ev, Units>,
    /// Adjustments that took units away here, with the units taken.
    pub removed: BTreeMap<Ev, Units>,
    /// The counters are unreadable (corrupt data) until repaired.
    pub corrupt: bool,
}

#[derive(Clone, Debug)]
pub struct Ledger {
    pub b: Vec<Bucket>,
    pub limit: Option<u32>,
    pub initial: Units,
    /// Ghost state: the sum of the operator's adjustments applied so far
    /// (what `promo show` reports beside the initial amount).
    pub adjusted: Units,
    /// Ghost state, not in Redis: units off every bucket's books, by
    /// (event or transfer, attempt, source).
    pub transit: BTreeMap<(Ev, u32, usize), Units>,
    pub mutant: Mutant,
    /// Calls (Redis round trips) each bucket served: the cost model.
    pub calls: Vec<u64>,
    pub plain: Plain,
}

impl Ledger {
    fn touch(&mut self, j: usize) {
        self.calls[j] += 1;
    }

    pub fn new(k: usize, initial: Units, limit: Option<u32>, mutant: Mutant) -> Ledger {
        let mut b = vec![Bucket::default(); k];
        for (i, bucket) in b.iter_mut().enumerate() {
            bucket.avail = initial.share(k, i);
            bucket.bounds = vec![None; k];
        }
        Ledger {
            b,
            limit,
            initial,
            adjusted: Units::ZERO,
            transit: BTreeMap::new(),
            mutant,
            calls: vec![0; k],
            plain: Plain::default(),
        }
    }

    /// With a plain promotion of `stock` units beside the bucketed one.
    pub fn with_plain(mut self, stock: i64) -> Ledger {
        self.plain.avail = stock;
        self.plain.initial = stock;
        self
    }

    pub fn k(&self) -> usize {
        self.b.len()
    }

    /// Bucket j's counters turn unreadable.
    pub fn corrupt(&mut self, j: usize) {
        self.b[j].corrupt = true;
    }

    /// The operator repairs bucket j's counters: its bounds go (the
    /// notifications it missed), and that counts as a notification.
    pub fn repair(&mut self, j: usize) {
        let b = &mut self.b[j];
        b.corrupt = false;
        b.bounds.iter_mut().for_each(|x| *x = None);
        b.notify += 1;
    }

    /// The bucket that keeps customer C's reservations.
    pub fn home(&self, c: Cust) -> usize {
        c as usize % self.k()
    }

    /// The bucket that decides order O's lines and keeps its record.
    pub fn order_home(&self, o: Ev) -> usize {
        o as usize % self.k()
    }

    /// Units the promotion could still sell: in buckets and in transit.
    pub fn strict_total(&self) -> Units {
        self.b.iter().map(|b| b.avail + b.tentative).sum::<Units>()
            + self.transit.values().copied().sum::<Units>()
    }

    pub fn deducted(&self) -> Units {
        self.b
            .iter()
            .flat_map(|b| b.records.values())
            .map(|r| match r {
                Record::Deducted { units, .. } => *units,
                _ => Units::ZERO,
            })
            .sum()
    }

    /// Up to `units` are on their way to bucket j: every other bucket
    /// hears it and raises its bound of j by as much.
    fn notify_all_but(&mut self, j: usize, units: Units) {
        for (m, b) in self.b.iter_mut().enumerate() {
            if m != j && !b.corrupt {
                self.calls[m] += 1;
                b.notify += 1;
                if let Some(x) = b.bounds[j].as_mut() {
                    *x += units;
                }
            }
        }
    }

    /// A line's give at bucket j for (id, attempt a): up to `want` more
    /// units, added to what (id, a) already holds here. Replies with the
    /// total (id, a) holds here and whether a line with a lower id holds
    /// units here too (then this line is the junior and yields).
    fn give(&mut self, j: usize, id: Ev, a: u32, want: Units, receiver: usize) -> (Units, bool) {
        // A gift of an earlier attempt can never be credited (the home has
        // moved past it): a delivery that crashed before returning it left
        // it here. It goes back first.
        let stale: Vec<u32> = self.b[j]
            .gifts
            .range((id, 0)..(id, a))
            .filter(|(_, (g, _))| matches!(g, Gift::Given(_)))
            .map(|(k, _)| k.1)
            .collect();
        for old in stale {
            self.give_back(j, id, old);
        }
        let senior = self.b[j].senior_holds(id);
        let mutant = self.mutant;
        let b = &mut self.b[j];
        let had = match b.gifts.get(&(id, a)).map(|g| g.0) {
            Some(Gift::Given(x)) => x,
            // Decided (settled) or yielded (returned): nothing more.
            Some(Gift::Settled(x)) => return (x, senior),
            Some(Gift::Returned) => return (Units::ZERO, senior),
            None => Units::ZERO,
        };
        let g = b.avail.min(want).pos();
        b.avail -= g;
        b.held += g;
        if g.any_pos() {
            *self.transit.entry((id, a, j)).or_insert(Units::ZERO) += g;
        }
        if mutant == Mutant::NoGiftMemo {
            // The units leave, but nothing here says to whom.
            b.held -= g;
            return (had + g, senior);
        }
        b.gifts.insert((id, a), (Gift::Given(had + g), receiver));
        (had + g, senior)
    }

    /// Return gift (id, a) to bucket j, if it is still given.
    fn give_back(&mut self, j: usize, id: Ev, a: u32) {
        let b = &mut self.b[j];
        if let Some((Gift::Given(g), to)) = b.gifts.get(&(id, a)).copied() {
            if g.any_pos() {
                b.avail += g;
                b.held -= g;
                b.incr += 1;
            }
            b.gifts.insert((id, a), (Gift::Returned, to));
            self.transit.remove(&(id, a, j));
        }
    }

    /// Settle bucket j's gifts of event `id` after its decision: what the
    /// decision consumed is settled, the rest is returned.
    fn settle_event(&mut self, j: usize, id: Ev, credited: &[Credit]) {
        let keys: Vec<(Ev, u32)> = self.b[j]
            .gifts
            .range((id, 0)..=(id, u32::MAX))
            .map(|(k, _)| *k)
            .collect();
        for (e, a) in keys {
            let used: Units = credited
                .iter()
                .filter(|c| c.from == j && c.attempt == a)
                .map(|c| c.units)
                .sum();
            let b = &mut self.b[j];
            if let Some((Gift::Given(g), to)) = b.gifts.get(&(e, a)).copied() {
                let back = g - used;
                b.held -= g;
                if back.any_pos() {
                    b.avail += back;
                    b.incr += 1;
                    self.transit.remove(&(e, a, j));
                }
                b.gifts.insert((e, a), (Gift::Settled(used), to));
            }
        }
    }

    /// The sweeper (`promo rebalance` runs it first): settles or returns
    /// every gift of a decided event, and finishes every transfer.
    pub fn sweep(&mut self, transfers: &BTreeMap<Ev, (usize, usize, Units)>) {
        for j in 0..self.k() {
            if self.b[j].corrupt {
                continue;
            }
            let open: Vec<((Ev, u32), usize)> = self.b[j]
                .gifts
                .iter()
                .filter(|(_, (g, _))| matches!(g, Gift::Given(_)))
                .map(|(k, (_, to))| (*k, *to))
                .collect();
            for ((id, a), to) in open {
                if let Some(&(_, dest, n)) = transfers.get(&id) {
                    if self.b[dest].corrupt {
                        continue;
                    }
                    let mut t = Transfer::new(id, j, dest, n);
                    while t.step(self).is_none() {}
                    continue;
                }
                let home = &self.b[to];
                let credited = match home.records.get(&id) {
                    Some(Record::Deducted { credits, .. })
                    | Some(Record::Reverted { credits, .. })
                    | Some(Record::Released { credits, .. }) => Some(credits.clone()),
                    _ if home.memos.contains_key(&id) => Some(Vec::new()),
                    _ => None,
                };
                match credited {
                    Some(c) => self.settle_event(j, id, &c),
                    None if home.attempt.get(&id).is_some_and(|cur| *cur > a) => {
                        self.give_back(j, id, a)
                    }
                    None => {}
                }
            }
        }
    }
}

impl Bucket {
    /// Whether a line with an id lower than `id` holds units given here.
    fn senior_holds(&self, id: Ev) -> bool {
        self.gifts
            .range(..(id, 0))
            .any(|(_, (g, _))| matches!(g, Gift::Given(x) if x.any_pos()))
    }

    /// Release order O's reservation, if it holds one (idempotent: the
    /// entry stays, released, so a late delivery cannot take it again).
    fn release(&mut self, order: Ev) {
        if let Some((c, held)) = self.resv.get_mut(&order) {
            if *held {
                *held = false;
                if let Some(u) = self.used.get_mut(c) {
                    *u -= 1;
                }
            }
        }
    }

    /// A deduction of `order` goes back here (a refund's or a release's
    /// give-back): its units return, `incr` moves, and the record becomes
    /// `into(customer, units, credits)`. The customer and the units, if
    /// the order held a deduction.
    fn give_back(
        &mut self,
        order: Ev,
        into: impl FnOnce(Cust, Units, Vec<Credit>) -> Record,
    ) -> Option<(Cust, Units)> {
        let Some(Record::Deducted {
            customer,
            units,
            credits,
        }) = self.records.get(&order).cloned()
        else {
            return None;
        };
        self.avail += units;
        self.incr += 1;
        self.records.insert(order, into(customer, units, credits));
        Some((customer, units))
    }

    /// Whether `id` holds units given here, in any attempt.
    fn holds(&self, id: Ev) -> bool {
        self.gifts
            .range((id, 0)..=(id, u32::MAX))
            .any(|(_, (g, _))| matches!(g, Gift::Given(x) if x.any_pos()))
    }
}

/// A gift a deduction consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credit {
    pub from: usize,
    pub attempt: u32,
    pub units: Units,
}

/// What one step of a delivery reports to the harness.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Report {
    Running,
    /// Decided "short" at this step (fast path or after a gather), on
    /// dimension `dim`.
    Short {
        fast: bool,
        dim: Dim,
    },
    Done(Outcome),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum PStep {
    Hop1,
    Peek(usize),
    FinalReject,
    Give(usize),
    FinalAccept,
    /// Give up the attempt at home (the junior yields, or a stale delivery
    /// found the attempt moved on), then return every gift of the event.
    Yield,
    ReturnAll(usize),
    /// Take the customer's reservation at the customer's home bucket.
    Reserve,
    /// Reservation taken: the tentative deduction becomes a deduction.
    Settle,
    /// Limit reached: the tentative deduction is undone.
    Undo,
    /// Decided `user_limit_reached`: a reservation a late delivery took
    /// for this order (after a refund freed a slot) is released.
    Unreserve,
    Cleanup(usize),
}

/// One delivery of a placement line of the bucketed promotion.
#[derive(Clone, Debug)]
pub struct Place {
    pub ev: Ev,
    pub cust: Cust,
    pub units: Units,
    home: usize,
    step: PStep,
    a: u32,
    incr0: u64,
    notify0: u64,
    avail0: Units,
    held0: Units,
    /// (bucket, avail, held or set aside, this event holds units there)
    peeks: Vec<(usize, Units, Units, bool)>,
    /// The buckets this attempt looks at: every other one whose bound at
    /// home is unknown or above zero.
    to_peek: Vec<usize>,
    pending_seen: bool,
    /// A look met a corrupt bucket: this attempt cannot reject short.
    saw_corrupt: bool,
    junior: bool,
    /// What attempt `a` holds in each other bucket.
    mine: BTreeMap<usize, Units>,
    /// Other buckets where this event may hold gifts: where it gave, and
    /// where a look found gifts of it (an earlier delivery's). The cleanup
    /// visits these; gifts a crashed zombie left elsewhere are the
    /// sweeper's.
    holds_at: BTreeSet<usize>,
    credited: Vec<Credit>,
    outcome: Option<Placed>,
    cleanup: bool,
    waiting: bool,
    pub restarts: u32,
    /// Refusals of this delivery's reservation at the customer's bucket
    /// (where `user_limit_reached` is decided; Undo applies it).
    pub refusals: u32,
}

impl Place {
    pub fn new(ev: Ev, cust: Cust, units: Units, k: usize) -> Place {
        Place {
            ev,
            cust,
            units,
            home: ev as usize % k,
            step: PStep::Hop1,
            a: 0,
            incr0: 0,
            notify0: 0,
            avail0: Units::ZERO,
            held0: Units::ZERO,
            peeks: Vec::new(),
            to_peek: Vec::new(),
            pending_seen: false,
            saw_corrupt: false,
            junior: false,
            mine: BTreeMap::new(),
            holds_at: BTreeSet::new(),
            credited: Vec::new(),
            outcome: None,
            cleanup: false,
            waiting: false,
            restarts: 0,
            refusals: 0,
        }
    }

    /// What the other buckets held, as this attempt's looks saw it.
    fn peeked(&self) -> Units {
        self.peeks.iter().map(|p| p.1 + p.2).sum()
    }

    fn other(&self, l: &Ledger, i: usize) -> usize {
        (self.home + 1 + i) % l.k()
    }

    /// An earlier decision at home, if any: (outcome, credited gifts).
    fn decided(&self, l: &Ledger) -> Option<(Placed, Vec<Credit>)> {
        let b = &l.b[self.home];
        if let Some(d) = b.memos.get(&self.ev) {
            return Some((*d, Vec::new()));
        }
        match b.records.get(&self.ev) {
            Some(Record::Deducted { units, credits, .. })
            | Some(Record::Reverted { units, credits, .. }) => {
                Some((Placed::Accepted(*units), credits.clone()))
            }
            Some(Record::Released { credits, .. }) => Some((Placed::Released, credits.clone())),
            _ => None,
        }
    }

    /// Ends with `outcome`; an event that ever gathered settles its gifts
    /// in every other bucket first.
    fn finish(&mut self, l: &Ledger, outcome: Placed, credited: Vec<Credit>) -> Report {
        self.outcome = Some(outcome);
        self.credited = credited;
        if outcome == Placed::Limit && l.limit.is_some() {
            self.step = PStep::Unreserve;
            return Report::Running;
        }
        self.after_decision(l)
    }

    fn after_decision(&mut self, _l: &Ledger) -> Report {
        let outcome = self.outcome.expect("a decision before its cleanup");
        if let Some(&j) = self.holds_at.iter().next() {
            self.cleanup = true;
            self.step = PStep::Cleanup(j);
            Report::Running
        } else {
            Report::Done(Outcome::Placed(outcome))
        }
    }

    fn restart(&mut self) -> Report {
        self.restarts += 1;
        self.step = PStep::Hop1;
        Report::Running
    }

    /// Start again after a pause: units are on their way (a refund's or a
    /// transfer's, or a line's waiting for its reservation), so the line
    /// can be neither served nor rejected yet. The service backs off
    /// before it asks again.
    fn wait(&mut self) -> Report {
        self.waiting = true;
        self.restart()
    }

    /// Every look of the attempt is in: go on.
    fn looked(&mut self) -> Report {
        let total = self.avail0 + self.held0 + self.peeked();
        if total.covers(self.units) {
            // Enough units, some perhaps held by other lines: the lowest
            // event id among those holding goes first, the others give
            // theirs back and start again.
            self.step = if self.junior {
                PStep::Yield
            } else {
                PStep::Give(0)
            };
        } else if self.pending_seen {
            return self.wait();
        } else {
            self.step = PStep::FinalReject;
        }
        Report::Running
    }

    /// Decided `corrupt_promotion` at home (remembered under the memo).
    fn corrupt(&mut self, l: &mut Ledger) -> Report {
        l.b[self.home].memos.insert(self.ev, Placed::Corrupt);
        self.finish(l, Placed::Corrupt, Vec::new())
    }

    /// Whether the delivery is backing off (see `wait`).
    pub fn waiting(&self) -> bool {
        self.waiting
    }

    /// The checks every step at home makes before deciding anything: an
    /// earlier decision, a tombstone, a tentative deduction waiting for its
    /// reservation (then that is what this delivery finishes).
    fn home_checks(&mut self, l: &mut Ledger) -> Option<Report> {
        if let Some((d, c)) = self.decided(l) {
            return Some(self.finish(l, d, c));
        }
        let b = &mut l.b[self.home];
        match b.records.get(&self.ev) {
            Some(Record::Tomb { .. }) => {
                b.memos.insert(self.ev, Placed::Refunded);
                Some(self.finish(l, Placed::Refunded, Vec::new()))
            }
            Some(Record::Tentative { .. }) => {
                self.step = PStep::Reserve;
                Some(Report::Running)
            }
            _ => None,
        }
    }

    /// Take `own` units of the home bucket and the gifts `credits`: at once
    /// when the promotion has no per-customer limit, else tentatively until
    /// the customer's reservation is taken.
    fn take(&mut self, l: &mut Ledger, own: Units, credits: Vec<Credit>) -> Report {
        let b = &mut l.b[self.home];
        b.avail -= own;
        b.tentative += own;
        b.records.insert(
            self.ev,
            Record::Tentative {
                customer: self.cust,
                units: self.units,
                own,
                credits,
            },
        );
        if l.limit.is_some() {
            self.step = PStep::Reserve;
            Report::Running
        } else {
            self.settle(l)
        }
    }

    /// The tentative deduction at home becomes the deduction.
    fn settle(&mut self, l: &mut Ledger) -> Report {
        let b = &mut l.b[self.home];
        let Some(Record::Tentative {
            customer,
            units,
            own,
            credits,
        }) = b.records.get(&self.ev).cloned()
        else {
            return self.restart();
        };
        b.tentative -= own;
        b.records.insert(
            self.ev,
            Record::Deducted {
                customer,
                units,
                credits: credits.clone(),
            },
        );
        for c in &credits {
            let key = (self.ev, c.attempt, c.from);
            if let Some(t) = l.transit.get_mut(&key) {
                *t -= c.units;
                if *t == Units::ZERO {
                    l.transit.remove(&key);
                }
            }
        }
        self.finish(l, Placed::Accepted(units), credits)
    }

    pub fn step(&mut self, l: &mut Ledger) -> Report {
        let k = l.k();
        match self.step {
            PStep::Hop1 => {
                l.touch(self.home);
                self.waiting = false;
                if let Some(r) = self.home_checks(l) {
                    return r;
                }
                let h = self.home;
                if l.b[h].corrupt {
                    return self.corrupt(l);
                }
                let b = &mut l.b[h];
                if b.avail.covers(self.units) {
                    return self.take(l, self.units, Vec::new());
                }
                let bound: Option<Units> = (0..k)
                    .filter(|j| *j != h)
                    .map(|j| b.bounds[j])
                    .sum::<Option<Units>>();
                if let Some(bound) = bound {
                    let most = b.avail + b.held + b.tentative + bound;
                    if let (true, Some(dim)) = (b.pending.is_empty(), most.short_of(self.units)) {
                        b.memos.insert(self.ev, Placed::Short(dim));
                        let _ = self.finish(l, Placed::Short(dim), Vec::new());
                        return Report::Short { fast: true, dim };
                    }
                }
                if k == 1 {
                    if (b.tentative + b.held).any_pos() || !b.pending.is_empty() {
                        // Units set aside for a line still waiting for its
                        // reservation may come back: not short yet.
                        return self.wait();
                    }
                    let dim = b.avail.short_of(self.units).unwrap_or(Dim::Stock);
                    b.memos.insert(self.ev, Placed::Short(dim));
                    self.outcome = Some(Placed::Short(dim));
                    return Report::Short { fast: false, dim };
                }
                let a = *b.attempt.entry(self.ev).or_insert(0);
                if a != self.a {
                    self.mine.clear();
                }
                self.a = a;
                self.incr0 = b.incr;
                self.notify0 = b.notify;
                self.avail0 = b.avail;
                self.held0 = b.held + b.tentative;
                self.pending_seen = !b.pending.is_empty();
                self.saw_corrupt = false;
                self.junior = b.senior_holds(self.ev);
                self.peeks.clear();
                // A bucket whose bound is zero in every dimension the line
                // is missing has nothing for it, and nothing can reach it
                // unheard: no need to look.
                let missing = (self.units - self.avail0 - self.held0).pos();
                self.to_peek = (0..k - 1)
                    .map(|i| self.other(l, i))
                    .filter(|j| !matches!(l.b[h].bounds[*j], Some(x) if !x.min(missing).any_pos()))
                    .collect();
                if self.to_peek.is_empty() {
                    return self.looked();
                }
                self.step = PStep::Peek(0);
                Report::Running
            }
            PStep::Peek(i) => {
                let j = self.to_peek[i];
                l.touch(j);
                let b = &l.b[j];
                if b.corrupt {
                    // Unknown: served from the others, never short.
                    if l.mutant != Mutant::CorruptCountsAsEmpty {
                        self.saw_corrupt = true;
                    }
                    self.peeks
                        .push((j, Units::ZERO, Units::ZERO, b.holds(self.ev)));
                } else {
                    self.peeks
                        .push((j, b.avail, b.held + b.tentative, b.holds(self.ev)));
                }
                if b.holds(self.ev) {
                    self.holds_at.insert(j);
                }
                self.pending_seen |= !b.pending.is_empty();
                self.junior |= b.senior_holds(self.ev);
                if i + 1 < self.to_peek.len() {
                    self.step = PStep::Peek(i + 1);
                    return Report::Running;
                }
                self.looked()
            }
            PStep::FinalReject => {
                l.touch(self.home);
                if let Some(r) = self.home_checks(l) {
                    return r;
                }
                if l.b[self.home].corrupt {
                    return self.corrupt(l);
                }
                let mutant = l.mutant;
                let bound = self.peeked();
                let b = &mut l.b[self.home];
                // Every way units reach a bucket (a refund, a transfer)
                // notifies every other bucket before they arrive, and marks
                // the bucket they go to: a line whose home heard nothing
                // while it looked saw every unit there was.
                let heard = b.notify != self.notify0 && mutant != Mutant::RejectIgnoresNotify;
                if b.attempt.get(&self.ev) != Some(&self.a)
                    || b.incr != self.incr0
                    || !b.pending.is_empty()
                    || heard
                {
                    return self.restart();
                }
                if self.saw_corrupt {
                    return self.corrupt(l);
                }
                // The first dimension all of it could not cover.
                let dim = (self.avail0 + self.held0 + bound)
                    .short_of(self.units)
                    .unwrap_or(Dim::Stock);
                if mutant != Mutant::NoShortMemo {
                    b.memos.insert(self.ev, Placed::Short(dim));
                }
                // What it saw bounds each bucket it looked at; the others
                // keep theirs (zero in what the line was missing).
                for &(j, avail, held, _) in &self.peeks {
                    b.bounds[j] = Some(avail + held);
                }
                let _ = self.finish(l, Placed::Short(dim), Vec::new());
                Report::Short { fast: false, dim }
            }
            PStep::Give(i) => {
                let missing =
                    (self.units - self.avail0 - self.mine.values().copied().sum::<Units>()).pos();
                if !missing.any_pos() || i >= self.peeks.len() {
                    self.step = PStep::FinalAccept;
                    return Report::Running;
                }
                let (j, avail, _, mine) = self.peeks[i];
                self.step = PStep::Give(i + 1);
                if (avail.min(missing).any_pos() || mine) && !l.b[j].corrupt {
                    l.touch(j);
                    let (total, senior) = l.give(j, self.ev, self.a, missing, self.home);
                    self.mine.insert(j, total);
                    self.holds_at.insert(j);
                    if senior {
                        self.step = PStep::Yield;
                    }
                }
                Report::Running
            }
            PStep::FinalAccept => {
                l.touch(self.home);
                if let Some(r) = self.home_checks(l) {
                    return r;
                }
                if l.b[self.home].corrupt {
                    return self.corrupt(l);
                }
                let b = &mut l.b[self.home];
                if b.attempt.get(&self.ev) != Some(&self.a) {
                    self.step = PStep::Yield;
                    return Report::Running;
                }
                let sum: Units = self.mine.values().copied().sum();
                if !(b.avail + sum).covers(self.units) {
                    // Units went elsewhere meanwhile: look again, keeping
                    // what this attempt holds.
                    return self.restart();
                }
                // The home's own units first, then only as much of the
                // gifts as the line still needs: the rest stays with its
                // source and goes back there at the cleanup. (Crediting a
                // surplus here would move units between buckets behind the
                // bounds' back.)
                let from_home = b.avail.min(self.units);
                let mut need = self.units - from_home;
                let mut credits: Vec<Credit> = Vec::new();
                for (j, u) in &self.mine {
                    let take = need.min(*u);
                    if take.any_pos() {
                        credits.push(Credit {
                            from: *j,
                            attempt: self.a,
                            units: take,
                        });
                        need -= take;
                    }
                }
                self.take(l, from_home, credits)
            }
            PStep::Yield => {
                l.touch(self.home);
                // Decided meanwhile (by another delivery): the decision's
                // cleanup settles, never a blind return.
                if let Some(r) = self.home_checks(l) {
                    return r;
                }
                let b = &mut l.b[self.home];
                if b.attempt.get(&self.ev) == Some(&self.a) {
                    b.attempt.insert(self.ev, self.a + 1);
                }
                self.step = PStep::ReturnAll(0);
                Report::Running
            }
            PStep::ReturnAll(i) => {
                let j = self.other(l, i);
                l.touch(j);
                if l.b[j].corrupt {
                    // Back off: the give-back waits for the repair.
                    return Report::Running;
                }
                for a in 0..=self.a {
                    l.give_back(j, self.ev, a);
                }
                if i + 2 < k {
                    self.step = PStep::ReturnAll(i + 1);
                    return Report::Running;
                }
                self.mine.clear();
                self.restart()
            }
            PStep::Reserve => {
                let hc = l.home(self.cust);
                l.touch(hc);
                let limit = l.limit.unwrap_or(u32::MAX);
                let b = &mut l.b[hc];
                let ok = if b.refused.contains(&self.ev) {
                    // Decided before: the same answer (no new count).
                    false
                } else if b.resv.contains_key(&self.ev) {
                    // Taken before (or taken and released by a refund: the
                    // order is decided, and Settle finds that).
                    true
                } else if l.mutant == Mutant::ReserveCountsFreed
                    && b.resv.values().filter(|r| r.0 == self.cust).count() as u32 >= limit
                {
                    self.refusals += 1;
                    b.refused.insert(self.ev);
                    false
                } else if b.used.get(&self.cust).copied().unwrap_or(0) < limit {
                    b.resv.insert(self.ev, (self.cust, true));
                    *b.used.entry(self.cust).or_insert(0) += 1;
                    true
                } else {
                    self.refusals += 1;
                    if l.mutant != Mutant::RefusalForgotten {
                        b.refused.insert(self.ev);
                    }
                    false
                };
                self.step = if ok { PStep::Settle } else { PStep::Undo };
                Report::Running
            }
            PStep::Settle => {
                l.touch(self.home);
                if let Some((d, c)) = self.decided(l) {
                    return self.finish(l, d, c);
                }
                if l.b[self.home].corrupt {
                    return Report::Running;
                }
                self.settle(l)
            }
            PStep::Undo => {
                l.touch(self.home);
                if let Some((d, c)) = self.decided(l) {
                    return self.finish(l, d, c);
                }
                if l.b[self.home].corrupt {
                    return Report::Running;
                }
                let b = &mut l.b[self.home];
                if let Some(Record::Tentative { own, .. }) = b.records.get(&self.ev).cloned() {
                    b.records.remove(&self.ev);
                    b.tentative -= own;
                    if own.any_pos() {
                        b.avail += own;
                        b.incr += 1;
                    }
                    b.memos.insert(self.ev, Placed::Limit);
                    // The gifts were never credited: the cleanup returns them.
                    return self.finish(l, Placed::Limit, Vec::new());
                }
                self.restart()
            }
            PStep::Unreserve => {
                let hc = l.home(self.cust);
                l.touch(hc);
                l.b[hc].release(self.ev);
                self.after_decision(l)
            }
            PStep::Cleanup(j) => {
                l.touch(j);
                if l.b[j].corrupt {
                    return Report::Running;
                }
                let credited = self.credited.clone();
                l.settle_event(j, self.ev, &credited);
                if let Some(&next) = self.holds_at.range(j + 1..).next() {
                    self.step = PStep::Cleanup(next);
                    return Report::Running;
                }
                Report::Done(Outcome::Placed(
                    self.outcome.expect("a decision before its cleanup"),
                ))
            }
        }
    }

    pub fn cleaning(&self) -> bool {
        self.cleanup
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum RStep {
    /// The order's plain line first (a mixed order), one call at `{Q}`.
    Plain,
    Look,
    Notify(Units),
    Revert,
    Release(Cust, Units),
}

/// One delivery of a refund of order `order`. The customer it names plays
/// no part: the order's bucket keeps the stored one.
#[derive(Clone, Debug)]
pub struct RefundRun {
    pub ev: Ev,
    pub order: Ev,
    /// The customer the refund names (may be another than the order's).
    #[allow(dead_code)]
    pub named: Cust,
    step: RStep,
}

impl RefundRun {
    pub fn new(ev: Ev, order: Ev, named: Cust) -> RefundRun {
        RefundRun {
            ev,
            order,
            named,
            step: RStep::Look,
        }
    }

    /// A refund of a mixed order: its plain line too (first).
    pub fn with_plain(mut self) -> RefundRun {
        self.step = RStep::Plain;
        self
    }

    pub fn step(&mut self, l: &mut Ledger) -> Report {
        let h = l.order_home(self.order);
        match self.step {
            RStep::Plain => {
                // rollback.lua on the plain line: revert a deduction, or
                // leave a tombstone so the order cannot deduct here later.
                let q = &mut l.plain;
                match q.records.get(&self.order).copied() {
                    Some(PlainRecord::Deducted(u)) => {
                        q.avail += u;
                        q.records.insert(self.order, PlainRecord::Reverted(u));
                    }
                    Some(_) => {}
                    None => {
                        q.records.insert(self.order, PlainRecord::Tomb);
                    }
                }
                self.step = RStep::Look;
                Report::Running
            }
            RStep::Look => {
                l.touch(h);
                let mutant = l.mutant;
                let b = &mut l.b[h];
                if b.refunds.get(&self.ev) == Some(&Refund::Corrupt) {
                    return Report::Done(Outcome::Refund(Refund::Corrupt));
                }
                match b.records.get(&self.order).cloned() {
                    Some(Record::Reverted {
                        by,
                        customer,
                        units,
                        ..
                    }) if by == self.ev => {
                        // Reverted by this refund: a mark it left goes, and
                        // the reservation is released (again: idempotent).
                        b.pending.remove(&self.ev);
                        self.step = RStep::Release(customer, units);
                    }
                    Some(Record::Reverted { .. }) => {
                        b.pending.remove(&self.ev);
                        return Report::Done(Outcome::Refund(Refund::AlreadyReverted));
                    }
                    Some(Record::Deducted { .. }) if b.corrupt => {
                        // rollback.lua's corrupt data: rejected and
                        // remembered; a mark an earlier delivery left goes.
                        b.pending.remove(&self.ev);
                        b.refunds.insert(self.ev, Refund::Corrupt);
                        return Report::Done(Outcome::Refund(Refund::Corrupt));
                    }
                    Some(Record::Deducted { units, .. }) => {
                        // Units are about to come back here: mark first, so
                        // no gather rejects while they are on their way.
                        if mutant == Mutant::NoPendingMark {
                            self.step = RStep::Revert;
                        } else {
                            b.pending.insert(self.ev);
                            self.step = RStep::Notify(units);
                        }
                    }
                    // A placement still waiting for its reservation (a
                    // zombie delivery): look again once it has settled.
                    Some(Record::Tentative { .. }) => {}
                    // Released for the event's rejection (perhaps after a
                    // crashed delivery of this refund marked the bucket).
                    Some(Record::Released { .. }) => {
                        b.pending.remove(&self.ev);
                        return Report::Done(Outcome::Refund(Refund::NoDeduction));
                    }
                    Some(Record::Tomb { .. }) => {
                        return Report::Done(Outcome::Refund(Refund::NoDeduction))
                    }
                    None => {
                        b.records.insert(self.order, Record::Tomb { by: self.ev });
                        b.refunds.insert(self.ev, Refund::NoDeduction);
                        return Report::Done(Outcome::Refund(Refund::NoDeduction));
                    }
                }
                Report::Running
            }
            RStep::Notify(units) => {
                l.notify_all_but(h, units);
                self.step = RStep::Revert;
                Report::Running
            }
            RStep::Revert => {
                l.touch(h);
                let b = &mut l.b[h];
                b.pending.remove(&self.ev);
                if b.refunds.get(&self.ev) == Some(&Refund::Corrupt) {
                    return Report::Done(Outcome::Refund(Refund::Corrupt));
                }
                if b.corrupt && matches!(b.records.get(&self.order), Some(Record::Deducted { .. }))
                {
                    b.refunds.insert(self.ev, Refund::Corrupt);
                    return Report::Done(Outcome::Refund(Refund::Corrupt));
                }
                let by = self.ev;
                let back = b.give_back(self.order, |customer, units, credits| Record::Reverted {
                    customer,
                    units,
                    credits,
                    by,
                });
                match back {
                    Some((customer, units)) => {
                        b.refunds.insert(self.ev, Refund::Applied(units));
                        self.step = RStep::Release(customer, units);
                    }
                    None => self.step = RStep::Look,
                }
                Report::Running
            }
            RStep::Release(customer, units) => {
                let hc = l.home(customer);
                l.touch(hc);
                l.b[hc].release(self.order);
                Report::Done(Outcome::Refund(Refund::Applied(units)))
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum TStep {
    Mark,
    Notify,
    Take,
    Credit(Units),
    Settle(Units),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum AStep {
    Mark(usize),
    Notify(usize),
    Credit(usize),
    Remove(usize),
}

/// One run of the operator's `promo adjust` on a bucketed promotion: `n`
/// added (or taken away) spread over the buckets as `promo set` splits an
/// amount, bucket by bucket. Adding walks each bucket as a transfer from
/// outside: mark it, notify the others (their bounds of it rise by its
/// share), credit it once. Taking away takes at most what the bucket holds
/// free, once per adjustment (what was taken is remembered, and reported).
#[derive(Clone, Debug)]
pub struct Adjust {
    pub id: Ev,
    pub n: Units,
    pub add: bool,
    step: AStep,
}

impl Adjust {
    pub fn new(id: Ev, n: Units, add: bool) -> Adjust {
        Adjust {
            id,
            n,
            add,
            step: if add {
                AStep::Mark(0)
            } else {
                AStep::Remove(0)
            },
        }
    }

    fn next(&mut self, l: &Ledger, j: usize) -> Option<()> {
        if j + 1 == l.k() {
            return Some(());
        }
        self.step = if self.add {
            AStep::Mark(j + 1)
        } else {
            AStep::Remove(j + 1)
        };
        None
    }

    /// One step; `Some(())` once finished.
    pub fn step(&mut self, l: &mut Ledger) -> Option<()> {
        let k = l.k();
        match self.step {
            AStep::Mark(j) => {
                l.touch(j);
                let mutant = l.mutant;
                let b = &mut l.b[j];
                if b.credited_in.contains_key(&self.id) {
                    return self.next(l, j);
                }
                if mutant == Mutant::AdjustNoNotify {
                    self.step = AStep::Credit(j);
                } else {
                    b.pending.insert(self.id);
                    self.step = AStep::Notify(j);
                }
            }
            AStep::Notify(j) => {
                l.notify_all_but(j, self.n.share(k, j));
                self.step = AStep::Credit(j);
            }
            AStep::Credit(j) if l.b[j].corrupt => {}
            AStep::Credit(j) => {
                l.touch(j);
                let share = self.n.share(k, j);
                let b = &mut l.b[j];
                b.pending.remove(&self.id);
                if let Entry::Vacant(e) = b.credited_in.entry(self.id) {
                    e.insert(share);
                    b.avail += share;
                    b.incr += 1;
                    l.adjusted += share;
                }
                return self.next(l, j);
            }
            AStep::Remove(j) if l.b[j].corrupt => {}
            AStep::Remove(j) => {
                l.touch(j);
                let share = self.n.share(k, j);
                let b = &mut l.b[j];
                if let Entry::Vacant(e) = b.removed.entry(self.id) {
                    let g = b.avail.min(share).pos();
                    b.avail -= g;
                    e.insert(g);
                    l.adjusted -= g;
                }
                return self.next(l, j);
            }
        }
        None
    }
}

/// One run of an operator's transfer of `n` units from bucket `from` to
/// bucket `to` (what `promo rebalance` does for each pair).
#[derive(Clone, Debug)]
pub struct Transfer {
    pub id: Ev,
    pub from: usize,
    pub to: usize,
    pub n: Units,
    step: TStep,
}

impl Transfer {
    pub fn new(id: Ev, from: usize, to: usize, n: Units) -> Transfer {
        Transfer {
            id,
            from,
            to,
            n,
            step: TStep::Mark,
        }
    }

    /// One step; `Some(())` once finished.
    pub fn step(&mut self, l: &mut Ledger) -> Option<()> {
        match self.step {
            TStep::Mark => {
                l.touch(self.to);
                let b = &mut l.b[self.to];
                if let Some(c) = b.credited_in.get(&self.id) {
                    self.step = TStep::Settle(*c);
                } else {
                    b.pending.insert(self.id);
                    self.step = TStep::Notify;
                }
            }
            TStep::Notify => {
                l.notify_all_but(self.to, self.n);
                self.step = TStep::Take;
            }
            TStep::Take if l.b[self.from].corrupt => {}
            TStep::Credit(_) if l.b[self.to].corrupt => {}
            TStep::Settle(_) if l.b[self.from].corrupt => {}
            TStep::Take => {
                l.touch(self.from);
                // Once per transfer: the amount is fixed by the first take
                // (nothing taken is remembered too).
                let b = &mut l.b[self.from];
                let g = match b.gifts.get(&(self.id, 0)).map(|g| g.0) {
                    Some(Gift::Given(x)) | Some(Gift::Settled(x)) => x,
                    Some(Gift::Returned) => Units::ZERO,
                    None => {
                        let g = b.avail.min(self.n).pos();
                        b.avail -= g;
                        b.held += g;
                        b.gifts.insert((self.id, 0), (Gift::Given(g), self.to));
                        if g.any_pos() {
                            l.transit.insert((self.id, 0, self.from), g);
                        }
                        g
                    }
                };
                self.step = TStep::Credit(g);
            }
            TStep::Credit(g) => {
                l.touch(self.to);
                let b = &mut l.b[self.to];
                b.pending.remove(&self.id);
                let c = *b.credited_in.entry(self.id).or_insert_with(|| {
                    if g.any_pos() {
                        b.avail += g;
                        b.incr += 1;
                        l.transit.remove(&(self.id, 0, self.from));
                    }
                    g
                });
                self.step = TStep::Settle(c);
            }
            TStep::Settle(c) => {
                l.touch(self.from);
                let b = &mut l.b[self.from];
                if let Some((Gift::Given(g), to)) = b.gifts.get(&(self.id, 0)).copied() {
                    b.held -= g;
                    if (g - c).any_pos() {
                        b.avail += g - c;
                        b.incr += 1;
                        l.transit.remove(&(self.id, 0, self.from));
                    }
                    b.gifts.insert((self.id, 0), (Gift::Settled(c), to));
                }
                return Some(());
            }
        }
        None
    }
}

/// A line of an order: the bucketed promotion's (its units are the
/// `Place`'s), or the plain promotion's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Line {
    Bucket,
    Plain(i64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum OStep {
    /// Deciding line `i`, in order.
    Line(usize),
    /// A line answered `released`: the event was rejected on another line.
    /// Its reason is read from the other lines' memos (one round trip, as
    /// the service's memo lookup).
    ReadReason,
    /// Releasing line `i` (the lines before the rejecting one, in order).
    Release(usize),
    /// The bucketed line's release, at the order's bucket and then the
    /// customer's: mark, notify, give back, release the reservation.
    RelNotify(usize, Units),
    RelRevert(usize),
    RelUnreserve(usize, Cust),
    Finished,
}

/// One delivery of an order: its lines in order, all or nothing.
#[derive(Clone, Debug)]
pub struct Order {
    pub lines: Vec<Line>,
    pub place: Place,
    step: OStep,
    /// The lines before this one are released.
    upto: usize,
    reason: Option<Placed>,
}

impl Order {
    pub fn new(place: Place, lines: Vec<Line>) -> Order {
        Order {
            lines,
            place,
            step: OStep::Line(0),
            upto: 0,
            reason: None,
        }
    }

    /// Whether work is left after the decision (the bucketed line's
    /// cleanup, releases).
    pub fn cleaning(&self) -> bool {
        self.step != OStep::Finished
    }

    fn ev(&self) -> Ev {
        self.place.ev
    }

    /// Line i answered `p`.
    fn answer(&mut self, i: usize, p: Placed) -> Report {
        match p {
            Placed::Accepted(_) => {
                self.step = OStep::Line(i + 1);
                Report::Running
            }
            Placed::Released => {
                self.step = OStep::ReadReason;
                Report::Running
            }
            reason => self.reject(i, reason),
        }
    }

    /// The event is rejected at line i: release the lines before it.
    fn reject(&mut self, i: usize, reason: Placed) -> Report {
        self.reason = Some(reason);
        self.upto = i;
        self.next_release(0)
    }

    fn next_release(&mut self, from: usize) -> Report {
        if from < self.upto {
            self.step = OStep::Release(from);
            Report::Running
        } else {
            self.step = OStep::Finished;
            Report::Done(Outcome::Placed(self.reason.unwrap_or(Placed::Released)))
        }
    }

    pub fn step(&mut self, l: &mut Ledger) -> Report {
        let ev = self.ev();
        match self.step {
            OStep::Line(i) if i == self.lines.len() => {
                self.step = OStep::Finished;
                Report::Done(Outcome::Placed(Placed::Accepted(self.place.units)))
            }
            OStep::Line(i) => match self.lines[i] {
                Line::Plain(u) => {
                    let p = plain_deduct(&mut l.plain, ev, u);
                    self.answer(i, p)
                }
                Line::Bucket => match self.place.step(l) {
                    Report::Running => Report::Running,
                    Report::Short { fast, dim } => {
                        // Decided here; a cleanup of its gifts still runs
                        // (and ends in Done(Short), answered then).
                        if !self.place.cleaning() {
                            let _ = self.reject(i, Placed::Short(dim));
                        }
                        Report::Short { fast, dim }
                    }
                    Report::Done(Outcome::Placed(p)) => self.answer(i, p),
                    Report::Done(o) => unreachable!("a placement ended {o:?}"),
                },
            },
            OStep::ReadReason => {
                let h = l.order_home(ev);
                l.touch(h);
                let mut found = None;
                for (i, line) in self.lines.iter().enumerate() {
                    let memo = match line {
                        Line::Plain(_) => l.plain.memos.get(&ev),
                        Line::Bucket => l.b[h].memos.get(&ev),
                    };
                    if let Some(&m) = memo.filter(|m| **m != Placed::Released) {
                        found = Some((i, m));
                        break;
                    }
                }
                match found {
                    Some((i, reason)) => self.reject(i, reason),
                    // No line holds a reason: a broken protocol (the
                    // property test sees two different decisions).
                    None => {
                        self.step = OStep::Finished;
                        Report::Done(Outcome::Placed(Placed::Released))
                    }
                }
            }
            OStep::Release(i) => match self.lines[i] {
                Line::Plain(_) => {
                    plain_release(&mut l.plain, ev);
                    self.next_release(i + 1)
                }
                Line::Bucket => {
                    let h = l.order_home(ev);
                    l.touch(h);
                    let mutant = l.mutant;
                    let b = &mut l.b[h];
                    match b.records.get(&ev).cloned() {
                        Some(Record::Deducted { units, .. }) => {
                            // Units are about to come back here: mark first,
                            // as a refund does.
                            if mutant == Mutant::NoReleaseMark {
                                self.step = OStep::RelRevert(i);
                            } else {
                                b.pending.insert(ev);
                                self.step = OStep::RelNotify(i, units);
                            }
                            Report::Running
                        }
                        Some(Record::Released { customer, .. }) => {
                            b.pending.remove(&ev);
                            self.step = OStep::RelUnreserve(i, customer);
                            Report::Running
                        }
                        // Reverted by a refund meanwhile, or nothing of
                        // this event here: nothing to give back.
                        _ => {
                            b.pending.remove(&ev);
                            self.next_release(i + 1)
                        }
                    }
                }
            },
            OStep::RelNotify(i, units) => {
                l.notify_all_but(l.order_home(ev), units);
                self.step = OStep::RelRevert(i);
                Report::Running
            }
            OStep::RelRevert(i) => {
                let h = l.order_home(ev);
                l.touch(h);
                if l.b[h].corrupt {
                    // The event is decided: what it took must go back. The
                    // release waits for the repair.
                    return Report::Running;
                }
                let b = &mut l.b[h];
                b.pending.remove(&ev);
                let back = b.give_back(ev, |customer, units, credits| Record::Released {
                    customer,
                    units,
                    credits,
                });
                if let Some((customer, _)) = back {
                    self.step = OStep::RelUnreserve(i, customer);
                    return Report::Running;
                }
                match b.records.get(&ev) {
                    Some(&Record::Released { customer, .. }) => {
                        self.step = OStep::RelUnreserve(i, customer);
                        Report::Running
                    }
                    _ => self.next_release(i + 1),
                }
            }
            OStep::RelUnreserve(i, customer) => {
                let hc = l.home(customer);
                l.touch(hc);
                l.b[hc].release(ev);
                self.next_release(i + 1)
            }
            OStep::Finished => unreachable!("a finished order stepped"),
        }
    }
}

/// deduct.lua on the plain line of event (= order) `ev`: one call at `{Q}`.
fn plain_deduct(q: &mut Plain, ev: Ev, u: i64) -> Placed {
    if let Some(&m) = q.memos.get(&ev) {
        return m;
    }
    match q.records.get(&ev) {
        Some(PlainRecord::Deducted(x)) | Some(PlainRecord::Reverted(x)) => {
            return Placed::Accepted(Units::new(0, *x))
        }
        Some(PlainRecord::Tomb) => {
            q.memos.insert(ev, Placed::Refunded);
            return Placed::Refunded;
        }
        None => {}
    }
    if q.avail >= u {
        q.avail -= u;
        q.records.insert(ev, PlainRecord::Deducted(u));
        Placed::Accepted(Units::new(0, u))
    } else {
        q.memos.insert(ev, Placed::PlainShort);
        Placed::PlainShort
    }
}

/// release.lua on the plain line: what `ev` deducted goes back, and the
/// line is marked released where it holds no reason.
fn plain_release(q: &mut Plain, ev: Ev) {
    if let Some(PlainRecord::Deducted(u)) = q.records.get(&ev).copied() {
        q.avail += u;
        q.records.remove(&ev);
    }
    q.memos.entry(ev).or_insert(Placed::Released);
}
