//! The deliveries of the bucket protocol, as the property test runs them:
//! the walkers of `deductor::domain::buckets` (the service's own code)
//! driven against the model of the buckets (`bucket`), each step one call
//! (or the notifications of every other bucket in a row); and what is the
//! model's alone: orders that mix the bucketed promotion with a plain one
//! (`Order`), the plain promotion's scripts, and the sweeper.
//!
//! A placement is an order of one bucketed line, or of a bucketed line and
//! a line of a plain (unbucketed) promotion in either order (`Order`):
//! all or nothing, as docs/contract.md section 3 has it. When a line is
//! rejected, the lines before it are released (`release.lua`'s rule: what
//! the event deducted goes back, and the line is marked released so that a
//! slower delivery of the event repeats the decision).

use std::collections::BTreeMap;

use deductor::domain::buckets as d;
use deductor::domain::buckets::{Step, Walk};

use super::bucket::*;

pub type Place = d::Place<Ev>;
pub type RefundRun = d::RefundRun<Ev>;
pub type Transfer = d::Transfer<Ev>;
pub type Adjust = d::Adjust<Ev>;

fn unexpected(what: &str, r: Reply) -> ! {
    unreachable!("{what} answered {r:?}")
}

/// Up to `units` are on their way to bucket j: every other bucket hears it
/// (one call each, in a row; a corrupt bucket answers CORRUPT).
fn notify_all_but(l: &mut Ledger, j: usize, units: Units) {
    for m in (0..l.k()).filter(|m| *m != j) {
        let _ = l.call(m, Op::Notify { to: j, units });
    }
}

/// One step of `w` on the model: the calls it asks for, in a row, then
/// its report.
pub fn drive(w: &mut impl Walk<Ev>, l: &mut Ledger) -> Report {
    let mut replies = None;
    loop {
        match w.walk(replies.take()) {
            Step::Report(r) => return r,
            Step::Call(calls) => {
                replies = Some(calls.into_iter().map(|(j, op)| l.call(j, op)).collect());
            }
        }
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
                // (A mutant may answer the look as healthy: a transfer that
                // does not finish within its steps is left to the next
                // sweep.)
                let mut t = Transfer::new(id, j, dest, n, l.k());
                for _ in 0..4 * l.k() + 8 {
                    if drive(&mut t, l) == Report::Done(Outcome::Moved) {
                        break;
                    }
                }
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
                Line::Bucket => match drive(&mut self.place, l) {
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
                            self.step = OStep::RelNotify(i, units);
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

/// rollback.lua on a mixed order's plain line: revert a deduction, or
/// leave a tombstone so the order cannot deduct there later.
pub fn plain_rollback(l: &mut Ledger, order: Ev) {
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
}
