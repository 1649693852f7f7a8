//! The bucket protocol of docs/buckets.md, executable: each bucket's state
//! and its atomic steps (what one Lua call on slot `{P~k}` will do), and the
//! deliveries that walk them (what the service will do between calls).
//!
//! One dimension (units of stock) stands for both budget and stock: the
//! rules are the same per dimension.

use std::collections::{BTreeMap, BTreeSet};

pub type Ev = u32;
pub type Cust = u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    Accepted(i64),
    Short,
    Limit,
    Refunded,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refund {
    Applied(i64),
    NoDeduction,
    AlreadyReverted,
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
    /// A give takes units but leaves no gift memo (the "moved on" memo of
    /// the issue: nothing says where they went).
    NoGiftMemo,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// Taken, waiting for the customer's reservation: `own` units of the
    /// home bucket set aside (`Bucket::tentative`), the gifts not yet
    /// credited.
    Tentative {
        customer: Cust,
        units: i64,
        own: i64,
        credits: Vec<Credit>,
    },
    /// `credits`: every gift this deduction consumed.
    Deducted {
        customer: Cust,
        units: i64,
        credits: Vec<Credit>,
    },
    Reverted {
        customer: Cust,
        units: i64,
        credits: Vec<Credit>,
        by: Ev,
    },
    Tomb {
        by: Ev,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gift {
    Given(i64),
    Settled(i64),
    Returned,
}

#[derive(Clone, Debug, Default)]
pub struct Bucket {
    /// Units this bucket can deduct now.
    pub avail: i64,
    /// Units given away (to a line's gather or a transfer), not yet settled
    /// or returned.
    pub held: i64,
    /// Units set aside by tentative deductions (waiting for the
    /// customer's reservation).
    pub tentative: i64,
    /// Bumped whenever `avail` rises.
    pub incr: u64,
    /// Bumped by every notification of an increase elsewhere.
    pub notify: u64,
    /// Upper bound on the other buckets' avail + held, while set.
    pub bound: Option<i64>,
    /// Ids (refunds, transfers) about to add units here.
    pub pending: BTreeSet<Ev>,
    /// Per-customer limit, at the customer's home bucket: the orders
    /// holding a reservation (`true`) or whose reservation was released
    /// (`false`: kept, so a late delivery cannot take it again), and the
    /// count of those holding one.
    pub used: BTreeMap<Cust, u32>,
    pub resv: BTreeMap<Ev, (Cust, bool)>,
    /// Deduction records by order (= placement event id).
    pub records: BTreeMap<Ev, Record>,
    pub memos: BTreeMap<Ev, Placed>,
    pub refunds: BTreeMap<Ev, Refund>,
    /// The current gather attempt of each event homed here.
    pub attempt: BTreeMap<Ev, u32>,
    /// Gifts given from here: (event or transfer, attempt) -> state, receiver.
    pub gifts: BTreeMap<(Ev, u32), (Gift, usize)>,
    /// Transfers credited here, with the units credited.
    pub credited_in: BTreeMap<Ev, i64>,
}

#[derive(Clone, Debug)]
pub struct Ledger {
    pub b: Vec<Bucket>,
    pub limit: Option<u32>,
    pub initial: i64,
    /// Ghost state, not in Redis: units off every bucket's books, by
    /// (event or transfer, attempt, source).
    pub transit: BTreeMap<(Ev, u32, usize), i64>,
    pub mutant: Mutant,
    /// Calls (Redis round trips) each bucket served: the cost model.
    pub calls: Vec<u64>,
}

impl Ledger {
    fn touch(&mut self, j: usize) {
        self.calls[j] += 1;
    }

    pub fn new(k: usize, stock: i64, limit: Option<u32>, mutant: Mutant) -> Ledger {
        let mut b = vec![Bucket::default(); k];
        for (i, bucket) in b.iter_mut().enumerate() {
            // Split as `promo set --buckets K` will: the first buckets take
            // the remainder.
            bucket.avail = stock / k as i64 + i64::from((i as i64) < stock % k as i64);
        }
        Ledger {
            b,
            limit,
            initial: stock,
            transit: BTreeMap::new(),
            mutant,
            calls: vec![0; k],
        }
    }

    pub fn k(&self) -> usize {
        self.b.len()
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
    pub fn strict_total(&self) -> i64 {
        self.b.iter().map(|b| b.avail + b.tentative).sum::<i64>()
            + self.transit.values().sum::<i64>()
    }

    pub fn deducted(&self) -> i64 {
        self.b
            .iter()
            .flat_map(|b| b.records.values())
            .map(|r| match r {
                Record::Deducted { units, .. } => *units,
                _ => 0,
            })
            .sum()
    }

    fn notify_all_but(&mut self, j: usize) {
        for (m, b) in self.b.iter_mut().enumerate() {
            if m != j {
                self.calls[m] += 1;
                b.notify += 1;
                b.bound = None;
            }
        }
    }

    /// A line's give at bucket j for (id, attempt a): up to `want` more
    /// units, added to what (id, a) already holds here. Replies with the
    /// total (id, a) holds here and whether a line with a lower id holds
    /// units here too (then this line is the junior and yields).
    fn give(&mut self, j: usize, id: Ev, a: u32, want: i64, receiver: usize) -> (i64, bool) {
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
            Some(Gift::Returned) => return (0, senior),
            None => 0,
        };
        let g = b.avail.min(want).max(0);
        b.avail -= g;
        b.held += g;
        if g > 0 {
            *self.transit.entry((id, a, j)).or_insert(0) += g;
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
            if g > 0 {
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
            let used: i64 = credited
                .iter()
                .filter(|c| c.from == j && c.attempt == a)
                .map(|c| c.units)
                .sum();
            let b = &mut self.b[j];
            if let Some((Gift::Given(g), to)) = b.gifts.get(&(e, a)).copied() {
                let back = g - used;
                b.held -= g;
                if back > 0 {
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
    pub fn sweep(&mut self, transfers: &BTreeMap<Ev, (usize, usize, i64)>) {
        for j in 0..self.k() {
            let open: Vec<((Ev, u32), usize)> = self.b[j]
                .gifts
                .iter()
                .filter(|(_, (g, _))| matches!(g, Gift::Given(_)))
                .map(|(k, (_, to))| (*k, *to))
                .collect();
            for ((id, a), to) in open {
                if let Some(&(_, dest, n)) = transfers.get(&id) {
                    let mut t = Transfer::new(id, j, dest, n);
                    while t.step(self).is_none() {}
                    continue;
                }
                let home = &self.b[to];
                let credited = match home.records.get(&id) {
                    Some(Record::Deducted { credits, .. })
                    | Some(Record::Reverted { credits, .. }) => Some(credits.clone()),
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
            .any(|(_, (g, _))| matches!(g, Gift::Given(x) if *x > 0))
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

    /// Whether `id` holds units given here, in any attempt.
    fn holds(&self, id: Ev) -> bool {
        self.gifts
            .range((id, 0)..=(id, u32::MAX))
            .any(|(_, (g, _))| matches!(g, Gift::Given(x) if *x > 0))
    }
}

/// A gift a deduction consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credit {
    pub from: usize,
    pub attempt: u32,
    pub units: i64,
}

/// What one step of a delivery reports to the harness.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Report {
    Running,
    /// Decided "short" at this step (fast path or after a gather).
    Short {
        fast: bool,
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
    pub units: i64,
    home: usize,
    step: PStep,
    a: u32,
    incr0: u64,
    notify0: u64,
    avail0: i64,
    held0: i64,
    /// (bucket, avail, held or set aside, this event holds units there)
    peeks: Vec<(usize, i64, i64, bool)>,
    pending_seen: bool,
    junior: bool,
    /// What attempt `a` holds in each other bucket.
    mine: BTreeMap<usize, i64>,
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
}

impl Place {
    pub fn new(ev: Ev, cust: Cust, units: i64, k: usize) -> Place {
        Place {
            ev,
            cust,
            units,
            home: ev as usize % k,
            step: PStep::Hop1,
            a: 0,
            incr0: 0,
            notify0: 0,
            avail0: 0,
            held0: 0,
            peeks: Vec::new(),
            pending_seen: false,
            junior: false,
            mine: BTreeMap::new(),
            holds_at: BTreeSet::new(),
            credited: Vec::new(),
            outcome: None,
            cleanup: false,
            waiting: false,
            restarts: 0,
        }
    }

    /// What the other buckets held, as this attempt's looks saw it.
    fn peeked(&self) -> i64 {
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
        let outcome = self.outcome.unwrap_or(Placed::Short);
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
    fn take(&mut self, l: &mut Ledger, own: i64, credits: Vec<Credit>) -> Report {
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
                if *t == 0 {
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
                let b = &mut l.b[h];
                if b.avail >= self.units {
                    return self.take(l, self.units, Vec::new());
                }
                if let Some(bound) = b.bound {
                    if b.pending.is_empty() && b.avail + b.held + b.tentative + bound < self.units {
                        b.memos.insert(self.ev, Placed::Short);
                        let _ = self.finish(l, Placed::Short, Vec::new());
                        return Report::Short { fast: true };
                    }
                }
                if k == 1 {
                    if b.tentative + b.held > 0 || !b.pending.is_empty() {
                        // Units set aside for a line still waiting for its
                        // reservation may come back: not short yet.
                        return self.wait();
                    }
                    b.memos.insert(self.ev, Placed::Short);
                    self.outcome = Some(Placed::Short);
                    return Report::Short { fast: false };
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
                self.junior = b.senior_holds(self.ev);
                self.peeks.clear();
                self.step = PStep::Peek(0);
                Report::Running
            }
            PStep::Peek(i) => {
                let j = self.other(l, i);
                l.touch(j);
                let b = &l.b[j];
                self.peeks
                    .push((j, b.avail, b.held + b.tentative, b.holds(self.ev)));
                if b.holds(self.ev) {
                    self.holds_at.insert(j);
                }
                self.pending_seen |= !b.pending.is_empty();
                self.junior |= b.senior_holds(self.ev);
                if i + 2 < k {
                    self.step = PStep::Peek(i + 1);
                    return Report::Running;
                }
                let total = self.avail0 + self.held0 + self.peeked();
                if total >= self.units {
                    // Enough units, some perhaps held by other lines: the
                    // lowest event id among those holding goes first, the
                    // others give theirs back and start again.
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
            PStep::FinalReject => {
                l.touch(self.home);
                if let Some(r) = self.home_checks(l) {
                    return r;
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
                if mutant != Mutant::NoShortMemo {
                    b.memos.insert(self.ev, Placed::Short);
                }
                b.bound = Some(bound);
                let _ = self.finish(l, Placed::Short, Vec::new());
                Report::Short { fast: false }
            }
            PStep::Give(i) => {
                let missing = self.units - self.avail0 - self.mine.values().sum::<i64>();
                if missing <= 0 || i >= self.peeks.len() {
                    self.step = PStep::FinalAccept;
                    return Report::Running;
                }
                let (j, avail, _, mine) = self.peeks[i];
                self.step = PStep::Give(i + 1);
                if avail > 0 || mine {
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
                let b = &mut l.b[self.home];
                if b.attempt.get(&self.ev) != Some(&self.a) {
                    self.step = PStep::Yield;
                    return Report::Running;
                }
                let sum: i64 = self.mine.values().sum();
                if b.avail + sum < self.units {
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
                    if take > 0 {
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
                let ok = if b.resv.contains_key(&self.ev) {
                    // Taken before (or taken and released by a refund: the
                    // order is decided, and Settle finds that).
                    true
                } else if b.used.get(&self.cust).copied().unwrap_or(0) < limit {
                    b.resv.insert(self.ev, (self.cust, true));
                    *b.used.entry(self.cust).or_insert(0) += 1;
                    true
                } else {
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
                self.settle(l)
            }
            PStep::Undo => {
                l.touch(self.home);
                if let Some((d, c)) = self.decided(l) {
                    return self.finish(l, d, c);
                }
                let b = &mut l.b[self.home];
                if let Some(Record::Tentative { own, .. }) = b.records.get(&self.ev).cloned() {
                    b.records.remove(&self.ev);
                    b.tentative -= own;
                    if own > 0 {
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
                let credited = self.credited.clone();
                l.settle_event(j, self.ev, &credited);
                if let Some(&next) = self.holds_at.range(j + 1..).next() {
                    self.step = PStep::Cleanup(next);
                    return Report::Running;
                }
                Report::Done(Outcome::Placed(self.outcome.unwrap_or(Placed::Short)))
            }
        }
    }

    pub fn cleaning(&self) -> bool {
        self.cleanup
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum RStep {
    Look,
    Notify,
    Revert,
    Release(Cust, i64),
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

    pub fn step(&mut self, l: &mut Ledger) -> Report {
        let h = l.order_home(self.order);
        match self.step {
            RStep::Look => {
                l.touch(h);
                let mutant = l.mutant;
                let b = &mut l.b[h];
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
                    Some(Record::Deducted { .. }) => {
                        // Units are about to come back here: mark first, so
                        // no gather rejects while they are on their way.
                        if mutant == Mutant::NoPendingMark {
                            self.step = RStep::Revert;
                        } else {
                            b.pending.insert(self.ev);
                            self.step = RStep::Notify;
                        }
                    }
                    // A placement still waiting for its reservation (a
                    // zombie delivery): look again once it has settled.
                    Some(Record::Tentative { .. }) => {}
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
            RStep::Notify => {
                l.notify_all_but(h);
                self.step = RStep::Revert;
                Report::Running
            }
            RStep::Revert => {
                l.touch(h);
                let b = &mut l.b[h];
                b.pending.remove(&self.ev);
                match b.records.get(&self.order).cloned() {
                    Some(Record::Deducted {
                        customer,
                        units,
                        credits,
                    }) => {
                        b.avail += units;
                        b.incr += 1;
                        b.records.insert(
                            self.order,
                            Record::Reverted {
                                customer,
                                units,
                                credits,
                                by: self.ev,
                            },
                        );
                        b.refunds.insert(self.ev, Refund::Applied(units));
                        self.step = RStep::Release(customer, units);
                    }
                    _ => self.step = RStep::Look,
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
    Credit(i64),
    Settle(i64),
}

/// One run of an operator's transfer of `n` units from bucket `from` to
/// bucket `to` (what `promo rebalance` does for each pair).
#[derive(Clone, Debug)]
pub struct Transfer {
    pub id: Ev,
    pub from: usize,
    pub to: usize,
    pub n: i64,
    step: TStep,
}

impl Transfer {
    pub fn new(id: Ev, from: usize, to: usize, n: i64) -> Transfer {
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
                l.notify_all_but(self.to);
                self.step = TStep::Take;
            }
            TStep::Take => {
                l.touch(self.from);
                // Once per transfer: the amount is fixed by the first take
                // (nothing taken is remembered too).
                let b = &mut l.b[self.from];
                let g = match b.gifts.get(&(self.id, 0)).map(|g| g.0) {
                    Some(Gift::Given(x)) | Some(Gift::Settled(x)) => x,
                    Some(Gift::Returned) => 0,
                    None => {
                        let g = b.avail.min(self.n).max(0);
                        b.avail -= g;
                        b.held += g;
                        b.gifts.insert((self.id, 0), (Gift::Given(g), self.to));
                        if g > 0 {
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
                    if g > 0 {
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
                    if g > c {
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
