//! Bucketed promotions for the operator (issue 28, docs/contract.md
//! section 2b): `promo set --buckets K` creates one, `promo show` sums its
//! buckets, `pause` / `resume` / `limit` write the directory and every
//! bucket, `adjust` spreads a change over the buckets and `rebalance`
//! evens them out (each a change listed in the directory and walked to its
//! end), `delete` removes the directory and the buckets. A conversion from
//! or to a plain promotion is refused with a message.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use super::{AdminError, PromoSetResult, PromoSpec};
use crate::domain::buckets::Units;
use crate::domain::event::Id;
use crate::ledger::bucketed::{BucketOp, Layout};
use crate::ledger::calls::SetMode;
use crate::ledger::reply::SetReply;
use crate::ledger::Ledger;

/// The most buckets one promotion may have.
pub const MAX_BUCKETS: usize = 256;

/// One bucket as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketView {
    pub key: String,
    /// Free units.
    pub budget: u64,
    pub stock: u64,
    /// Given to another bucket's line, not settled or returned yet.
    pub held_budget: u64,
    pub held_stock: u64,
    /// Set aside for a line waiting for its customer's reservation.
    pub set_budget: u64,
    pub set_stock: u64,
}

impl fmt::Display for BucketView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: budget {} stock {} free; in transit budget {} stock {}; set aside budget {} stock {}",
            self.key,
            self.budget,
            self.stock,
            self.held_budget,
            self.held_stock,
            self.set_budget,
            self.set_stock
        )
    }
}

/// Refuses a change `what` of promotion `p` when it is bucketed (not
/// supported there yet).
pub async fn refuse_if_bucketed(ledger: &Ledger, p: &Id, what: &str) -> Result<(), AdminError> {
    if ledger.learn_layout(p).await?.is_some() {
        return Err(AdminError::Refused(format!(
            "promotion {p} is bucketed: {what} is not supported for a bucketed promotion yet; \
             nothing changed (docs/operations.md, \"Bucketed promotions\")"
        )));
    }
    Ok(())
}

/// Creates promotion `p` split into `k` buckets: each bucket's hash (its
/// share of budget and stock, a copy of the status, window and limit),
/// then the directory `promo:{P}` that makes it live (one script: refused
/// when `p` exists). Both amounts must be given: the protocol counts both.
pub async fn create(
    ledger: &Ledger,
    p: &Id,
    spec: PromoSpec,
    k: usize,
) -> Result<PromoSetResult, AdminError> {
    spec.validate()?;
    if !(1..=MAX_BUCKETS).contains(&k) {
        return Err(AdminError::Invalid(format!(
            "--buckets must be from 1 to {MAX_BUCKETS}"
        )));
    }
    let (Some(budget), Some(stock)) = (spec.budget, spec.stock) else {
        return Err(AdminError::Invalid(
            "a bucketed promotion needs both --budget and --stock (its buckets count both)"
                .to_owned(),
        ));
    };
    let key = ledger.keys().promotion(p);
    let existing = ledger.hash(&key).await?;
    if existing.contains_key("buckets") {
        return Err(AdminError::Exists(p.clone()));
    }
    if existing.is_empty() && ledger.string(&ledger.keys().generation(p)).await?.is_some() {
        return Err(AdminError::Refused(format!(
            "promotion id {p} was used before (and deleted): a bucketed promotion needs an id \
             never used, as its buckets' records carry no incarnation; nothing changed"
        )));
    }
    if !existing.is_empty() {
        return Err(AdminError::Refused(format!(
            "promotion {p} exists and is not bucketed: converting a live promotion to buckets \
             is not supported; create the sale under a new promotion id with --buckets \
             (docs/operations.md, \"Bucketed promotions\"); nothing changed"
        )));
    }
    let suffixes = ledger.choose_bucket_suffixes(p, k);
    let total = Units::new(budget as i64, stock as i64);
    let mut copy: Vec<(String, String)> = spec
        .fields()
        .into_iter()
        .filter(|(f, _)| matches!(*f, "status" | "per_customer" | "starts_at" | "ends_at"))
        .map(|(f, v)| (f.to_owned(), v))
        .collect();
    copy.push(("buckets".to_owned(), k.to_string()));
    for (j, s) in suffixes.iter().enumerate() {
        let share = total.share(k, j);
        let mut fields = copy.clone();
        fields.push(("index".to_owned(), j.to_string()));
        fields.push(("budget".to_owned(), share.budget.to_string()));
        fields.push(("stock".to_owned(), share.stock.to_string()));
        ledger
            .replace_hash(&ledger.keys().bucket(p, *s), fields)
            .await?;
    }
    let list = suffixes
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut fields: Vec<(&str, String)> = spec
        .fields()
        .into_iter()
        .map(|(f, v)| match f {
            // The directory holds none: the buckets do. (0 keeps a release
            // that knows no buckets from deducting here: it rejects.)
            "budget" | "stock" => (f, "0".to_owned()),
            _ => (f, v),
        })
        .collect();
    fields.push(("buckets", k.to_string()));
    fields.push(("suffixes", list));
    let reply = ledger.promo_set(p, SetMode::Create, fields).await?;
    ledger.ensure_ledger_marker().await?;
    match reply {
        SetReply::Created => Ok(PromoSetResult::Created),
        SetReply::Exists => Err(AdminError::Exists(p.clone())),
        other => Err(AdminError::Refused(format!(
            "promotion {p}: unexpected answer {other:?} creating it; check it with promo show"
        ))),
    }
}

/// Writes `fields` (and removes `gone`) on the directory and on every
/// bucket of `layout`, the directory first.
async fn write_everywhere(
    ledger: &Ledger,
    p: &Id,
    layout: &Layout,
    fields: Vec<(String, String)>,
    gone: Vec<String>,
) -> Result<(), AdminError> {
    let key = ledger.keys().promotion(p);
    ledger
        .write_fields(&key, fields.clone(), gone.clone())
        .await?;
    for b in &layout.keys {
        ledger.write_fields(b, fields.clone(), gone.clone()).await?;
    }
    Ok(())
}

/// `promo pause | resume` of a bucketed promotion: `status` on the
/// directory and every bucket (a line's first call reads its bucket's).
/// `None` when `p` is not bucketed.
pub async fn set_paused(ledger: &Ledger, p: &Id, paused: bool) -> Result<Option<bool>, AdminError> {
    let Some(layout) = ledger.learn_layout(p).await? else {
        return Ok(None);
    };
    let before = ledger.hash(&ledger.keys().promotion(p)).await?;
    let want = if paused { "paused" } else { "active" };
    let changed = before.get("status").map(String::as_str).unwrap_or("active") != want;
    // Written even when the directory already says so: a bucket may not
    // (an earlier run stopped half way).
    write_everywhere(
        ledger,
        p,
        &layout,
        vec![("status".to_owned(), want.to_owned())],
        vec![],
    )
    .await?;
    Ok(Some(changed))
}

/// `promo limit` of a bucketed promotion: `per_customer` on the directory
/// and every bucket (the customer's bucket reads its copy at each
/// reservation). `None` when `p` is not bucketed; else whether it changed
/// and the limit before.
pub async fn limit(
    ledger: &Ledger,
    p: &Id,
    per_customer: Option<u64>,
) -> Result<Option<(bool, Option<u64>)>, AdminError> {
    let Some(layout) = ledger.learn_layout(p).await? else {
        return Ok(None);
    };
    let before = ledger.hash(&ledger.keys().promotion(p)).await?;
    let previous = before.get("per_customer").and_then(|v| v.parse().ok());
    let (set, gone) = match per_customer {
        Some(n) => (vec![("per_customer".to_owned(), n.to_string())], vec![]),
        None => (vec![], vec!["per_customer".to_owned()]),
    };
    write_everywhere(ledger, p, &layout, set, gone).await?;
    Ok(Some((previous != per_customer, previous)))
}

/// The buckets of `p` when its hash `h` is a directory.
pub async fn buckets_of(
    ledger: &Ledger,
    p: &Id,
    h: &HashMap<String, String>,
) -> Result<Option<Vec<BucketView>>, AdminError> {
    if !h.contains_key("buckets") {
        return Ok(None);
    }
    let Some(layout) = ledger.learn_layout(p).await? else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(layout.k);
    for key in &layout.keys {
        let b = ledger.hash(key).await?;
        let num = |f: &str| -> Result<u64, AdminError> {
            match b.get(f) {
                None => Ok(0),
                Some(v) => crate::domain::stored::canonical(v).ok_or_else(|| AdminError::Corrupt {
                    promotion: p.clone(),
                    field: format!("{key} {f}"),
                    value: v.clone(),
                }),
            }
        };
        out.push(BucketView {
            key: key.clone(),
            budget: num("budget")?,
            stock: num("stock")?,
            held_budget: num("held_budget")?,
            held_stock: num("held_stock")?,
            set_budget: num("set_budget")?,
            set_stock: num("set_stock")?,
        });
    }
    Ok(Some(out))
}

/// What `audit` finds for a bucketed promotion.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BucketAudit {
    pub buckets: usize,
    pub initial: Option<Units>,
    pub free: Units,
    /// Given between buckets and not settled, or set aside for a
    /// reservation: in transit.
    pub in_transit: Units,
    /// What the orders' deductions hold (records `d`, and `t` set aside).
    pub deducted: Units,
    pub orders_held: usize,
    pub max_per_customer: usize,
    pub per_customer: Option<u64>,
    pub breaches: Vec<String>,
    /// Differences seen while units were in transit (events flowing): not
    /// a breach, not clean either.
    pub unsettled: Vec<String>,
    /// The sums' difference of this read, if any (judged by [`audit`]).
    mismatch: Option<String>,
}

impl BucketAudit {
    /// The figures two reads compare to tell a stable ledger from a moving one.
    fn figures(&self) -> (Units, Units, Units, usize) {
        (self.free, self.in_transit, self.deducted, self.orders_held)
    }
}

/// One read of every bucket and record of `p`.
async fn audit_read(ledger: &Ledger, p: &Id, layout: &Layout) -> Result<BucketAudit, AdminError> {
    let dir = ledger.hash(&ledger.keys().promotion(p)).await?;
    let num = |h: &HashMap<String, String>, key: &str, f: &str| -> Result<i64, String> {
        match h.get(f) {
            None => Ok(0),
            Some(v) => crate::domain::stored::canonical(v)
                .map(|x| x as i64)
                .ok_or_else(|| format!("{key} {f} = {v:?} is corrupt")),
        }
    };
    let mut a = BucketAudit {
        buckets: layout.k,
        per_customer: dir.get("per_customer").and_then(|v| v.parse().ok()),
        ..BucketAudit::default()
    };
    let dkey = ledger.keys().promotion(p);
    match (
        num(&dir, &dkey, "initial_budget"),
        num(&dir, &dkey, "initial_stock"),
    ) {
        (Ok(b), Ok(s)) => a.initial = Some(Units::new(b, s)),
        (Err(e), _) | (_, Err(e)) => a.breaches.push(e),
    }
    let changing = dir.keys().any(|f| f.starts_with("op:"));
    if changing {
        a.unsettled.push(
            "an operator change is in progress (or stopped half way: promo adjust or \
             rebalance finishes it, as does the service's sweeper)"
                .to_owned(),
        );
    }
    let mut holders: BTreeMap<String, usize> = BTreeMap::new();
    for key in &layout.keys {
        let h = ledger.hash(key).await?;
        let mut get = |f: &str| match num(&h, key, f) {
            Ok(v) => v,
            Err(e) => {
                a.breaches.push(e);
                0
            }
        };
        a.free += Units::new(get("budget"), get("stock"));
        a.in_transit += Units::new(get("held_budget"), get("held_stock"));
        a.in_transit += Units::new(get("set_budget"), get("set_stock"));
        let pattern = format!("{key}:order:*");
        for rkey in ledger
            .scan(&pattern, crate::ledger::store::KeyType::Any)
            .await?
        {
            let Some(v) = ledger.string(&rkey).await? else {
                continue;
            };
            let f: Vec<&str> = v.split('|').collect();
            match f.first().copied() {
                Some(state @ ("d" | "t")) if f.len() >= 4 => {
                    match (f[2].parse::<i64>(), f[3].parse::<i64>()) {
                        (Ok(b), Ok(s)) => {
                            a.deducted += Units::new(b, s);
                            a.orders_held += 1;
                            // Only a deduction holds a reservation: a line set
                            // aside (`t`) waits for its own, and is undone when
                            // the customer is at the limit.
                            if state == "d" {
                                *holders.entry(f[1].to_owned()).or_default() += 1;
                            }
                        }
                        _ => a.breaches.push(format!("{rkey} = {v:?} is corrupt")),
                    }
                }
                Some("v" | "x" | "r") => {}
                _ => a.breaches.push(format!("{rkey} = {v:?} is corrupt")),
            }
        }
    }
    a.max_per_customer = holders.values().copied().max().unwrap_or(0);
    if let Some(limit) = a.per_customer {
        for (c, n) in &holders {
            if *n as u64 > limit {
                a.breaches.push(format!(
                    "customer {c} holds {n} orders, over the limit of {limit}"
                ));
            }
        }
    }
    if let Some(initial) = a.initial {
        let total = a.free + a.in_transit + a.deducted;
        if total != initial {
            let d = format!(
                "free {:?} + in transit {:?} + deducted {:?} = {:?}, not the initial {:?}",
                a.free, a.in_transit, a.deducted, total, initial
            );
            // Gifts a deduction consumed are in transit until they are
            // settled: counted twice meanwhile; a change half done has not
            // moved the initial amounts yet. Only at rest is it exact.
            if a.in_transit.any_pos() || changing {
                a.unsettled.push(d);
            } else {
                a.mismatch = Some(d);
            }
        }
    }
    Ok(a)
}

/// `audit` of a bucketed promotion: every bucket's counters, every
/// order's record, and the rule that the free units, those in transit and
/// those deducted add up to the initial amounts; no customer over the
/// limit. The buckets are read one after another, not at one instant (they
/// live on several nodes): a line that gathers units from another bucket
/// between two of the reads is seen half. So a difference counts as a
/// breach only when a second read finds the same figures (nothing moved
/// meanwhile); when the figures keep changing (events flowing) through
/// three reads, it is reported unsettled.
pub async fn audit(ledger: &Ledger, p: &Id) -> Result<Option<BucketAudit>, AdminError> {
    let Some(layout) = ledger.learn_layout(p).await? else {
        return Ok(None);
    };
    let mut last = audit_read(ledger, p, &layout).await?;
    for _ in 0..3 {
        if last.mismatch.is_none() {
            return Ok(Some(last));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let mut again = audit_read(ledger, p, &layout).await?;
        if again.mismatch.is_some() && again.figures() == last.figures() {
            // Stable: the difference stands.
            if let Some(d) = again.mismatch.take() {
                again.breaches.push(d);
            }
            return Ok(Some(again));
        }
        last = again;
    }
    if let Some(d) = last.mismatch.take() {
        last.unsettled.push(format!(
            "{d} (the buckets kept changing while they were read)"
        ));
    }
    Ok(Some(last))
}

/// A fresh id for an operator's change (`prefix-<ms>-<ns>`).
fn change_id(prefix: &str) -> Result<Id, AdminError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Id::parse(&format!(
        "{prefix}-{}-{}",
        now.as_millis(),
        now.subsec_nanos()
    ))
    .map_err(|e| AdminError::Invalid(format!("change id: {e}")))
}

/// The bucketed promotion's layout, after finishing any change a previous
/// run left half way; `None` when `p` is not bucketed.
async fn ready(ledger: &Ledger, p: &Id) -> Result<Option<std::sync::Arc<Layout>>, AdminError> {
    let Some(layout) = ledger.learn_layout(p).await? else {
        return Ok(None);
    };
    let n = ledger.finish_pending_bucket_ops(p, &layout).await?;
    if n > 0 {
        println!("promotion {p}: finished {n} change(s) a previous run left half way");
    }
    Ok(Some(layout))
}

/// `promo adjust` of a bucketed promotion: what is added is split over
/// the buckets as `promo set --buckets` splits an amount (each bucket
/// marked and the others notified before its share arrives); what is
/// taken away is at most each bucket's share of what it holds free (units
/// set aside, in transit or deducted are not taken back). The initial
/// amounts move by what was actually added or taken. `None` when `p` is
/// not bucketed; else the signed change made.
pub async fn adjust(
    ledger: &Ledger,
    p: &Id,
    budget: Option<i64>,
    stock: Option<i64>,
) -> Result<Option<Units>, AdminError> {
    if ledger.learn_layout(p).await?.is_none() {
        return Ok(None);
    }
    if budget.is_none() && stock.is_none() {
        return Err(AdminError::Invalid(
            "give --budget and/or --stock (+N or -N)".to_owned(),
        ));
    }
    let dir = ledger.hash(&ledger.keys().promotion(p)).await?;
    for (name, d) in [("budget", budget), ("stock", stock)] {
        let initial: u64 = dir
            .get(&format!("initial_{name}"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if d.is_some_and(|d| d > 0 && initial.saturating_add(d as u64) > super::MAX_PROMO_AMOUNT)
            || d.is_some_and(|d| d.unsigned_abs() > super::MAX_PROMO_AMOUNT)
        {
            return Err(AdminError::Refused(format!(
                "{name} {:+} would take promotion {p}'s {name} above {}; nothing changed",
                d.unwrap_or(0),
                super::MAX_PROMO_AMOUNT
            )));
        }
    }
    let Some(layout) = ready(ledger, p).await? else {
        return Ok(None);
    };
    let (b, s) = (budget.unwrap_or(0), stock.unwrap_or(0));
    let add = Units::new(b.max(0), s.max(0));
    let remove = Units::new((-b).max(0), (-s).max(0));
    let mut done = Units::ZERO;
    for (op, prefix) in [
        (BucketOp::Add(add), "adj"),
        (BucketOp::Remove(remove), "adj"),
    ] {
        let n = match op {
            BucketOp::Add(n) | BucketOp::Remove(n) => n,
            BucketOp::Move { n, .. } => n,
        };
        if !n.any_pos() {
            continue;
        }
        let id = change_id(prefix)?;
        ledger.begin_bucket_op(p, &id, op).await?;
        done += ledger.finish_bucket_op(p, &layout, &id, op).await?;
    }
    Ok(Some(done))
}

/// One move of `promo rebalance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub from: usize,
    pub to: usize,
    pub n: Units,
}

/// The moves that even out `free` (each bucket's free units) to the
/// split `promo set --buckets` would make of their sum: from the buckets
/// above their share to those below, largest first, in both dimensions.
pub fn plan(free: &[Units]) -> Vec<Move> {
    let k = free.len();
    let total: Units = free.iter().copied().sum();
    let mut diff: Vec<Units> = (0..k).map(|j| free[j] - total.share(k, j)).collect();
    let mut moves = Vec::new();
    for from in 0..k {
        for to in 0..k {
            if from == to {
                continue;
            }
            let n = diff[from].pos().min((Units::ZERO - diff[to]).pos());
            if n.any_pos() {
                moves.push(Move { from, to, n });
                diff[from] -= n;
                diff[to] += n;
            }
        }
    }
    moves
}

/// `promo rebalance`: sweeps the buckets (gifts a crashed delivery left),
/// then moves free units so that each bucket holds its share of them,
/// each move a transfer (mark the receiver, notify the others, take once,
/// credit once, settle). Safe while events flow: a move takes at most
/// what its source holds free when it gets there. Returns the moves made.
pub async fn rebalance(ledger: &Ledger, p: &Id) -> Result<Vec<Move>, AdminError> {
    let Some(layout) = ready(ledger, p).await? else {
        return Err(AdminError::Refused(format!(
            "promotion {p} is not bucketed: there is nothing to rebalance"
        )));
    };
    ledger.sweep(&layout).await?;
    let dir = ledger.hash(&ledger.keys().promotion(p)).await?;
    let Some(views) = buckets_of(ledger, p, &dir).await? else {
        return Err(AdminError::NotFound(p.clone()));
    };
    let free: Vec<Units> = views
        .iter()
        .map(|v| Units::new(v.budget as i64, v.stock as i64))
        .collect();
    let moves = plan(&free);
    for m in &moves {
        let id = change_id("move")?;
        let op = BucketOp::Move {
            from: m.from,
            to: m.to,
            n: m.n,
        };
        ledger.begin_bucket_op(p, &id, op).await?;
        ledger.finish_bucket_op(p, &layout, &id, op).await?;
    }
    Ok(moves)
}

/// `promo delete` of a bucketed promotion: refused while orders hold
/// deductions (or units are in transit) unless `force`; then the directory
/// goes, then every bucket hash (records, memos and reservations expire
/// with their TTLs). A service that still walks the buckets meets a missing
/// bucket (`NOBUCKET`), reads the directory again and decides the line as
/// for any promotion that does not exist. `None` when `p` is not bucketed.
pub async fn delete(ledger: &Ledger, p: &Id, force: bool) -> Result<Option<()>, AdminError> {
    let Some(layout) = ledger.learn_layout(p).await? else {
        return Ok(None);
    };
    if !force {
        if let Some(a) = audit(ledger, p).await? {
            if a.orders_held > 0 || a.in_transit.any_pos() {
                return Err(AdminError::Refused(format!(
                    "promotion {p} has outstanding deductions ({} orders hold budget {} stock \
                     {}): once it is deleted, refunds cannot return them; pass --force to \
                     delete it anyway",
                    a.orders_held, a.deducted.budget, a.deducted.stock
                )));
            }
        }
    }
    ledger.delete_key(&ledger.keys().promotion(p)).await?;
    for key in &layout.keys {
        ledger.delete_key(key).await?;
    }
    ledger.learn_layout(p).await?;
    Ok(Some(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_evens_the_buckets_out() {
        let free = [Units::new(10, 9), Units::new(0, 0), Units::new(2, 0)];
        let moves = plan(&free);
        let mut after = free.to_vec();
        for m in &moves {
            after[m.from] -= m.n;
            after[m.to] += m.n;
        }
        let total: Units = free.iter().copied().sum();
        for (j, a) in after.iter().enumerate() {
            assert_eq!(*a, total.share(3, j), "{moves:?}");
        }
        assert!(plan(&after).is_empty());
        assert!(plan(&[Units::new(4, 4)]).is_empty());
    }
}
