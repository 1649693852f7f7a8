//! A bucket of a bucketed promotion: its state, and the atomic operations
//! a delivery calls on it (`Op`, answered by a `Reply`). Each operation is
//! what one Lua call on the bucket's slot `{P~k}` is to do: it reads and
//! writes this bucket only, and everything a delivery learns of a bucket
//! comes from a reply. The deliveries that walk from call to call (what the
//! service is to do) are in `protocol`.
//!
//! The ledger also keeps ghost state that Redis will not have (`transit`,
//! `adjusted`, the call counts): the property test's checks read it.
//! `Ledger::trace` records every call with its reply, for a differential
//! test of the scripts against this model.
//!
//! Corrupt data: one bucket's counters (its hash `promo:{P~k}`) may turn
//! unreadable for a while, until the operator repairs them (the model
//! keeps the true values behind `Bucket::corrupt`). Records, memos, gift
//! memos, reservations and the pending marks (a set of its own) are keys of
//! their own and stay readable. An operation that must read or write the
//! counters of a corrupt bucket answers `Reply::Corrupt` and writes
//! nothing, except where it decides (then it decides `corrupt_promotion`
//! and remembers it); what the delivery does then is in `protocol`.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use deductor::domain::buckets as d;
pub use deductor::domain::buckets::{Credit, Dim, Gather, Outcome, Placed, Refund, Report, Units};

pub type Ev = u32;
pub type Cust = u32;
/// The protocol's operations and replies, on the model's ids.
pub type Op = d::Op<Ev>;
pub type Reply = d::Reply<Ev>;

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
    /// Every call with its reply, and every fault, while set.
    pub trace: Option<Vec<Traced>>,
    /// Mutants that skip a mark skip the notifications after it too: the
    /// count of notifications still to ignore.
    pub drop_notify: usize,
}

impl Ledger {
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
            trace: None,
            drop_notify: 0,
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
        if let Some(t) = self.trace.as_mut() {
            t.push(Traced::Corrupt(j));
        }
    }

    /// The operator repairs bucket j's counters: its bounds go (the
    /// notifications it missed), and that counts as a notification.
    pub fn repair(&mut self, j: usize) {
        let b = &mut self.b[j];
        b.corrupt = false;
        b.bounds.iter_mut().for_each(|x| *x = None);
        b.notify += 1;
        if let Some(t) = self.trace.as_mut() {
            t.push(Traced::Repair(j));
        }
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

/// A bucket's counters and bounds, as its hash holds them.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    pub avail: Units,
    pub held: Units,
    pub tentative: Units,
    pub incr: u64,
    pub notify: u64,
    pub bounds: Vec<Option<Units>>,
}

impl Bucket {
    pub fn view(&self) -> View {
        View {
            avail: self.avail,
            held: self.held,
            tentative: self.tentative,
            incr: self.incr,
            notify: self.notify,
            bounds: self.bounds.clone(),
        }
    }
}

/// One entry of the trace: a call, its reply and the bucket after it; or
/// a fault.
// A test's trace: most entries are calls, so boxing them would save nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Traced {
    Call(usize, Op, Reply, View),
    Corrupt(usize),
    Repair(usize),
}

impl Ledger {
    /// One call on bucket j.
    pub fn call(&mut self, j: usize, op: Op) -> Reply {
        self.calls[j] += 1;
        let reply = self.apply(j, &op);
        if let Some(t) = self.trace.as_mut() {
            t.push(Traced::Call(j, op, reply.clone(), self.b[j].view()));
        }
        reply
    }

    /// The checks every placement call at home makes first: an earlier
    /// decision (memo or record), a tombstone (the line is rejected
    /// `Refunded`, remembered), a tentative deduction waiting for its
    /// reservation.
    fn home_checks(&mut self, h: usize, ev: Ev) -> Option<Reply> {
        if let Some(r) = self.decided(h, ev) {
            return Some(r);
        }
        let b = &mut self.b[h];
        match b.records.get(&ev) {
            Some(Record::Tomb { .. }) => {
                b.memos.insert(ev, Placed::Refunded);
                Some(Reply::Decided(Placed::Refunded, Vec::new()))
            }
            Some(Record::Tentative { .. }) => Some(Reply::Tentative),
            _ => None,
        }
    }

    /// An earlier decision at bucket h: its memo, or its record.
    fn decided(&self, h: usize, ev: Ev) -> Option<Reply> {
        let b = &self.b[h];
        if let Some(d) = b.memos.get(&ev) {
            return Some(Reply::Decided(*d, Vec::new()));
        }
        match b.records.get(&ev) {
            Some(Record::Deducted { units, credits, .. })
            | Some(Record::Reverted { units, credits, .. }) => {
                Some(Reply::Decided(Placed::Accepted(*units), credits.clone()))
            }
            Some(Record::Released { credits, .. }) => {
                Some(Reply::Decided(Placed::Released, credits.clone()))
            }
            _ => None,
        }
    }

    /// Decided `corrupt_promotion` (remembered under the memo).
    fn decide_corrupt(&mut self, h: usize, ev: Ev) -> Reply {
        self.b[h].memos.insert(ev, Placed::Corrupt);
        Reply::Decided(Placed::Corrupt, Vec::new())
    }

    /// Take `own` units of bucket h and the gifts `credits` for the line:
    /// tentatively under a per-customer limit, else the deduction at once.
    fn take(
        &mut self,
        h: usize,
        ev: Ev,
        cust: Cust,
        units: Units,
        own: Units,
        credits: Vec<Credit>,
    ) -> Reply {
        let b = &mut self.b[h];
        b.avail -= own;
        b.tentative += own;
        b.records.insert(
            ev,
            Record::Tentative {
                customer: cust,
                units,
                own,
                credits,
            },
        );
        if self.limit.is_some() {
            Reply::Tentative
        } else {
            self.settle(h, ev)
        }
    }

    /// The tentative deduction at bucket h becomes the deduction.
    fn settle(&mut self, h: usize, ev: Ev) -> Reply {
        let b = &mut self.b[h];
        let Some(Record::Tentative {
            customer,
            units,
            own,
            credits,
        }) = b.records.get(&ev).cloned()
        else {
            return Reply::Restart;
        };
        b.tentative -= own;
        b.records.insert(
            ev,
            Record::Deducted {
                customer,
                units,
                credits: credits.clone(),
            },
        );
        for c in &credits {
            let key = (ev, c.attempt, c.from);
            if let Some(t) = self.transit.get_mut(&key) {
                *t -= c.units;
                if *t == Units::ZERO {
                    self.transit.remove(&key);
                }
            }
        }
        Reply::Decided(Placed::Accepted(units), credits)
    }

    fn apply(&mut self, j: usize, op: &Op) -> Reply {
        let k = self.k();
        let mutant = self.mutant;
        match op.clone() {
            Op::Start {
                ev, cust, units, ..
            } => {
                if let Some(r) = self.home_checks(j, ev) {
                    return r;
                }
                if self.b[j].corrupt {
                    return self.decide_corrupt(j, ev);
                }
                let b = &mut self.b[j];
                if b.avail.covers(units) {
                    return self.take(j, ev, cust, units, units, Vec::new());
                }
                let bound: Option<Units> = (0..k)
                    .filter(|m| *m != j)
                    .map(|m| b.bounds[m])
                    .sum::<Option<Units>>();
                if let Some(bound) = bound {
                    let most = b.avail + b.held + b.tentative + bound;
                    if let (true, Some(dim)) = (b.pending.is_empty(), most.short_of(units)) {
                        b.memos.insert(ev, Placed::Short(dim));
                        return Reply::Short { dim, fast: true };
                    }
                }
                if k == 1 {
                    if (b.tentative + b.held).any_pos() || !b.pending.is_empty() {
                        // Units set aside for a line still waiting for its
                        // reservation may come back: not short yet.
                        return Reply::Wait;
                    }
                    let dim = b.avail.short_of(units).unwrap_or(Dim::Stock);
                    b.memos.insert(ev, Placed::Short(dim));
                    return Reply::Short { dim, fast: false };
                }
                let a = *b.attempt.entry(ev).or_insert(0);
                let senior = b.senior_holds(ev);
                Reply::Gather(Gather {
                    a,
                    incr: b.incr,
                    notify: b.notify,
                    avail: b.avail,
                    held: b.held + b.tentative,
                    pending: !b.pending.is_empty(),
                    senior,
                    bounds: b.bounds.clone(),
                })
            }
            Op::Peek { ev } => {
                let b = &self.b[j];
                let (avail, held) = if b.corrupt {
                    (Units::ZERO, Units::ZERO)
                } else {
                    (b.avail, b.held + b.tentative)
                };
                Reply::Peeked {
                    corrupt: b.corrupt && mutant != Mutant::CorruptCountsAsEmpty,
                    avail,
                    held,
                    holds: b.holds(ev),
                    pending: !b.pending.is_empty(),
                    senior: b.senior_holds(ev),
                }
            }
            Op::Reject {
                ev,
                a,
                incr,
                notify,
                dim,
                saw_corrupt,
                seen,
            } => {
                if let Some(r) = self.home_checks(j, ev) {
                    return r;
                }
                if self.b[j].corrupt {
                    return self.decide_corrupt(j, ev);
                }
                let b = &mut self.b[j];
                // Every way units reach a bucket (a refund, a transfer)
                // notifies every other bucket before they arrive, and marks
                // the bucket they go to: a line whose home heard nothing
                // while it looked saw every unit there was.
                let heard = b.notify != notify && mutant != Mutant::RejectIgnoresNotify;
                if b.attempt.get(&ev) != Some(&a)
                    || b.incr != incr
                    || !b.pending.is_empty()
                    || heard
                {
                    return Reply::Restart;
                }
                if saw_corrupt {
                    return self.decide_corrupt(j, ev);
                }
                if mutant != Mutant::NoShortMemo {
                    b.memos.insert(ev, Placed::Short(dim));
                }
                // What it saw bounds each bucket it looked at; the others
                // keep theirs (zero in what the line was missing).
                for (m, held) in seen {
                    b.bounds[m] = Some(held);
                }
                Reply::Short { dim, fast: false }
            }
            Op::Give {
                ev,
                a,
                want,
                receiver,
            } => {
                if self.b[j].corrupt {
                    return Reply::Corrupt;
                }
                let (total, senior) = self.give(j, ev, a, want, receiver);
                Reply::Gave { total, senior }
            }
            Op::Accept {
                ev,
                cust,
                units,
                a,
                mine,
            } => {
                if let Some(r) = self.home_checks(j, ev) {
                    return r;
                }
                if self.b[j].corrupt {
                    return self.decide_corrupt(j, ev);
                }
                let b = &self.b[j];
                if b.attempt.get(&ev) != Some(&a) {
                    return Reply::Yield;
                }
                let sum: Units = mine.iter().map(|m| m.1).sum();
                if !(b.avail + sum).covers(units) {
                    // Units went elsewhere meanwhile: look again, keeping
                    // what this attempt holds.
                    return Reply::Restart;
                }
                // The home's own units first, then only as much of the
                // gifts as the line still needs: the rest stays with its
                // source and goes back there at the cleanup. (Crediting a
                // surplus here would move units between buckets behind the
                // bounds' back.)
                let from_home = b.avail.min(units);
                let mut need = units - from_home;
                let mut credits: Vec<Credit> = Vec::new();
                for (m, u) in &mine {
                    let take = need.min(*u);
                    if take.any_pos() {
                        credits.push(Credit {
                            from: *m,
                            attempt: a,
                            units: take,
                        });
                        need -= take;
                    }
                }
                self.take(j, ev, cust, units, from_home, credits)
            }
            Op::Yield { ev, a } => {
                // Decided meanwhile (by another delivery): the decision's
                // cleanup settles, never a blind return.
                if let Some(r) = self.home_checks(j, ev) {
                    return r;
                }
                let b = &mut self.b[j];
                if b.attempt.get(&ev) == Some(&a) {
                    b.attempt.insert(ev, a + 1);
                }
                Reply::Ok
            }
            Op::ReturnAll { ev, upto } => {
                if self.b[j].corrupt {
                    return Reply::Corrupt;
                }
                for a in 0..=upto {
                    self.give_back(j, ev, a);
                }
                Reply::Ok
            }
            Op::Reserve { order, cust } => {
                let limit = self.limit.unwrap_or(u32::MAX);
                let b = &mut self.b[j];
                let (ok, refused_now) = if b.refused.contains(&order) {
                    // Decided before: the same answer (no new count).
                    (false, false)
                } else if b.resv.contains_key(&order) {
                    // Taken before (or taken and released by a refund: the
                    // order is decided, and Settle finds that).
                    (true, false)
                } else if mutant == Mutant::ReserveCountsFreed
                    && b.resv.values().filter(|r| r.0 == cust).count() as u32 >= limit
                {
                    b.refused.insert(order);
                    (false, true)
                } else if b.used.get(&cust).copied().unwrap_or(0) < limit {
                    b.resv.insert(order, (cust, true));
                    *b.used.entry(cust).or_insert(0) += 1;
                    (true, false)
                } else {
                    if mutant != Mutant::RefusalForgotten {
                        b.refused.insert(order);
                    }
                    (false, true)
                };
                Reply::Reserved { ok, refused_now }
            }
            Op::Settle { ev } => {
                if let Some(r) = self.decided(j, ev) {
                    return r;
                }
                if self.b[j].corrupt {
                    return Reply::Corrupt;
                }
                self.settle(j, ev)
            }
            Op::Undo { ev } => {
                if let Some(r) = self.decided(j, ev) {
                    return r;
                }
                if self.b[j].corrupt {
                    return Reply::Corrupt;
                }
                let b = &mut self.b[j];
                if let Some(Record::Tentative { own, .. }) = b.records.get(&ev).cloned() {
                    b.records.remove(&ev);
                    b.tentative -= own;
                    if own.any_pos() {
                        b.avail += own;
                        b.incr += 1;
                    }
                    b.memos.insert(ev, Placed::Limit);
                    // The gifts were never credited: the cleanup returns them.
                    return Reply::Decided(Placed::Limit, Vec::new());
                }
                Reply::Restart
            }
            Op::Unreserve { order } => {
                self.b[j].release(order);
                Reply::Ok
            }
            Op::Cleanup { ev, credited } => {
                if self.b[j].corrupt {
                    return Reply::Corrupt;
                }
                self.settle_event(j, ev, &credited);
                Reply::Ok
            }
            Op::RefundLook { ev, order } => {
                let b = &mut self.b[j];
                if b.refunds.get(&ev) == Some(&Refund::Corrupt) {
                    return Reply::Refund(Refund::Corrupt);
                }
                match b.records.get(&order).cloned() {
                    Some(Record::Reverted {
                        by,
                        customer,
                        units,
                        ..
                    }) if by == ev => {
                        // Reverted by this refund: a mark it left goes, and
                        // the reservation is released (again: idempotent).
                        b.pending.remove(&ev);
                        Reply::Release(customer, units)
                    }
                    Some(Record::Reverted { .. }) => {
                        b.pending.remove(&ev);
                        Reply::Refund(Refund::AlreadyReverted)
                    }
                    Some(Record::Deducted { .. }) if b.corrupt => {
                        // rollback.lua's corrupt data: rejected and
                        // remembered; a mark an earlier delivery left goes.
                        b.pending.remove(&ev);
                        b.refunds.insert(ev, Refund::Corrupt);
                        Reply::Refund(Refund::Corrupt)
                    }
                    Some(Record::Deducted { units, .. }) => {
                        // Units are about to come back here: mark first, so
                        // no gather rejects while they are on their way.
                        if mutant != Mutant::NoPendingMark {
                            b.pending.insert(ev);
                        } else {
                            // (mutant) no mark, and no notification either.
                            self.drop_notify = k - 1;
                        }
                        Reply::Marked(units)
                    }
                    // A placement still waiting for its reservation (a
                    // zombie delivery): look again once it has settled.
                    Some(Record::Tentative { .. }) => Reply::Wait,
                    // Released for the event's rejection (perhaps after a
                    // crashed delivery of this refund marked the bucket).
                    Some(Record::Released { .. }) => {
                        b.pending.remove(&ev);
                        Reply::Refund(Refund::NoDeduction)
                    }
                    Some(Record::Tomb { .. }) => Reply::Refund(Refund::NoDeduction),
                    None => {
                        b.records.insert(order, Record::Tomb { by: ev });
                        b.refunds.insert(ev, Refund::NoDeduction);
                        Reply::Refund(Refund::NoDeduction)
                    }
                }
            }
            Op::Notify { to, units } => {
                if self.drop_notify > 0 {
                    self.drop_notify -= 1;
                    return Reply::Ok;
                }
                let b = &mut self.b[j];
                if b.corrupt {
                    return Reply::Corrupt;
                }
                b.notify += 1;
                if let Some(x) = b.bounds[to].as_mut() {
                    *x += units;
                }
                Reply::Ok
            }
            Op::RefundRevert { ev, order } => {
                let b = &mut self.b[j];
                b.pending.remove(&ev);
                if b.refunds.get(&ev) == Some(&Refund::Corrupt) {
                    return Reply::Refund(Refund::Corrupt);
                }
                if b.corrupt && matches!(b.records.get(&order), Some(Record::Deducted { .. })) {
                    b.refunds.insert(ev, Refund::Corrupt);
                    return Reply::Refund(Refund::Corrupt);
                }
                let back = b.give_back(order, |customer, units, credits| Record::Reverted {
                    customer,
                    units,
                    credits,
                    by: ev,
                });
                match back {
                    Some((customer, units)) => {
                        b.refunds.insert(ev, Refund::Applied(units));
                        Reply::Release(customer, units)
                    }
                    None => Reply::Relook,
                }
            }
            Op::ReleaseLook { ev } => {
                let b = &mut self.b[j];
                match b.records.get(&ev).cloned() {
                    Some(Record::Deducted { units, .. }) => {
                        // Units are about to come back here: mark first,
                        // as a refund does.
                        if mutant != Mutant::NoReleaseMark {
                            b.pending.insert(ev);
                        } else {
                            // (mutant) no mark, and no notification either.
                            self.drop_notify = k - 1;
                        }
                        Reply::Marked(units)
                    }
                    Some(Record::Released {
                        customer, units, ..
                    }) => {
                        b.pending.remove(&ev);
                        Reply::Release(customer, units)
                    }
                    // Reverted by a refund meanwhile, or nothing of
                    // this event here: nothing to give back.
                    _ => {
                        b.pending.remove(&ev);
                        Reply::Nothing
                    }
                }
            }
            Op::ReleaseRevert { ev } => {
                let b = &mut self.b[j];
                if b.corrupt {
                    // The event is decided: what it took must go back. The
                    // release waits for the repair.
                    return Reply::Corrupt;
                }
                b.pending.remove(&ev);
                let back = b.give_back(ev, |customer, units, credits| Record::Released {
                    customer,
                    units,
                    credits,
                });
                if let Some((customer, units)) = back {
                    return Reply::Release(customer, units);
                }
                match b.records.get(&ev) {
                    Some(&Record::Released {
                        customer, units, ..
                    }) => Reply::Release(customer, units),
                    _ => Reply::Nothing,
                }
            }
            Op::Memo { ev } => Reply::Memo(self.b[j].memos.get(&ev).copied()),
            Op::TransferMark { id } => {
                let b = &mut self.b[j];
                if let Some(c) = b.credited_in.get(&id) {
                    return Reply::Amount(*c);
                }
                b.pending.insert(id);
                Reply::Ok
            }
            Op::TransferTake { id, n, to } => {
                if self.b[j].corrupt {
                    return Reply::Corrupt;
                }
                // Once per transfer: the amount is fixed by the first take
                // (nothing taken is remembered too).
                let b = &mut self.b[j];
                let g = match b.gifts.get(&(id, 0)).map(|g| g.0) {
                    Some(Gift::Given(x)) | Some(Gift::Settled(x)) => x,
                    Some(Gift::Returned) => Units::ZERO,
                    None => {
                        let g = b.avail.min(n).pos();
                        b.avail -= g;
                        b.held += g;
                        b.gifts.insert((id, 0), (Gift::Given(g), to));
                        if g.any_pos() {
                            self.transit.insert((id, 0, j), g);
                        }
                        g
                    }
                };
                Reply::Amount(g)
            }
            Op::TransferCredit { id, from, took } => {
                if self.b[j].corrupt {
                    return Reply::Corrupt;
                }
                let b = &mut self.b[j];
                b.pending.remove(&id);
                let c = *b.credited_in.entry(id).or_insert_with(|| {
                    if took.any_pos() {
                        b.avail += took;
                        b.incr += 1;
                        self.transit.remove(&(id, 0, from));
                    }
                    took
                });
                Reply::Amount(c)
            }
            Op::TransferSettle { id, credited } => {
                if self.b[j].corrupt {
                    return Reply::Corrupt;
                }
                let b = &mut self.b[j];
                if let Some((Gift::Given(g), to)) = b.gifts.get(&(id, 0)).copied() {
                    b.held -= g;
                    if (g - credited).any_pos() {
                        b.avail += g - credited;
                        b.incr += 1;
                        self.transit.remove(&(id, 0, j));
                    }
                    b.gifts.insert((id, 0), (Gift::Settled(credited), to));
                }
                Reply::Ok
            }
            Op::AdjustMark { id } => {
                let b = &mut self.b[j];
                if let Some(c) = b.credited_in.get(&id) {
                    return Reply::Amount(*c);
                }
                if mutant != Mutant::AdjustNoNotify {
                    b.pending.insert(id);
                } else {
                    // (mutant) no mark, and no notification either.
                    self.drop_notify = k - 1;
                }
                Reply::Ok
            }
            Op::AdjustCredit { id, share } => {
                let b = &mut self.b[j];
                if b.corrupt {
                    return Reply::Corrupt;
                }
                b.pending.remove(&id);
                if let Entry::Vacant(e) = b.credited_in.entry(id) {
                    e.insert(share);
                    b.avail += share;
                    b.incr += 1;
                    self.adjusted += share;
                }
                Reply::Ok
            }
            Op::AdjustRemove { id, share } => {
                let b = &mut self.b[j];
                if b.corrupt {
                    return Reply::Corrupt;
                }
                if let Entry::Vacant(e) = b.removed.entry(id) {
                    let g = b.avail.min(share).pos();
                    b.avail -= g;
                    e.insert(g);
                    self.adjusted -= g;
                }
                Reply::Ok
            }
            Op::OpenGifts => {
                let b = &self.b[j];
                if b.corrupt {
                    return Reply::Corrupt;
                }
                Reply::Gifts(
                    b.gifts
                        .iter()
                        .filter(|(_, (g, _))| matches!(g, Gift::Given(_)))
                        .map(|(k, (_, to))| (k.0, k.1, *to))
                        .collect(),
                )
            }
            Op::EventState { id } => {
                let b = &self.b[j];
                let credited = match b.records.get(&id) {
                    Some(Record::Deducted { credits, .. })
                    | Some(Record::Reverted { credits, .. })
                    | Some(Record::Released { credits, .. }) => Some(credits.clone()),
                    _ if b.memos.contains_key(&id) => Some(Vec::new()),
                    _ => None,
                };
                Reply::Event {
                    credited,
                    attempt: b.attempt.get(&id).copied(),
                }
            }
            Op::GiveBack { id, a } => {
                if self.b[j].corrupt {
                    return Reply::Corrupt;
                }
                self.give_back(j, id, a);
                Reply::Ok
            }
        }
    }
}
