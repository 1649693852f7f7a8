//! The bucket protocol of docs/buckets.md (issue 28): one hot promotion's
//! budget and stock split over K buckets, each on its own hash tag `{P~k}`
//! (so on its own Cluster slot), and the deliveries that walk them.
//!
//! Pure and sans-I/O: a delivery (`Place`, `RefundRun`, `Transfer`,
//! `Adjust`) is a state machine. Each `step` either asks for calls on
//! buckets (`Step::Call`: an operation `Op` on bucket j, one atomic call of
//! lua/bucket.lua on that bucket's slot; several only for the
//! notifications of every other bucket) and is then stepped again with
//! their replies, or reports (`Step::Report`). The service runs the calls
//! on Redis; the property test runs them on a model of the buckets
//! (tests/it/ledger/buckets), under crashes, zombie deliveries and corrupt
//! data, and a differential test holds lua/bucket.lua to that model.
//!
//! Every amount has both dimensions, budget and stock (`Units`): a line
//! needs both, from one bucket's units and the gifts it gathered.
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
//! - notifications skip a corrupt bucket; the repair clears its bounds and
//!   counts as a notification.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::ops::{Add, AddAssign, Sub, SubAssign};

/// An id (event, order, customer) as the protocol uses it: which of K
/// buckets it belongs to. An order's record and decisions live at its
/// order's bucket, a customer's reservations at the customer's.
pub trait BucketId: Clone + Ord + Debug {
    fn bucket(&self, k: usize) -> usize;
}

/// The model's ids (tests/it/ledger/buckets): bucket = id mod K.
impl BucketId for u32 {
    fn bucket(&self, k: usize) -> usize {
        *self as usize % k
    }
}

/// The service's ids: FNV-1a of the id's bytes, mod K. Stable across
/// processes and releases (an order's bucket must never move: its record
/// is there).
impl BucketId for crate::domain::event::Id {
    fn bucket(&self, k: usize) -> usize {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.as_str().bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        (h % k.max(1) as u64) as usize
    }
}

/// The hash tag of a bucketed promotion's bucket: `P~s` (`~` is in no id,
/// so it can never be another promotion's tag).
pub fn bucket_tag(promo: &str, suffix: u32) -> String {
    format!("{promo}~{suffix}")
}

/// The suffixes of a bucketed promotion's K tags `{P~s}`, chosen so that
/// the K slots land on as many primaries as there are, none serving more
/// than ceil(K / N) of them. `node_of(tag)` names the primary (0..nodes)
/// that serves the slot of `{tag}`, `None` when unknown. One node (a
/// standalone server): 0..K-1. The lowest suffixes that fit are taken, so
/// the same cluster layout always gives the same suffixes; if the layout
/// cannot give every primary its share within 100,000 tries (a primary
/// with almost no slots), the rest are the lowest suffixes not taken.
pub fn bucket_suffixes(
    promo: &str,
    k: usize,
    nodes: usize,
    node_of: impl Fn(&str) -> Option<usize>,
) -> Vec<u32> {
    if nodes <= 1 {
        return (0..k as u32).collect();
    }
    let cap = k.div_ceil(nodes);
    let mut count = vec![0usize; nodes];
    let mut out: Vec<u32> = Vec::with_capacity(k);
    for s in 0..100_000u32 {
        if out.len() == k {
            break;
        }
        if let Some(n) = node_of(&bucket_tag(promo, s)).filter(|n| *n < nodes) {
            if count[n] < cap {
                count[n] += 1;
                out.push(s);
            }
        }
    }
    let mut s = 0u32;
    while out.len() < k {
        if !out.contains(&s) {
            out.push(s);
        }
        s += 1;
    }
    out
}

/// A delivery of the protocol, as a driver steps it.
pub trait Walk<I> {
    /// One step, with the replies of the calls the previous step asked for
    /// (in the order asked), `None` at first.
    fn walk(&mut self, replies: Option<Vec<Reply<I>>>) -> Step<I>;
    /// Whether the delivery is backing off: units are on their way and it
    /// can be neither served nor rejected yet (ask again after a pause).
    fn waiting(&self) -> bool {
        false
    }
    /// Whether work is left after a `Report::Short` (a line that gathered
    /// settles its gifts after its decision).
    fn cleaning(&self) -> bool {
        false
    }
}

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
    /// Rejected `promotion_inactive`: paused, or the event's time outside
    /// the promotion's window (the order's bucket's copy of them).
    Inactive,
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
    /// A release finished: whether this delivery gave the deduction back.
    Released(bool),
}

/// What one step of a delivery reports.
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

/// What a step asks for: calls on buckets (bucket, operation), whose
/// replies, in the same order, the next step is given; or a report.
#[derive(Clone, Debug, PartialEq)]
pub enum Step<I> {
    Call(Vec<(usize, Op<I>)>),
    Report(Report),
}

/// In a step: the reply of the call this step asked for, or (the first
/// time through) ask for it and return.
/// What a step returns: the calls it asked for, if any, else its report.
fn asked_or<I>(out: &mut Vec<(usize, Op<I>)>, report: Report) -> Step<I> {
    if out.is_empty() {
        Step::Report(report)
    } else {
        Step::Call(std::mem::take(out))
    }
}

/// (A step that makes one call gets one reply; the replies of a step's
/// notifications are not read.)
macro_rules! call {
    ($self:ident, $replies:ident, $j:expr, $op:expr $(,)?) => {
        match $replies.as_mut().and_then(|v| v.pop()) {
            Some(r) => r,
            None => {
                $self.out = vec![($j, $op)];
                return Report::Running;
            }
        }
    };
}

/// In a step: up to `units` are on their way to bucket `to`: every other
/// bucket hears it and raises its bound of `to` by as much (one call each,
/// in a row; a corrupt bucket answers CORRUPT, and its repair clears its
/// bounds).
macro_rules! notify {
    ($self:ident, $replies:ident, $k:expr, $to:expr, $units:expr) => {
        if $replies.is_none() {
            let (to, units) = ($to, $units);
            $self.out = (0..$k)
                .filter(|m| *m != to)
                .map(|m| (m, Op::Notify { to, units }))
                .collect();
            // K = 1: nobody to notify, go on.
            if !$self.out.is_empty() {
                return Report::Running;
            }
        }
    };
}

/// A gift a deduction consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credit {
    pub from: usize,
    pub attempt: u32,
    pub units: Units,
}

/// An operation on one bucket: one atomic call on its slot.
#[derive(Clone, Debug, PartialEq)]
pub enum Op<I> {
    /// A placement line's first call at its order's bucket: an earlier
    /// decision, a tombstone, a deduction (tentative under a per-customer
    /// limit), a fast "short", or what a gather starts from.
    /// `at`: the event's business time (unix seconds), against the
    /// promotion's window and status copied into every bucket.
    Start {
        ev: I,
        cust: I,
        units: Units,
        at: u64,
    },
    /// What another bucket holds for a gather.
    Peek { ev: I },
    /// A gather's rejection at home, if nothing changed while it looked.
    /// `seen`: what each bucket it looked at held (their new bounds).
    Reject {
        ev: I,
        a: u32,
        incr: u64,
        notify: u64,
        dim: Dim,
        saw_corrupt: bool,
        seen: Vec<(usize, Units)>,
    },
    /// Up to `want` more units for (ev, attempt a), gathered by `receiver`.
    Give {
        ev: I,
        a: u32,
        want: Units,
        receiver: usize,
    },
    /// A gather's acceptance at home with the gifts it holds.
    Accept {
        ev: I,
        cust: I,
        units: Units,
        a: u32,
        mine: Vec<(usize, Units)>,
    },
    /// The junior (or a stale delivery) gives up attempt `a` at home.
    Yield { ev: I, a: u32 },
    /// Every gift of `ev`'s attempts up to `upto` goes back.
    ReturnAll { ev: I, upto: u32 },
    /// The customer's reservation for `order`, at the customer's bucket.
    Reserve { order: I, cust: I },
    /// The tentative deduction becomes the deduction.
    Settle { ev: I },
    /// The tentative deduction is undone: `user_limit_reached`.
    Undo { ev: I },
    /// `order`'s reservation is released (idempotent).
    Unreserve { order: I },
    /// `ev`'s gifts here are settled (what `credited` consumed) or returned.
    Cleanup { ev: I, credited: Vec<Credit> },
    /// A refund's first call at the order's bucket.
    RefundLook { ev: I, order: I },
    /// Up to `units` are on their way to bucket `to`.
    Notify { to: usize, units: Units },
    /// A refund gives the order's deduction back.
    RefundRevert { ev: I, order: I },
    /// A release of the event's bucketed line: the first call.
    ReleaseLook { ev: I },
    /// A release gives the event's deduction back.
    ReleaseRevert { ev: I },
    /// The event's memo here.
    Memo { ev: I },
    /// A transfer's mark at its destination.
    TransferMark { id: I },
    /// A transfer takes up to `n` from its source, once.
    TransferTake { id: I, n: Units, to: usize },
    /// A transfer credits what it took, once.
    TransferCredit { id: I, from: usize, took: Units },
    /// A transfer's source settles what its destination credited.
    TransferSettle { id: I, credited: Units },
    /// An adjustment's mark at a bucket it adds to.
    AdjustMark { id: I },
    /// An adjustment adds its share here, once.
    AdjustCredit { id: I, share: Units },
    /// An adjustment takes away at most its share of what is free, once.
    AdjustRemove { id: I, share: Units },
    /// The sweeper: the gifts given here and not settled or returned.
    OpenGifts,
    /// The sweeper: what `id`'s order bucket knows of its decision.
    EventState { id: I },
    /// The sweeper: gift (id, a) goes back.
    GiveBack { id: I, a: u32 },
}

/// What a gather starts from: the home's state when the line looked.
#[derive(Clone, Debug, PartialEq)]
pub struct Gather {
    pub a: u32,
    pub incr: u64,
    pub notify: u64,
    pub avail: Units,
    /// Given away or set aside here.
    pub held: Units,
    pub pending: bool,
    /// A line with a lower id holds units given here.
    pub senior: bool,
    pub bounds: Vec<Option<Units>>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Reply<I> {
    Ok,
    /// The bucket's counters are corrupt: nothing was done.
    Corrupt,
    /// The event is decided: this decision, with the gifts it consumed.
    Decided(Placed, Vec<Credit>),
    /// A tentative deduction waits for the customer's reservation.
    Tentative,
    Short {
        dim: Dim,
        fast: bool,
    },
    /// Not short yet: units may come back (back off, ask again).
    Wait,
    /// Something changed: start the line again.
    Restart,
    /// The attempt moved on: yield.
    Yield,
    Gather(Gather),
    Peeked {
        corrupt: bool,
        avail: Units,
        held: Units,
        holds: bool,
        pending: bool,
        senior: bool,
    },
    Gave {
        total: Units,
        senior: bool,
    },
    Reserved {
        ok: bool,
        refused_now: bool,
    },
    Refund(Refund),
    /// Marked: `units` are about to come back here (notify, then revert).
    Marked(Units),
    /// Given back (or given back before): release the customer's
    /// reservation; `units` the deduction held.
    Release(I, Units),
    /// Look again.
    Relook,
    /// Nothing to give back.
    Nothing,
    Memo(Option<Placed>),
    Amount(Units),
    Gifts(Vec<(I, u32, usize)>),
    Event {
        credited: Option<Vec<Credit>>,
        attempt: Option<u32>,
    },
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
pub struct Place<I> {
    pub ev: I,
    pub cust: I,
    pub units: Units,
    /// The event's business time (see `Op::Start`).
    pub at: u64,
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
    /// Calls this step asks for (see `Step`).
    out: Vec<(usize, Op<I>)>,
    pub restarts: u32,
    /// The first call found the line decided (by an earlier delivery).
    found: bool,
    /// Refusals of this delivery's reservation at the customer's bucket
    /// (where `user_limit_reached` is decided; Undo applies it).
    pub refusals: u32,
}

fn unexpected<I: std::fmt::Debug>(what: &str, r: Reply<I>) -> ! {
    unreachable!("{what} answered {r:?}")
}

impl<I: BucketId> Place<I> {
    pub fn new(ev: I, cust: I, units: Units, k: usize) -> Self {
        Place {
            home: ev.bucket(k),
            ev,
            cust,
            units,
            at: 0,
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
            out: Vec::new(),
            restarts: 0,
            found: false,
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
    fn at_home(&mut self, r: Reply<I>, what: &str) -> Report {
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
    fn gather(&mut self, g: Gather) -> Report {
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
        self.to_peek = (0..self.k - 1)
            .map(|i| self.other(i))
            .filter(|j| !matches!(g.bounds[*j], Some(x) if !x.min(missing).any_pos()))
            .collect();
        if self.to_peek.is_empty() {
            return self.looked();
        }
        self.step = PStep::Peek(0);
        Report::Running
    }

    /// One step: `replies` are those of the calls the previous step asked
    /// for (`Step::Call`), `None` at first.
    pub fn step(&mut self, mut replies: Option<Vec<Reply<I>>>) -> Step<I> {
        let report = self.step_inner(&mut replies);
        asked_or(&mut self.out, report)
    }

    fn step_inner(&mut self, replies: &mut Option<Vec<Reply<I>>>) -> Report {
        let k = self.k;
        let ev = self.ev.clone();
        match self.step {
            PStep::Hop1 => {
                self.waiting = false;
                let r = call!(
                    self,
                    replies,
                    self.home,
                    Op::Start {
                        ev,
                        cust: self.cust.clone(),
                        units: self.units,
                        at: self.at,
                    },
                );
                if self.restarts == 0 && matches!(r, Reply::Decided(..)) {
                    self.found = true;
                }
                match r {
                    Reply::Wait => self.wait(),
                    Reply::Gather(g) => self.gather(g),
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
                } = call!(self, replies, j, Op::Peek { ev })
                else {
                    unreachable!("Peek answers Peeked")
                };
                // Unknown: served from the others, never short.
                if corrupt {
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
                let r = call!(
                    self,
                    replies,
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
                if avail.min(missing).any_pos() || mine {
                    let r = call!(
                        self,
                        replies,
                        j,
                        Op::Give {
                            ev,
                            a: self.a,
                            want: missing,
                            receiver: self.home,
                        }
                    );
                    self.step = PStep::Give(i + 1);
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
                } else {
                    self.step = PStep::Give(i + 1);
                }
                Report::Running
            }
            PStep::FinalAccept => {
                let r = call!(
                    self,
                    replies,
                    self.home,
                    Op::Accept {
                        ev,
                        cust: self.cust.clone(),
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
            PStep::Yield => match call!(self, replies, self.home, Op::Yield { ev, a: self.a }) {
                Reply::Ok => {
                    self.step = PStep::ReturnAll(0);
                    Report::Running
                }
                r => self.at_home(r, "Yield"),
            },
            PStep::ReturnAll(i) => {
                let j = self.other(i);
                match call!(self, replies, j, Op::ReturnAll { ev, upto: self.a }) {
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
                let hc = self.cust.bucket(k);
                let r = call!(
                    self,
                    replies,
                    hc,
                    Op::Reserve {
                        order: ev,
                        cust: self.cust.clone(),
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
                match call!(self, replies, self.home, op) {
                    // Back off until the repair.
                    Reply::Corrupt => Report::Running,
                    r => self.at_home(r, "Settle or Undo"),
                }
            }
            PStep::Unreserve => {
                let hc = self.cust.bucket(k);
                let _ = call!(self, replies, hc, Op::Unreserve { order: ev });
                self.after_decision()
            }
            PStep::Cleanup(j) => {
                let r = call!(
                    self,
                    replies,
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

    /// Whether this delivery's first call found the line decided by an
    /// earlier delivery (the outcome's `duplicate`).
    pub fn found_decided(&self) -> bool {
        self.found
    }
}

#[derive(Clone, Debug, PartialEq)]
enum RStep<I> {
    Look,
    Notify(Units),
    Revert,
    Release(I, Units),
}

/// One delivery of a refund of order `order` (its bucketed line). The
/// customer the refund names plays no part: the order's bucket keeps the
/// stored one.
#[derive(Clone, Debug)]
pub struct RefundRun<I> {
    pub ev: I,
    pub order: I,
    k: usize,
    step: RStep<I>,
    /// The last look found a placement waiting for its reservation.
    waiting: bool,
    out: Vec<(usize, Op<I>)>,
}

impl<I: BucketId> RefundRun<I> {
    pub fn new(ev: I, order: I, k: usize) -> Self {
        RefundRun {
            ev,
            order,
            k,
            step: RStep::Look,
            waiting: false,
            out: Vec::new(),
        }
    }

    /// One step (see `Place::step`).
    pub fn step(&mut self, mut replies: Option<Vec<Reply<I>>>) -> Step<I> {
        let report = self.step_inner(&mut replies);
        asked_or(&mut self.out, report)
    }

    fn step_inner(&mut self, replies: &mut Option<Vec<Reply<I>>>) -> Report {
        let k = self.k;
        let h = self.order.bucket(k);
        let (ev, order) = (self.ev.clone(), self.order.clone());
        self.waiting = false;
        match self.step.clone() {
            RStep::Look => match call!(self, replies, h, Op::RefundLook { ev, order }) {
                Reply::Refund(r) => Report::Done(Outcome::Refund(r)),
                Reply::Release(customer, units) => {
                    self.step = RStep::Release(customer, units);
                    Report::Running
                }
                Reply::Marked(units) => {
                    // Marked: units are about to come back here; the others
                    // hear it before they do.
                    self.step = RStep::Notify(units);
                    Report::Running
                }
                // A placement still waiting for its reservation (a zombie
                // delivery): look again once it has settled.
                Reply::Wait => {
                    self.waiting = true;
                    Report::Running
                }
                r => unexpected("RefundLook", r),
            },
            RStep::Notify(units) => {
                notify!(self, replies, k, h, units);
                self.step = RStep::Revert;
                Report::Running
            }
            RStep::Revert => {
                match call!(self, replies, h, Op::RefundRevert { ev, order }) {
                    Reply::Refund(r) => return Report::Done(Outcome::Refund(r)),
                    Reply::Release(customer, units) => self.step = RStep::Release(customer, units),
                    Reply::Relook => self.step = RStep::Look,
                    r => unexpected("RefundRevert", r),
                }
                Report::Running
            }
            RStep::Release(customer, units) => {
                let hc = customer.bucket(k);
                let _ = call!(self, replies, hc, Op::Unreserve { order });
                Report::Done(Outcome::Refund(Refund::Applied(units)))
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum LStep<I> {
    Look,
    Notify(Units),
    Revert,
    Unreserve(I),
}

/// One delivery's release of an event's bucketed line, when the event
/// (a multi-line order) is rejected on another line: at the order's
/// bucket, mark (units on their way), notify every other bucket, give the
/// deduction back (the record becomes `released`); then free the
/// customer's reservation at the customer's bucket. Idempotent by the
/// event: a release that finds nothing of the event (or a deduction a
/// refund reverted meanwhile) gives nothing back. Reports
/// `Done(Outcome::Released(gave))`.
#[derive(Clone, Debug)]
pub struct ReleaseRun<I> {
    pub ev: I,
    k: usize,
    step: LStep<I>,
    gave: bool,
    out: Vec<(usize, Op<I>)>,
}

impl<I: BucketId> ReleaseRun<I> {
    pub fn new(ev: I, k: usize) -> Self {
        ReleaseRun {
            ev,
            k,
            step: LStep::Look,
            gave: false,
            out: Vec::new(),
        }
    }

    /// One step (see `Place::step`).
    pub fn step(&mut self, mut replies: Option<Vec<Reply<I>>>) -> Step<I> {
        let report = self.step_inner(&mut replies);
        asked_or(&mut self.out, report)
    }

    fn step_inner(&mut self, replies: &mut Option<Vec<Reply<I>>>) -> Report {
        let k = self.k;
        let ev = self.ev.clone();
        let h = ev.bucket(k);
        match self.step.clone() {
            LStep::Look => match call!(self, replies, h, Op::ReleaseLook { ev }) {
                // Units are about to come back here: marked first, as a
                // refund does; the others hear it before they arrive.
                Reply::Marked(units) => {
                    self.step = LStep::Notify(units);
                    Report::Running
                }
                // Given back before (a crashed delivery): free the slot.
                Reply::Release(customer, _) => {
                    self.step = LStep::Unreserve(customer);
                    Report::Running
                }
                // Reverted by a refund meanwhile, or nothing of this event.
                Reply::Nothing => Report::Done(Outcome::Released(false)),
                r => unexpected("ReleaseLook", r),
            },
            LStep::Notify(units) => {
                notify!(self, replies, k, h, units);
                self.step = LStep::Revert;
                Report::Running
            }
            LStep::Revert => match call!(self, replies, h, Op::ReleaseRevert { ev }) {
                // What the event took must go back: wait for the repair.
                Reply::Corrupt => Report::Running,
                Reply::Release(customer, _) => {
                    self.gave = true;
                    self.step = LStep::Unreserve(customer);
                    Report::Running
                }
                Reply::Nothing => Report::Done(Outcome::Released(false)),
                r => unexpected("ReleaseRevert", r),
            },
            LStep::Unreserve(customer) => {
                let hc = customer.bucket(k);
                let _ = call!(self, replies, hc, Op::Unreserve { order: ev });
                Report::Done(Outcome::Released(self.gave))
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
pub struct Adjust<I> {
    pub id: I,
    pub n: Units,
    pub add: bool,
    k: usize,
    step: AStep,
    out: Vec<(usize, Op<I>)>,
}

impl<I: BucketId> Adjust<I> {
    pub fn new(id: I, n: Units, add: bool, k: usize) -> Self {
        Adjust {
            id,
            n,
            add,
            k,
            step: if add {
                AStep::Mark(0)
            } else {
                AStep::Remove(0)
            },
            out: Vec::new(),
        }
    }

    fn next(&mut self, j: usize) -> Report {
        if j + 1 == self.k {
            return Report::Done(Outcome::Moved);
        }
        self.step = if self.add {
            AStep::Mark(j + 1)
        } else {
            AStep::Remove(j + 1)
        };
        Report::Running
    }

    /// One step (see `Place::step`); `Done(Moved)` once finished.
    pub fn step(&mut self, mut replies: Option<Vec<Reply<I>>>) -> Step<I> {
        let report = self.step_inner(&mut replies);
        asked_or(&mut self.out, report)
    }

    fn step_inner(&mut self, replies: &mut Option<Vec<Reply<I>>>) -> Report {
        let k = self.k;
        let id = self.id.clone();
        match self.step {
            AStep::Mark(j) => match call!(self, replies, j, Op::AdjustMark { id }) {
                // Credited before.
                Reply::Amount(_) => self.next(j),
                Reply::Ok => {
                    self.step = AStep::Notify(j);
                    Report::Running
                }
                r => unexpected("AdjustMark", r),
            },
            AStep::Notify(j) => {
                notify!(self, replies, k, j, self.n.share(k, j));
                self.step = AStep::Credit(j);
                Report::Running
            }
            AStep::Credit(j) | AStep::Remove(j) => {
                let share = self.n.share(k, j);
                let op = if self.add {
                    Op::AdjustCredit { id, share }
                } else {
                    Op::AdjustRemove { id, share }
                };
                match call!(self, replies, j, op) {
                    Reply::Corrupt => Report::Running,
                    Reply::Ok => self.next(j),
                    r => unexpected("AdjustCredit or AdjustRemove", r),
                }
            }
        }
    }
}

/// One run of an operator's transfer of `n` units from bucket `from` to
/// bucket `to` (what `promo rebalance` does for each pair).
#[derive(Clone, Debug)]
pub struct Transfer<I> {
    pub id: I,
    pub from: usize,
    pub to: usize,
    pub n: Units,
    k: usize,
    step: TStep,
    out: Vec<(usize, Op<I>)>,
}

impl<I: BucketId> Transfer<I> {
    pub fn new(id: I, from: usize, to: usize, n: Units, k: usize) -> Self {
        Transfer {
            id,
            from,
            to,
            n,
            k,
            step: TStep::Mark,
            out: Vec::new(),
        }
    }

    /// One step (see `Place::step`); `Done(Moved)` once finished.
    pub fn step(&mut self, mut replies: Option<Vec<Reply<I>>>) -> Step<I> {
        let report = self.step_inner(&mut replies);
        asked_or(&mut self.out, report)
    }

    fn step_inner(&mut self, replies: &mut Option<Vec<Reply<I>>>) -> Report {
        let id = self.id.clone();
        match self.step {
            TStep::Mark => match call!(self, replies, self.to, Op::TransferMark { id }) {
                // Credited before: only the source's settlement is left.
                Reply::Amount(c) => self.step = TStep::Settle(c),
                Reply::Ok => self.step = TStep::Notify,
                r => unexpected("TransferMark", r),
            },
            TStep::Notify => {
                notify!(self, replies, self.k, self.to, self.n);
                self.step = TStep::Take;
            }
            TStep::Take => {
                let op = Op::TransferTake {
                    id,
                    n: self.n,
                    to: self.to,
                };
                match call!(self, replies, self.from, op) {
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
                match call!(self, replies, self.to, op) {
                    Reply::Corrupt => {}
                    Reply::Amount(c) => self.step = TStep::Settle(c),
                    r => unexpected("TransferCredit", r),
                }
            }
            TStep::Settle(credited) => {
                match call!(
                    self,
                    replies,
                    self.from,
                    Op::TransferSettle { id, credited }
                ) {
                    Reply::Corrupt => {}
                    Reply::Ok => return Report::Done(Outcome::Moved),
                    r => unexpected("TransferSettle", r),
                }
            }
        }
        Report::Running
    }
}

macro_rules! walk {
    ($($t:ident),*) => {
        $(impl<I: BucketId> Walk<I> for $t<I> {
            fn walk(&mut self, replies: Option<Vec<Reply<I>>>) -> Step<I> {
                self.step(replies)
            }
        })*
    };
}
walk!(Transfer, Adjust, ReleaseRun);

impl<I: BucketId> Walk<I> for RefundRun<I> {
    fn walk(&mut self, replies: Option<Vec<Reply<I>>>) -> Step<I> {
        self.step(replies)
    }

    /// The order's placement waits for its reservation: look again later.
    fn waiting(&self) -> bool {
        self.waiting
    }
}

impl<I: BucketId> Walk<I> for Place<I> {
    fn walk(&mut self, replies: Option<Vec<Reply<I>>>) -> Step<I> {
        self.step(replies)
    }

    fn waiting(&self) -> bool {
        Place::waiting(self)
    }

    fn cleaning(&self) -> bool {
        Place::cleaning(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_total_is_split_over_the_buckets_without_loss() {
        let total = Units::new(10, 7);
        for k in 1..=5 {
            let parts: Vec<Units> = (0..k).map(|i| total.share(k, i)).collect();
            assert_eq!(parts.iter().copied().sum::<Units>(), total, "K = {k}");
            let most = parts.iter().map(|u| u.stock).max().unwrap_or(0);
            let least = parts.iter().map(|u| u.stock).min().unwrap_or(0);
            assert!(most - least <= 1, "K = {k}: {parts:?}");
        }
    }

    /// An order's bucket never moves (its record is there): the hash of
    /// an id is pinned.
    #[test]
    fn an_ids_bucket_is_pinned() {
        use crate::domain::event::Id;
        let at = |s: &str, k: usize| Id::parse(s).map(|i| i.bucket(k)).unwrap_or(usize::MAX);
        let got: Vec<usize> = ["o-1", "order-42", "c7", "a"]
            .iter()
            .map(|s| at(s, 8))
            .collect();
        // FNV-1a 64 of the bytes, mod 8 (computed apart, in Python).
        assert_eq!(got, [0, 4, 7, 4]);
        assert!((0..1000).all(|n| at(&format!("o{n}"), 3) < 3));
    }

    #[test]
    fn the_buckets_spread_over_the_primaries() {
        // A fake layout: a tag's node is its length's and last digit's sum.
        let node_of = |tag: &str| {
            let d = tag.bytes().last().map_or(0, |b| usize::from(b - b'0'));
            Some((tag.len() + d) % 3)
        };
        for k in 1..=9 {
            let s = bucket_suffixes("P", k, 3, node_of);
            assert_eq!(s.len(), k);
            let mut per = [0usize; 3];
            for x in &s {
                per[node_of(&bucket_tag("P", *x)).unwrap_or(9)] += 1;
            }
            assert!(per.iter().all(|n| *n <= k.div_ceil(3)), "K = {k}: {per:?}");
            let mut sorted = s.clone();
            sorted.dedup();
            assert_eq!(sorted.len(), k, "distinct suffixes: {s:?}");
        }
        assert_eq!(bucket_suffixes("P", 4, 1, |_| None), vec![0, 1, 2, 3]);
        // Nothing known: still K distinct suffixes.
        assert_eq!(bucket_suffixes("P", 3, 3, |_| None), vec![0, 1, 2]);
    }

    #[test]
    fn budget_is_short_before_stock() {
        let need = Units::new(5, 5);
        assert_eq!(Units::new(4, 4).short_of(need), Some(Dim::Budget));
        assert_eq!(Units::new(5, 4).short_of(need), Some(Dim::Stock));
        assert_eq!(Units::new(5, 5).short_of(need), None);
    }

    /// A line asks its order's bucket first, takes what the reply says
    /// and reports it; under a per-customer limit it reserves at the
    /// customer's bucket and settles at the order's.
    #[test]
    fn a_placement_walks_start_reserve_settle() {
        let one = Units::new(1, 1);
        let mut p: Place<u32> = Place::new(7, 5, one, 3);
        let start = p.step(None);
        assert_eq!(
            start,
            Step::Call(vec![(
                1,
                Op::Start {
                    ev: 7,
                    cust: 5,
                    units: one,
                    at: 0
                }
            )])
        );
        assert_eq!(
            p.step(Some(vec![Reply::Tentative])),
            Step::Report(Report::Running)
        );
        assert_eq!(
            p.step(None),
            Step::Call(vec![(2, Op::Reserve { order: 7, cust: 5 })])
        );
        let reserved = Reply::Reserved {
            ok: true,
            refused_now: false,
        };
        assert_eq!(p.step(Some(vec![reserved])), Step::Report(Report::Running));
        assert_eq!(p.step(None), Step::Call(vec![(1, Op::Settle { ev: 7 })]));
        let accepted = Placed::Accepted(one);
        assert_eq!(
            p.step(Some(vec![Reply::Decided(accepted, Vec::new())])),
            Step::Report(Report::Done(Outcome::Placed(accepted)))
        );
    }

    /// A refund that finds a deduction marks, notifies every other bucket
    /// (several calls in one step), gives back and releases.
    #[test]
    fn a_refund_notifies_every_other_bucket_in_one_step() {
        let u = Units::new(2, 1);
        let mut r: RefundRun<u32> = RefundRun::new(9, 4, 3);
        assert_eq!(
            r.step(None),
            Step::Call(vec![(1, Op::RefundLook { ev: 9, order: 4 })])
        );
        assert_eq!(
            r.step(Some(vec![Reply::Marked(u)])),
            Step::Report(Report::Running)
        );
        assert_eq!(
            r.step(None),
            Step::Call(vec![
                (0, Op::Notify { to: 1, units: u }),
                (2, Op::Notify { to: 1, units: u })
            ])
        );
        assert_eq!(
            r.step(Some(vec![Reply::Ok, Reply::Ok])),
            Step::Report(Report::Running)
        );
        assert_eq!(
            r.step(None),
            Step::Call(vec![(1, Op::RefundRevert { ev: 9, order: 4 })])
        );
        assert_eq!(
            r.step(Some(vec![Reply::Release(5, u)])),
            Step::Report(Report::Running)
        );
        assert_eq!(
            r.step(None),
            Step::Call(vec![(2, Op::Unreserve { order: 4 })])
        );
        assert_eq!(
            r.step(Some(vec![Reply::Ok])),
            Step::Report(Report::Done(Outcome::Refund(Refund::Applied(u))))
        );
    }
}
