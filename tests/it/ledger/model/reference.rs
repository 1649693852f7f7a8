//! The model: a small pure version of CONTRACT.md section 3 (promotions,
//! records, per-customer counters and memos), its decisions, and the keys
//! it expects under the test's prefix.

use std::collections::BTreeMap;

use super::*;
use crate::common::redis::*;
use deductor::domain::decision::{
    AcceptedLine, PlaceDecision, Reason, RefundDecision, RefundLineResult, Remaining,
};
use deductor::domain::event::{OrderPlaced, OrderRefunded};
use deductor::domain::keys::Keys;

#[derive(Debug, Clone)]
pub(super) struct Promo {
    pub(super) fields: BTreeMap<String, String>,
}

/// A promotion field that is not a canonical number (the Corrupt action).
pub(super) const CORRUPT_FIELD: (&str, &str) = ("starts_at", "1e3");
pub(super) const MAX_AMOUNT: u64 = 999_999_999_999_999;

impl Promo {
    pub(super) fn num(&self, f: &str) -> Option<u64> {
        self.fields.get(f).map(|v| v.parse().unwrap())
    }
    pub(super) fn corrupt(&self) -> bool {
        self.fields.get(CORRUPT_FIELD.0).map(String::as_str) == Some(CORRUPT_FIELD.1)
    }
    pub(super) fn sub(&mut self, f: &str, by: u64) {
        if let Some(v) = self.num(f) {
            assert!(v >= by, "model went negative");
            self.fields.insert(f.into(), (v - by).to_string());
        }
    }
    /// A refund or release: never past the initial amount (nor the bound).
    pub(super) fn credit(&mut self, f: &str, by: u64) {
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
pub(super) struct Rec {
    pub(super) reverted: bool,
    pub(super) event: Option<String>,
    pub(super) budget: u64,
    pub(super) stock: u64,
    pub(super) budget0: u64,
    pub(super) stock0: u64,
    /// The customer the deduction counted for (None: a refund's tombstone).
    pub(super) customer: Option<usize>,
    pub(super) counted: Option<bool>,
    pub(super) gen: Option<String>,
    pub(super) absorbed: Option<String>,
    /// Further absorbed events (`absorbed:<E>` fields) with their numbers,
    /// in the order they came.
    pub(super) more: Vec<(String, u64)>,
    /// refund event -> stored result.
    pub(super) refunds: BTreeMap<String, String>,
    /// A field is corrupt (`counted` reads [`CORRUPT_COUNTED`]): every
    /// script that reads the record refuses it.
    pub(super) corrupt: bool,
}

/// The value of `counted` in a corrupt record (the CorruptRecord action).
pub(super) const CORRUPT_COUNTED: &str = "7";

impl Rec {
    pub(super) fn tombstone() -> Rec {
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
            more: Default::default(),
            refunds: BTreeMap::new(),
            corrupt: false,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Model {
    pub(super) promos: BTreeMap<usize, Promo>,
    /// promotion -> its last incarnation number (key `promo:{P}:gen`).
    pub(super) gens: BTreeMap<usize, u64>,
    /// promotion -> the highest per-customer limit it ever had.
    pub(super) max_limit: BTreeMap<usize, u64>,
    /// (promotion, customer) -> used; present once counted.
    pub(super) used: BTreeMap<(usize, usize), u64>,
    /// (promotion, order) -> record.
    pub(super) records: BTreeMap<(usize, usize), Rec>,
    /// (promotion, event) -> reason.
    pub(super) rejected: BTreeMap<(usize, String), Reason>,
    /// (promotion, event): placements absorbed by step 1 into another
    /// event's record (memo "accepted").
    pub(super) absorbed: std::collections::BTreeSet<(usize, String)>,
    /// (promotion, event): lines released for a rejected event (memo
    /// "released"; never over a reason, replaces "accepted").
    pub(super) released: std::collections::BTreeSet<(usize, String)>,
    /// (promotion, refund event): a refund line that met corrupt data
    /// (memo `refund:{E}` = "rejected corrupt_promotion").
    pub(super) refund_corrupt: std::collections::BTreeSet<(usize, String)>,
    /// The ledger marker (`promo:ledger`), as the first `promo set` wrote it.
    pub(super) marker: Option<String>,
    /// (promotion, order): every record a script created (a deduction or a
    /// refund's tombstone), named by the promotion's day index; a record
    /// deleted later (a release) stays named.
    pub(super) indexed: std::collections::BTreeSet<(usize, usize)>,
}

pub(super) struct Line {
    pub(super) status: Result<(), Reason>,
    pub(super) duplicate: bool,
    pub(super) budget: u64,
    pub(super) stock: u64,
}

pub(super) fn pidx(p: &str) -> usize {
    PROMOS.iter().position(|x| *x == p).unwrap()
}

pub(super) fn oidx(o: &str) -> usize {
    o[1..].parse().unwrap()
}

pub(super) fn cidx(c: &str) -> usize {
    c[1..].parse().unwrap()
}

impl Model {
    /// What a reply says the promotion has left (nothing when it is corrupt).
    pub(super) fn remaining(&self, p: usize) -> Remaining {
        match self.promos.get(&p) {
            None => Remaining::default(),
            Some(pr) if pr.corrupt() => Remaining::default(),
            Some(pr) => Remaining {
                budget: pr.num("budget"),
                stock: pr.num("stock"),
            },
        }
    }

    pub(super) fn corrupt(&self, p: usize) -> bool {
        self.promos.get(&p).is_some_and(Promo::corrupt)
    }

    pub(super) fn record_corrupt(&self, p: usize, o: usize) -> bool {
        self.records.get(&(p, o)).is_some_and(|r| r.corrupt)
    }

    /// Whether any record of order `o` is corrupt now.
    pub(super) fn order_corrupt(&self, o: usize) -> bool {
        self.records.iter().any(|((_, x), r)| *x == o && r.corrupt)
    }

    /// What promo_set.lua does: a new incarnation.
    pub(super) fn seeded(&mut self, p: usize, fields: BTreeMap<String, String>) {
        *self.gens.entry(p).or_insert(0) += 1;
        if let Some(n) = fields.get("per_customer") {
            let n = n.parse().unwrap();
            let m = self.max_limit.entry(p).or_insert(0);
            *m = (*m).max(n);
        }
        self.promos.insert(p, Promo { fields });
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn deduct(
        &mut self,
        p: usize,
        o: usize,
        c: usize,
        e: &str,
        b: u64,
        s: u64,
        t: i64,
    ) -> Line {
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
            // Unreadable (corrupt) counts as gone: the amounts are 0.
            let rec = self.records.get(&(p, o)).filter(|r| !r.corrupt);
            return line(
                Ok(()),
                true,
                rec.map_or(0, |r| r.budget0),
                rec.map_or(0, |r| r.stock0),
            );
        }
        if self.record_corrupt(p, o) {
            // Remembered like corrupt promotion data.
            self.rejected
                .insert((p, e.to_owned()), Reason::CorruptPromotion);
            return line(Err(Reason::CorruptPromotion), false, 0, 0);
        }
        // The record decides before the promotion is read.
        if let Some(rec) = self.records.get_mut(&(p, o)) {
            if !rec.reverted || rec.event.as_deref() == Some(e) {
                let (b0, s0) = (rec.budget0, rec.stock0);
                if rec.event.as_deref() != Some(e) {
                    if !rec.reverted && rec.absorbed.is_none() {
                        rec.absorbed = Some(e.to_owned());
                    } else if !rec.reverted
                        && rec.absorbed.as_deref() != Some(e)
                        && !rec.more.iter().any(|(x, _)| x == e)
                    {
                        let last = rec.more.iter().map(|x| x.1).max().unwrap_or(0);
                        rec.more.push((e.to_owned(), last + 1));
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
        self.indexed.insert((p, o));
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
                more: Default::default(),
                refunds: BTreeMap::new(),
                corrupt: false,
            },
        );
        line(Ok(()), false, b, s)
    }

    /// release.lua; false when the line's promotion is corrupt: the script
    /// refuses before writing anything, and the ledger's release is blocked
    /// (the event is retried once the data is repaired).
    #[must_use]
    pub(super) fn release(&mut self, p: usize, o: usize, c: usize, e: &str) -> bool {
        if self.corrupt(p) || self.record_corrupt(p, o) {
            return false;
        }
        let key = (p, e.to_owned());
        if !self.rejected.contains_key(&key) {
            self.absorbed.remove(&key);
            self.released.insert(key);
        }
        let Some(rec) = self.records.get_mut(&(p, o)) else {
            return true;
        };
        // E is no longer absorbed (it is rejected); when it owns the record,
        // the deduction is handed over to the noted absorbed event, else the
        // first further one (a chain of absorbed events keeps an owner); the
        // first further one then fills an empty note.
        rec.more.retain(|(x, _)| x != e);
        if rec.absorbed.as_deref() == Some(e) {
            rec.absorbed = None;
        }
        let owns = !rec.reverted && rec.event.as_deref() == Some(e);
        let mut heir = None;
        if owns {
            heir = rec.absorbed.take();
            if heir.is_none() && !rec.more.is_empty() {
                heir = Some(rec.more.remove(0).0);
            }
        }
        if rec.absorbed.is_none() && !rec.more.is_empty() {
            rec.absorbed = Some(rec.more.remove(0).0);
        }
        if let Some(a) = heir {
            rec.event = Some(a);
            return true;
        }
        if !owns {
            return true;
        }
        let rec = rec.clone();
        if let Some(pr) = self.promos.get_mut(&p) {
            if pr.fields.get("gen") == rec.gen.as_ref() {
                pr.credit("budget", rec.budget);
                pr.credit("stock", rec.stock);
            }
        }
        // The slot goes back to the customer it counted for (the ledger
        // releases again with the record's customer when the event names
        // another: a hand-over from an absorbed event of another customer).
        let owner = rec.customer.unwrap_or(c);
        if rec.counted != Some(false) {
            if let Some(u) = self.used.get_mut(&(p, owner)) {
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
        true
    }

    /// The ledger's decision, or None when a release met corrupt data: the
    /// other lines are released and the event is to be retried later.
    pub(super) fn place(&mut self, e: &OrderPlaced) -> Option<PlaceDecision> {
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
                if !self.release_all(&ps, o, c, ev, Some(i)) {
                    return None;
                }
                return Some(PlaceDecision::Rejected {
                    duplicate: true,
                    reason: r,
                    promotion_id: e.lines[i].promotion_id.clone(),
                });
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
                    if !self.release_all(&ps[..i], o, c, ev, None) {
                        return None;
                    }
                    let (j, reason) = stored(self, 0).unwrap_or((i, Reason::OrderReverted));
                    return Some(PlaceDecision::Rejected {
                        duplicate: true,
                        reason,
                        promotion_id: e.lines[j].promotion_id.clone(),
                    });
                }
                Err(reason) => {
                    if r.duplicate || reason == Reason::CorruptPromotion {
                        // Read back, or corrupt data met afresh: the later
                        // lines are released too (an earlier attempt or
                        // delivery may hold them, after lost writes or
                        // before the data went corrupt); corrupt data there
                        // is skipped, not waited out.
                        for q in &ps[i + 1..] {
                            let _ = self.release(*q, o, c, ev);
                        }
                    }
                    if !self.release_all(&ps[..i], o, c, ev, None) {
                        return None;
                    }
                    return Some(PlaceDecision::Rejected {
                        duplicate: r.duplicate,
                        reason,
                        promotion_id: l.promotion_id.clone(),
                    });
                }
            }
        }
        Some(PlaceDecision::Accepted {
            duplicate: all_dup,
            lines,
        })
    }

    /// The ledger's release of `ps` in line order: every line that can be
    /// released is; false when one met corrupt data, except on `failing`,
    /// the line whose stored reason rejected the event (it holds nothing).
    fn release_all(
        &mut self,
        ps: &[usize],
        o: usize,
        c: usize,
        e: &str,
        failing: Option<usize>,
    ) -> bool {
        let mut done = true;
        for (i, q) in ps.iter().enumerate() {
            done &= self.release(*q, o, c, e) || failing == Some(i);
        }
        done
    }

    /// A delivery that deducts the first `upto` lines and dies.
    pub(super) fn zombie(&mut self, e: &OrderPlaced, upto: usize) {
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

    pub(super) fn rollback(
        &mut self,
        p: usize,
        o: usize,
        e: &str,
        b: Option<u64>,
        s: Option<u64>,
    ) -> Line {
        let line = |status, duplicate, budget, stock| Line {
            status,
            duplicate,
            budget,
            stock,
        };
        if self.refund_corrupt.contains(&(p, e.to_owned())) {
            return line(Err(Reason::CorruptPromotion), true, 0, 0);
        }
        if self.record_corrupt(p, o) {
            // The record is read (for a stored result) before anything else.
            self.refund_corrupt.insert((p, e.to_owned()));
            return line(Err(Reason::CorruptPromotion), false, 0, 0);
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
        if !self.records.contains_key(&(p, o)) {
            self.indexed.insert((p, o));
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

    pub(super) fn refund(&mut self, e: &OrderRefunded) -> RefundDecision {
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
    pub(super) fn dump(&self, keys: &Keys) -> Dump {
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
            for (e, n) in &r.more {
                h.insert(format!("absorbed:{e}"), n.to_string());
            }
            for (e, v) in &r.refunds {
                h.insert(format!("refund:{e}"), v.clone());
            }
            if r.corrupt {
                h.insert("counted".into(), CORRUPT_COUNTED.into());
            }
            d.insert(
                keys.record(&p(*i), &id(&format!("o{o}"))),
                ttl(DumpedValue::Hash(h)),
            );
        }
        for (i, o) in &self.indexed {
            let entry = d.entry(index_key(keys, PROMOS[*i])).or_insert(Dumped {
                value: DumpedValue::Set(Default::default()),
                expires: true,
            });
            if let DumpedValue::Set(members) = &mut entry.value {
                members.insert(format!("o{o}"));
            }
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
        if let Some(m) = &self.marker {
            d.insert(
                keys.ledger_marker(),
                Dumped {
                    value: DumpedValue::String(m.clone()),
                    expires: false,
                },
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
