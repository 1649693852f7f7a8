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
//! Each step of a delivery is one call on one bucket (`Ledger::call` with
//! an `Op`, see `bucket`), or, where the service would make several calls
//! in a row with nothing to decide between them (the notifications of
//! every other bucket), those calls.
//!
//! What a delivery does when a bucket's counters are corrupt:
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

use std::collections::{BTreeMap, BTreeSet};

use super::bucket::*;

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

/// Up to `units` are on their way to bucket j: every other bucket hears it
/// and raises its bound of j by as much (one call each, in a row).
fn notify_all_but(l: &mut Ledger, j: usize, units: Units) {
    for m in (0..l.k()).filter(|m| *m != j) {
        // A corrupt bucket answers CORRUPT: its repair clears its bounds.
        let _ = l.call(m, Op::Notify { to: j, units });
    }
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
    k: usize,
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

fn unexpected(what: &str, r: Reply) -> ! {
    unreachable!("{what} answered {r:?}")
}

impl Place {
    pub fn new(ev: Ev, cust: Cust, units: Units, k: usize) -> Place {
        Place {
            ev,
            cust,
            units,
            home: ev as usize % k,
            k,
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

    fn other(&self, i: usize) -> usize {
        (self.home + 1 + i) % self.k
    }

    /// Ends with `outcome`; an event that ever gathered settles its gifts
    /// in every other bucket first.
    fn finish(&mut self, outcome: Placed, credited: Vec<Credit>) -> Report {
        self.outcome = Some(outcome);
        self.credited = credited;
        if outcome == Placed::Limit {
            self.step = PStep::Unreserve;
            return Report::Running;
        }
        self.after_decision()
    }

    fn after_decision(&mut self) -> Report {
        let outcome = self.outcome.expect("a decision before its cleanup");
        if let Some(&j) = self.holds_at.iter().next() {
            self.cleanup = true;
            self.step = PStep::Cleanup(j);
            Report::Running
        } else {
            Report::Done(Outcome::Placed(outcome))
        }
    }

    /// A short decision (its memo written at home).
    fn short(&mut self, dim: Dim, fast: bool) -> Report {
        let _ = self.finish(Placed::Short(dim), Vec::new());
        Report::Short { fast, dim }
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

    /// Whether the delivery is backing off (see `wait`).
    pub fn waiting(&self) -> bool {
        self.waiting
    }

    /// The replies every call at home may give: a decision, or a tentative
    /// deduction waiting for its reservation (then that is what this
    /// delivery finishes).
    fn at_home(&mut self, r: Reply, what: &str) -> Report {
        match r {
            Reply::Decided(p, c) => self.finish(p, c),
            Reply::Tentative => {
                self.step = PStep::Reserve;
                Report::Running
            }
            Reply::Restart => self.restart(),
            Reply::Short { dim, fast } => self.short(dim, fast),
            r => unexpected(what, r),
        }
    }

    /// A gather starts from what the home held when the line looked.
    fn gather(&mut self, l: &Ledger, g: Gather) -> Report {
        if g.a != self.a {
            self.mine.clear();
        }
        self.a = g.a;
        self.incr0 = g.incr;
        self.notify0 = g.notify;
        self.avail0 = g.avail;
        self.held0 = g.held;
        self.pending_seen = g.pending;
        self.saw_corrupt = false;
        self.junior = g.senior;
        self.peeks.clear();
        // A bucket whose bound is zero in every dimension the line is
        // missing has nothing for it, and nothing can reach it unheard: no
        // need to look.
        let missing = (self.units - self.avail0 - self.held0).pos();
        self.to_peek = (0..l.k() - 1)
            .map(|i| self.other(i))
            .filter(|j| !matches!(g.bounds[*j], Some(x) if !x.min(missing).any_pos()))
            .collect();
        if self.to_peek.is_empty() {
            return self.looked();
        }
        self.step = PStep::Peek(0);
        Report::Running
    }

    pub fn step(&mut self, l: &mut Ledger) -> Report {
        let k = l.k();
        let ev = self.ev;
        match self.step {
            PStep::Hop1 => {
                self.waiting = false;
                let r = l.call(
                    self.home,
                    Op::Start {
                        ev,
                        cust: self.cust,
                        units: self.units,
                    },
                );
                match r {
                    Reply::Wait => self.wait(),
                    Reply::Gather(g) => self.gather(l, g),
                    r => self.at_home(r, "Start"),
                }
            }
            PStep::Peek(i) => {
                let j = self.to_peek[i];
                let Reply::Peeked {
                    corrupt,
                    avail,
                    held,
                    holds,
                    pending,
                    senior,
                } = l.call(j, Op::Peek { ev })
                else {
                    unreachable!("Peek answers Peeked")
                };
                // Unknown: served from the others, never short.
                if corrupt && l.mutant != Mutant::CorruptCountsAsEmpty {
                    self.saw_corrupt = true;
                }
                self.peeks.push((j, avail, held, holds));
                if holds {
                    self.holds_at.insert(j);
                }
                self.pending_seen |= pending;
                self.junior |= senior;
                if i + 1 < self.to_peek.len() {
                    self.step = PStep::Peek(i + 1);
                    return Report::Running;
                }
                self.looked()
            }
            PStep::FinalReject => {
                // The first dimension all of it could not cover.
                let dim = (self.avail0 + self.held0 + self.peeked())
                    .short_of(self.units)
                    .unwrap_or(Dim::Stock);
                let r = l.call(
                    self.home,
                    Op::Reject {
                        ev,
                        a: self.a,
                        incr: self.incr0,
                        notify: self.notify0,
                        dim,
                        saw_corrupt: self.saw_corrupt,
                        seen: self.peeks.iter().map(|p| (p.0, p.1 + p.2)).collect(),
                    },
                );
                self.at_home(r, "Reject")
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
                if avail.min(missing).any_pos() || mine {
                    let r = l.call(
                        j,
                        Op::Give {
                            ev,
                            a: self.a,
                            want: missing,
                            receiver: self.home,
                        },
                    );
                    match r {
                        Reply::Gave { total, senior } => {
                            self.mine.insert(j, total);
                            self.holds_at.insert(j);
                            if senior {
                                self.step = PStep::Yield;
                            }
                        }
                        // Unknown: the line goes on without it.
                        Reply::Corrupt => {}
                        r => unexpected("Give", r),
                    }
                }
                Report::Running
            }
            PStep::FinalAccept => {
                let r = l.call(
                    self.home,
                    Op::Accept {
                        ev,
                        cust: self.cust,
                        units: self.units,
                        a: self.a,
                        mine: self.mine.iter().map(|(j, u)| (*j, *u)).collect(),
                    },
                );
                match r {
                    Reply::Yield => {
                        self.step = PStep::Yield;
                        Report::Running
                    }
                    r => self.at_home(r, "Accept"),
                }
            }
            PStep::Yield => match l.call(self.home, Op::Yield { ev, a: self.a }) {
                Reply::Ok => {
                    self.step = PStep::ReturnAll(0);
                    Report::Running
                }
                r => self.at_home(r, "Yield"),
            },
            PStep::ReturnAll(i) => {
                let j = self.other(i);
                match l.call(j, Op::ReturnAll { ev, upto: self.a }) {
                    // Back off: the give-back waits for the repair.
                    Reply::Corrupt => Report::Running,
                    Reply::Ok if i + 2 < k => {
                        self.step = PStep::ReturnAll(i + 1);
                        Report::Running
                    }
                    Reply::Ok => {
                        self.mine.clear();
                        self.restart()
                    }
                    r => unexpected("ReturnAll", r),
                }
            }
            PStep::Reserve => {
                let hc = l.home(self.cust);
                let r = l.call(
                    hc,
                    Op::Reserve {
                        order: ev,
                        cust: self.cust,
                    },
                );
                let Reply::Reserved { ok, refused_now } = r else {
                    unexpected("Reserve", r)
                };
                if refused_now {
                    self.refusals += 1;
                }
                self.step = if ok { PStep::Settle } else { PStep::Undo };
                Report::Running
            }
            PStep::Settle | PStep::Undo => {
                let op = if self.step == PStep::Settle {
                    Op::Settle { ev }
                } else {
                    Op::Undo { ev }
                };
                match l.call(self.home, op) {
                    // Back off until the repair.
                    Reply::Corrupt => Report::Running,
                    r => self.at_home(r, "Settle or Undo"),
                }
            }
            PStep::Unreserve => {
                let hc = l.home(self.cust);
                let _ = l.call(hc, Op::Unreserve { order: ev });
                self.after_decision()
            }
            PStep::Cleanup(j) => {
                let r = l.call(
                    j,
                    Op::Cleanup {
                        ev,
                        credited: self.credited.clone(),
                    },
                );
                match r {
                    Reply::Corrupt => Report::Running,
                    Reply::Ok => {
                        if let Some(&next) = self.holds_at.range(j + 1..).next() {
                            self.step = PStep::Cleanup(next);
                            return Report::Running;
                        }
                        Report::Done(Outcome::Placed(
                            self.outcome.expect("a decision before its cleanup"),
                        ))
                    }
                    r => unexpected("Cleanup", r),
                }
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
        let (ev, order) = (self.ev, self.order);
        match self.step {
            RStep::Plain => {
                // rollback.lua on the plain line: revert a deduction, or
                // leave a tombstone so the order cannot deduct here later.
                let q = &mut l.plain;
                match q.records.get(&order).copied() {
                    Some(PlainRecord::Deducted(u)) => {
                        q.avail += u;
                        q.records.insert(order, PlainRecord::Reverted(u));
                    }
                    Some(_) => {}
                    None => {
                        q.records.insert(order, PlainRecord::Tomb);
                    }
                }
                self.step = RStep::Look;
                Report::Running
            }
            RStep::Look => match l.call(h, Op::RefundLook { ev, order }) {
                Reply::Refund(r) => Report::Done(Outcome::Refund(r)),
                Reply::Release(customer, units) => {
                    self.step = RStep::Release(customer, units);
                    Report::Running
                }
                Reply::Marked(units) => {
                    // Marked: units are about to come back here; the others
                    // hear it before they do.
                    self.step = if l.mutant == Mutant::NoPendingMark {
                        RStep::Revert
                    } else {
                        RStep::Notify(units)
                    };
                    Report::Running
                }
                // A placement still waiting for its reservation (a zombie
                // delivery): look again once it has settled.
                Reply::Wait => Report::Running,
                r => unexpected("RefundLook", r),
            },
            RStep::Notify(units) => {
                notify_all_but(l, h, units);
                self.step = RStep::Revert;
                Report::Running
            }
            RStep::Revert => {
                match l.call(h, Op::RefundRevert { ev, order }) {
                    Reply::Refund(r) => return Report::Done(Outcome::Refund(r)),
                    Reply::Release(customer, units) => self.step = RStep::Release(customer, units),
                    Reply::Relook => self.step = RStep::Look,
                    r => unexpected("RefundRevert", r),
                }
                Report::Running
            }
            RStep::Release(customer, units) => {
                let hc = l.home(customer);
                let _ = l.call(hc, Op::Unreserve { order });
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
        let id = self.id;
        match self.step {
            AStep::Mark(j) => match l.call(j, Op::AdjustMark { id }) {
                // Credited before.
                Reply::Amount(_) => return self.next(l, j),
                Reply::Ok if l.mutant == Mutant::AdjustNoNotify => self.step = AStep::Credit(j),
                Reply::Ok => self.step = AStep::Notify(j),
                r => unexpected("AdjustMark", r),
            },
            AStep::Notify(j) => {
                notify_all_but(l, j, self.n.share(k, j));
                self.step = AStep::Credit(j);
            }
            AStep::Credit(j) | AStep::Remove(j) => {
                let share = self.n.share(k, j);
                let op = if self.add {
                    Op::AdjustCredit { id, share }
                } else {
                    Op::AdjustRemove { id, share }
                };
                match l.call(j, op) {
                    Reply::Corrupt => {}
                    Reply::Ok => return self.next(l, j),
                    r => unexpected("AdjustCredit or AdjustRemove", r),
                }
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
        let id = self.id;
        match self.step {
            TStep::Mark => match l.call(self.to, Op::TransferMark { id }) {
                // Credited before: only the source's settlement is left.
                Reply::Amount(c) => self.step = TStep::Settle(c),
                Reply::Ok => self.step = TStep::Notify,
                r => unexpected("TransferMark", r),
            },
            TStep::Notify => {
                notify_all_but(l, self.to, self.n);
                self.step = TStep::Take;
            }
            TStep::Take => {
                let op = Op::TransferTake {
                    id,
                    n: self.n,
                    to: self.to,
                };
                match l.call(self.from, op) {
                    Reply::Corrupt => {}
                    Reply::Amount(g) => self.step = TStep::Credit(g),
                    r => unexpected("TransferTake", r),
                }
            }
            TStep::Credit(took) => {
                let op = Op::TransferCredit {
                    id,
                    from: self.from,
                    took,
                };
                match l.call(self.to, op) {
                    Reply::Corrupt => {}
                    Reply::Amount(c) => self.step = TStep::Settle(c),
                    r => unexpected("TransferCredit", r),
                }
            }
            TStep::Settle(credited) => {
                match l.call(self.from, Op::TransferSettle { id, credited }) {
                    Reply::Corrupt => {}
                    Reply::Ok => return Some(()),
                    r => unexpected("TransferSettle", r),
                }
            }
        }
        None
    }
}

/// The sweeper (`promo rebalance` runs it first): settles or returns every
/// gift of a decided event, and finishes every transfer.
pub fn sweep(l: &mut Ledger, transfers: &BTreeMap<Ev, (usize, usize, Units)>) {
    for j in 0..l.k() {
        let Reply::Gifts(open) = l.call(j, Op::OpenGifts) else {
            // Corrupt: the next sweep.
            continue;
        };
        for (id, a, to) in open {
            if let Some(&(_, dest, n)) = transfers.get(&id) {
                // A transfer to a corrupt bucket waits for the repair.
                if matches!(
                    l.call(dest, Op::Peek { ev: id }),
                    Reply::Peeked { corrupt: true, .. }
                ) {
                    continue;
                }
                let mut t = Transfer::new(id, j, dest, n);
                while t.step(l).is_none() {}
                continue;
            }
            let Reply::Event { credited, attempt } = l.call(to, Op::EventState { id }) else {
                unreachable!("EventState answers Event")
            };
            match credited {
                Some(credited) => {
                    let _ = l.call(j, Op::Cleanup { ev: id, credited });
                }
                None if attempt.is_some_and(|cur| cur > a) => {
                    let _ = l.call(j, Op::GiveBack { id, a });
                }
                None => {}
            }
        }
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
                let r = l.call(h, Op::Memo { ev });
                let Reply::Memo(bucket_memo) = r else {
                    unexpected("Memo", r)
                };
                let mut found = None;
                for (i, line) in self.lines.iter().enumerate() {
                    let memo = match line {
                        Line::Plain(_) => l.plain.memos.get(&ev).copied(),
                        Line::Bucket => bucket_memo,
                    };
                    if let Some(m) = memo.filter(|m| *m != Placed::Released) {
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
                    match l.call(h, Op::ReleaseLook { ev }) {
                        // Units are about to come back here: marked first,
                        // as a refund does; the others hear it before.
                        Reply::Marked(units) => {
                            self.step = if l.mutant == Mutant::NoReleaseMark {
                                OStep::RelRevert(i)
                            } else {
                                OStep::RelNotify(i, units)
                            };
                            Report::Running
                        }
                        Reply::Release(customer, _) => {
                            self.step = OStep::RelUnreserve(i, customer);
                            Report::Running
                        }
                        // Reverted by a refund meanwhile, or nothing of
                        // this event here: nothing to give back.
                        Reply::Nothing => self.next_release(i + 1),
                        r => unexpected("ReleaseLook", r),
                    }
                }
            },
            OStep::RelNotify(i, units) => {
                notify_all_but(l, l.order_home(ev), units);
                self.step = OStep::RelRevert(i);
                Report::Running
            }
            OStep::RelRevert(i) => {
                let h = l.order_home(ev);
                match l.call(h, Op::ReleaseRevert { ev }) {
                    // The event is decided: what it took must go back. The
                    // release waits for the repair.
                    Reply::Corrupt => Report::Running,
                    Reply::Release(customer, _) => {
                        self.step = OStep::RelUnreserve(i, customer);
                        Report::Running
                    }
                    Reply::Nothing => self.next_release(i + 1),
                    r => unexpected("ReleaseRevert", r),
                }
            }
            OStep::RelUnreserve(i, customer) => {
                let hc = l.home(customer);
                let _ = l.call(hc, Op::Unreserve { order: ev });
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
