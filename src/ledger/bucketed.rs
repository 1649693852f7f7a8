//! The lines of bucketed promotions (issue 28, docs/contract.md section
//! 2b): where the service learns that a promotion is bucketed, and how a
//! placement line, a refund line, a release and a memo read of one run as
//! the walks of `domain::buckets` on its buckets ([`super::buckets`]).
//!
//! A promotion is bucketed when its hash `promo:{P}` is a directory (field
//! `buckets`): every plain script refuses it (`BUCKETED`, nothing written),
//! and [`Ledger::place`] / [`Ledger::refund`] then read the directory,
//! remember its layout, and decide the event again. The layout never
//! changes while the directory lives (`promo set` refuses to convert a
//! promotion either way, and `promo delete` refuses a bucketed one), so it
//! is kept for the life of the process.
//!
//! A bucketed line is decided per order: the walk's id is the order id
//! (its record, memo and reservation live under it), so every placement
//! event of one order gets the order's decision.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{HashesInterface, KeysInterface};

use super::buckets::{drive, Buckets};
use super::reply::{LineReply, LineStatus};
use super::{Ledger, LedgerError};
use crate::domain::buckets::{
    Adjust, Outcome, Place, Placed, Refund, RefundRun, ReleaseRun, Report, Transfer, Units, Walk,
};
use crate::domain::decision::{Reason, Remaining};
use crate::domain::event::{Header, Id, PlaceLine};

/// A bucketed promotion's buckets, as its directory names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// K.
    pub k: usize,
    /// Bucket j's hash key `promo:{P~s_j}`, by j.
    pub keys: Vec<String>,
}

/// How long one walk may back off (units on their way, a corrupt bucket
/// on a step that must finish) before it gives the event back to the
/// pipeline's retry, which waits out outages and honours a revoke or a
/// shutdown; the walk resumes where the buckets say it is.
const WALK_PATIENCE: Duration = Duration::from_secs(10);

/// The directory's suffix list, `s0,s1,...`, as K suffixes.
pub fn parse_suffixes(k: &str, suffixes: &str) -> Option<Vec<u32>> {
    let k: usize = k.parse().ok().filter(|k| (1..=1024).contains(k))?;
    let s: Vec<u32> = suffixes
        .split(',')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let mut sorted = s.clone();
    sorted.sort_unstable();
    sorted.dedup();
    (s.len() == k && sorted.len() == k).then_some(s)
}

impl Ledger {
    /// The layout of `p` when it is known to be bucketed.
    pub(crate) fn layout(&self, p: &Id) -> Option<Arc<Layout>> {
        let known = self
            .shared
            .layouts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        known.get(p).cloned()
    }

    /// Reads `p`'s directory: its layout when it is bucketed (remembered),
    /// `None` when it is not (or gone). A directory whose fields do not
    /// parse is corrupt data.
    pub async fn learn_layout(&self, p: &Id) -> Result<Option<Arc<Layout>>, LedgerError> {
        let key = self.keys().promotion(p);
        // (HGETALL: the service's least-privilege user has it, not HMGET.)
        let mut dir: std::collections::HashMap<String, String> = self
            .pool
            .next()
            .hgetall(&key)
            .await
            .map_err(|e| LedgerError::redis("bucket_layout", e))?;
        let (k, suffixes) = (dir.remove("buckets"), dir.remove("suffixes"));
        let Some(k) = k else {
            // Not (or no longer: deleted) bucketed.
            let mut known = self
                .shared
                .layouts
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            known.remove(p);
            return Ok(None);
        };
        let suffixes = suffixes.unwrap_or_default();
        let Some(s) = parse_suffixes(&k, &suffixes) else {
            return Err(LedgerError::redis(
                "bucket_layout",
                fred::error::Error::new(
                    fred::error::ErrorKind::Unknown,
                    format!("CORRUPT {key} buckets: {k:?} suffixes: {suffixes:?}"),
                ),
            ));
        };
        let layout = Arc::new(Layout {
            k: s.len(),
            keys: s.iter().map(|x| self.keys().bucket(p, *x)).collect(),
        });
        let mut known = self
            .shared
            .layouts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        known.insert(p.clone(), layout.clone());
        Ok(Some(layout))
    }

    /// Reads the layout of every promotion of `promotions` again (after a
    /// plain script answered `BUCKETED`, or a bucket call `NOBUCKET`: a
    /// bucketed promotion deleted, perhaps created again plain).
    pub(crate) async fn learn_layouts<'a>(
        &self,
        promotions: impl IntoIterator<Item = &'a Id>,
    ) -> Result<(), LedgerError> {
        for p in promotions {
            self.learn_layout(p).await?;
        }
        Ok(())
    }

    /// Deletes `key` (the operator's `promo delete` of a bucketed promotion).
    pub async fn delete_key(&self, key: &str) -> Result<(), LedgerError> {
        self.pool
            .next()
            .del::<i64, _>(key)
            .await
            .map(drop)
            .map_err(|e| LedgerError::redis("del", e))
    }

    /// The suffixes of `p`'s K bucket tags, spread over the Cluster's
    /// primaries (0..K-1 on a standalone server).
    pub fn choose_bucket_suffixes(&self, p: &Id, k: usize) -> Vec<u32> {
        super::buckets::choose_suffixes(self.pool.next(), p.as_str(), k)
    }

    /// Replaces hash `key` by `fields` (the operator's `promo set
    /// --buckets`, before the directory makes the promotion live).
    pub async fn replace_hash(
        &self,
        key: &str,
        fields: Vec<(String, String)>,
    ) -> Result<(), LedgerError> {
        let client = self.pool.next();
        client
            .del::<i64, _>(key)
            .await
            .map_err(|e| LedgerError::redis("del", e))?;
        client
            .hset::<i64, _, _>(key, fields)
            .await
            .map_err(|e| LedgerError::redis("hset", e))?;
        Ok(())
    }

    /// Sets `fields` of hash `key` (and removes `gone`), leaving the rest.
    pub async fn write_fields(
        &self,
        key: &str,
        fields: Vec<(String, String)>,
        gone: Vec<String>,
    ) -> Result<(), LedgerError> {
        let client = self.pool.next();
        if !fields.is_empty() {
            client
                .hset::<i64, _, _>(key, fields)
                .await
                .map_err(|e| LedgerError::redis("hset", e))?;
        }
        if !gone.is_empty() {
            client
                .hdel::<i64, _, _>(key, gone)
                .await
                .map_err(|e| LedgerError::redis("hdel", e))?;
        }
        Ok(())
    }

    /// A key of every slot an event's lines of `promotions` may write: a
    /// plain promotion's hash, every bucket of a bucketed one (a walk may
    /// gather from any). The durability gate waits on their nodes.
    pub(crate) fn written_keys<'a>(
        &self,
        promotions: impl IntoIterator<Item = &'a Id>,
    ) -> Vec<String> {
        let mut keys = Vec::new();
        for p in promotions {
            match self.layout(p) {
                Some(l) => keys.extend(l.keys.iter().cloned()),
                None => keys.push(self.keys().promotion(p)),
            }
        }
        keys
    }

    fn buckets<'a>(&'a self, layout: &Layout, order: &Id) -> Buckets<'a> {
        Buckets {
            client: self.connection(order),
            keys: layout.keys.clone(),
            ttl_secs: self.shared.bucket_ttl_secs,
            gate: self.wait_policy(),
        }
    }

    async fn walk<W: Walk<Id>>(
        &self,
        layout: &Layout,
        order: &Id,
        w: &mut W,
    ) -> Result<Report, LedgerError> {
        let b = self.buckets(layout, order);
        match tokio::time::timeout(WALK_PATIENCE, drive(&b, w)).await {
            Ok(r) => r,
            Err(_) => Err(LedgerError::redis(
                "bucket",
                fred::error::Error::new(
                    fred::error::ErrorKind::Timeout,
                    "a bucketed line is still waiting for units on their way; retried",
                ),
            )),
        }
    }

    /// A placement line of a bucketed promotion: the walk of
    /// `domain::buckets::Place` for (order, customer), to its decision.
    pub(crate) async fn bucket_deduct(
        &self,
        h: &Header,
        line: &PlaceLine,
        layout: &Layout,
    ) -> Result<LineReply, LedgerError> {
        let units = Units::new(amount(line.budget)?, amount(line.stock)?);
        let mut w = Place::new(h.order_id.clone(), h.customer_id.clone(), units, layout.k);
        w.at = u64::try_from(h.occurred_at).unwrap_or(0);
        let report = self.walk(layout, &h.order_id, &mut w).await?;
        let placed = match report {
            Report::Short { dim, .. } => Placed::Short(dim),
            Report::Done(Outcome::Placed(p)) => p,
            other => {
                return Err(LedgerError::malformed(
                    "bucket",
                    format!("a placement walk ended {other:?}"),
                ))
            }
        };
        let status = match placed {
            Placed::Accepted(u) => {
                return Ok(LineReply {
                    status: LineStatus::Done,
                    duplicate: w.found_decided(),
                    budget: u.budget.max(0) as u64,
                    stock: u.stock.max(0) as u64,
                    remaining: Remaining::default(),
                })
            }
            Placed::Released => LineStatus::Released,
            Placed::Short(d) => LineStatus::Rejected(match d {
                crate::domain::buckets::Dim::Budget => Reason::BudgetExceeded,
                crate::domain::buckets::Dim::Stock => Reason::StockInsufficient,
            }),
            Placed::Limit => LineStatus::Rejected(Reason::UserLimitReached),
            Placed::Refunded => LineStatus::Rejected(Reason::OrderReverted),
            Placed::Inactive => LineStatus::Rejected(Reason::PromotionInactive),
            Placed::Corrupt => {
                tracing::error!(
                    promotion = %line.promotion_id,
                    order = %h.order_id,
                    event = %h.event_id,
                    "corrupt bucket data; the line is rejected corrupt_promotion (remembered)"
                );
                crate::metrics::corrupt_data();
                LineStatus::Rejected(Reason::CorruptPromotion)
            }
            Placed::PlainShort => {
                return Err(LedgerError::malformed("bucket", "a plain decision"));
            }
        };
        Ok(LineReply {
            status,
            duplicate: w.found_decided(),
            budget: 0,
            stock: 0,
            remaining: Remaining::default(),
        })
    }

    /// The order's memo at its bucket: a rejection's reason (`None` when
    /// none is stored, or the line was accepted or released).
    pub(crate) async fn bucket_memo(
        &self,
        h: &Header,
        layout: &Layout,
    ) -> Result<Option<Reason>, LedgerError> {
        use crate::domain::buckets::{BucketId, Op, Reply};
        let b = self.buckets(layout, &h.order_id);
        let home = h.order_id.bucket(layout.k);
        let reply = b
            .call(
                home,
                &Op::Memo {
                    ev: h.order_id.clone(),
                },
            )
            .await?;
        Ok(match reply {
            Reply::Memo(Some(p)) => match p {
                Placed::Short(crate::domain::buckets::Dim::Budget) => Some(Reason::BudgetExceeded),
                Placed::Short(crate::domain::buckets::Dim::Stock) => {
                    Some(Reason::StockInsufficient)
                }
                Placed::Limit => Some(Reason::UserLimitReached),
                Placed::Refunded => Some(Reason::OrderReverted),
                Placed::Corrupt => Some(Reason::CorruptPromotion),
                Placed::Inactive => Some(Reason::PromotionInactive),
                Placed::Accepted(_) | Placed::Released | Placed::PlainShort => None,
            },
            Reply::Memo(None) => None,
            other => {
                return Err(LedgerError::malformed(
                    "bucket",
                    format!("Memo answered {other:?}"),
                ))
            }
        })
    }

    /// Releases the order's deduction of a bucketed line (its event was
    /// rejected on another line): whether this call gave it back.
    pub(crate) async fn bucket_release(
        &self,
        h: &Header,
        layout: &Layout,
    ) -> Result<bool, LedgerError> {
        let mut w = ReleaseRun::new(h.order_id.clone(), layout.k);
        match self.walk(layout, &h.order_id, &mut w).await? {
            Report::Done(Outcome::Released(gave)) => Ok(gave),
            other => Err(LedgerError::malformed(
                "bucket",
                format!("a release walk ended {other:?}"),
            )),
        }
    }

    /// A refund line of a bucketed promotion: the order's whole deduction
    /// goes back, to the buckets it was taken from (a refund line's amounts
    /// are not used), and the stored customer's reservation is freed.
    pub(crate) async fn bucket_refund(
        &self,
        h: &Header,
        p: &Id,
        layout: &Layout,
    ) -> Result<LineReply, LedgerError> {
        let mut w = RefundRun::new(h.event_id.clone(), h.order_id.clone(), layout.k);
        let refund = match self.walk(layout, &h.order_id, &mut w).await? {
            Report::Done(Outcome::Refund(r)) => r,
            other => {
                return Err(LedgerError::malformed(
                    "bucket",
                    format!("a refund walk ended {other:?}"),
                ))
            }
        };
        let (status, u) = match refund {
            Refund::Applied(u) => (LineStatus::Done, u),
            Refund::NoDeduction => (LineStatus::Rejected(Reason::NoDeduction), Units::ZERO),
            Refund::AlreadyReverted => (LineStatus::Rejected(Reason::AlreadyReverted), Units::ZERO),
            Refund::Corrupt => {
                tracing::error!(
                    promotion = %p,
                    order = %h.order_id,
                    event = %h.event_id,
                    "corrupt bucket data; the refund line is rejected corrupt_promotion (remembered)"
                );
                crate::metrics::corrupt_data();
                (LineStatus::Rejected(Reason::CorruptPromotion), Units::ZERO)
            }
        };
        Ok(LineReply {
            status,
            duplicate: false,
            budget: u.budget.max(0) as u64,
            stock: u.stock.max(0) as u64,
            remaining: Remaining::default(),
        })
    }
}

/// An operator's change of a bucketed promotion: listed in its directory
/// (field `op:<id>`) before its walk runs, so that the command run again,
/// or the service's sweeper, finishes one that stopped half way (a half-run
/// change leaves marks that keep short lines waiting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketOp {
    /// `promo adjust` adding: each bucket's share, once (`Adjust`).
    Add(Units),
    /// `promo adjust` taking away: at most each bucket's share of what it
    /// holds free, once.
    Remove(Units),
    /// `promo rebalance`: up to `n` from bucket `from` to bucket `to`.
    Move { from: usize, to: usize, n: Units },
}

impl BucketOp {
    pub fn encode(&self) -> String {
        match self {
            BucketOp::Add(n) => format!("add|{}|{}", n.budget, n.stock),
            BucketOp::Remove(n) => format!("remove|{}|{}", n.budget, n.stock),
            BucketOp::Move { from, to, n } => {
                format!("move|{from}|{to}|{}|{}", n.budget, n.stock)
            }
        }
    }

    pub fn parse(s: &str) -> Option<BucketOp> {
        let f: Vec<&str> = s.split('|').collect();
        let u = |b: &str, s: &str| -> Option<Units> {
            let (b, s) = (b.parse::<i64>().ok()?, s.parse::<i64>().ok()?);
            (b >= 0 && s >= 0).then_some(Units::new(b, s))
        };
        match f.as_slice() {
            ["add", b, s] => Some(BucketOp::Add(u(b, s)?)),
            ["remove", b, s] => Some(BucketOp::Remove(u(b, s)?)),
            ["move", i, j, b, s] => Some(BucketOp::Move {
                from: i.parse().ok()?,
                to: j.parse().ok()?,
                n: u(b, s)?,
            }),
            _ => None,
        }
    }
}

impl Ledger {
    /// Lists change `id` in `p`'s directory (before it runs).
    pub async fn begin_bucket_op(&self, p: &Id, id: &Id, op: BucketOp) -> Result<(), LedgerError> {
        self.write_fields(
            &self.keys().promotion(p),
            vec![(format!("op:{id}"), op.encode())],
            vec![],
        )
        .await
    }

    /// The changes `p`'s directory lists as not finished.
    pub async fn pending_bucket_ops(&self, p: &Id) -> Result<Vec<(Id, BucketOp)>, LedgerError> {
        let h = self.hash(&self.keys().promotion(p)).await?;
        let mut out: Vec<(Id, BucketOp)> = h
            .iter()
            .filter_map(|(f, v)| {
                let id = Id::parse(f.strip_prefix("op:")?).ok()?;
                Some((id, BucketOp::parse(v)?))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Runs change `id` to its end (idempotent: every step is remembered
    /// by `id` at its bucket), then removes it from the directory, moving
    /// the initial amounts by what it added or took away (once, whoever
    /// finishes it). Returns that signed amount.
    pub async fn finish_bucket_op(
        &self,
        p: &Id,
        layout: &Layout,
        id: &Id,
        op: BucketOp,
    ) -> Result<Units, LedgerError> {
        let k = layout.k;
        for tries in 0.. {
            let result = match op {
                BucketOp::Add(n) => {
                    let mut w = Adjust::new(id.clone(), n, true, k);
                    self.walk(layout, id, &mut w).await
                }
                BucketOp::Remove(n) => {
                    let mut w = Adjust::new(id.clone(), n, false, k);
                    self.walk(layout, id, &mut w).await
                }
                BucketOp::Move { from, to, n } => {
                    if from >= k || to >= k || from == to {
                        return Err(LedgerError::malformed(
                            "bucket",
                            format!("change {id}: no move from {from} to {to} of {k}"),
                        ));
                    }
                    let mut w = Transfer::new(id.clone(), from, to, n, k);
                    self.walk(layout, id, &mut w).await
                }
            };
            match result {
                Ok(Report::Done(Outcome::Moved)) => break,
                Ok(other) => {
                    return Err(LedgerError::malformed(
                        "bucket",
                        format!("change {id} ended {other:?}"),
                    ))
                }
                // A corrupt bucket the change must wait for, or units on
                // their way: a few more tries, then the caller's error.
                Err(e) if e.disposition() == crate::error::Disposition::Retry && tries < 5 => {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
        let mut moved = Units::ZERO;
        let suffix = match op {
            BucketOp::Add(_) => Some("in"),
            BucketOp::Remove(_) => Some("out"),
            BucketOp::Move { .. } => None,
        };
        if let Some(suffix) = suffix {
            for key in &layout.keys {
                let at = format!("{key}:{suffix}:{id}");
                if let Some(v) = self.string(&at).await? {
                    let parsed = v
                        .split_once(',')
                        .and_then(|(b, s)| Some(Units::new(b.parse().ok()?, s.parse().ok()?)));
                    match parsed {
                        Some(u) => moved += u,
                        None => {
                            return Err(LedgerError::malformed(
                                "bucket",
                                format!("CORRUPT {at}: {v:?}"),
                            ))
                        }
                    }
                }
            }
        }
        let delta = match op {
            BucketOp::Remove(_) => Units::ZERO - moved,
            _ => moved,
        };
        let call =
            super::calls::promo_op_done(self.keys(), p, id.as_str(), delta.budget, delta.stock);
        self.run(call, None, p).await?;
        Ok(delta)
    }

    /// Finishes every change `p`'s directory lists (the sweeper, and each
    /// operator command first).
    pub async fn finish_pending_bucket_ops(
        &self,
        p: &Id,
        layout: &Layout,
    ) -> Result<usize, LedgerError> {
        let pending = self.pending_bucket_ops(p).await?;
        for (id, op) in &pending {
            self.finish_bucket_op(p, layout, id, *op).await?;
        }
        Ok(pending.len())
    }
}

/// How often the sweeper visits each bucketed promotion.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

impl Ledger {
    /// The sweeper (docs/buckets.md, "The sweeper"): at every bucket of
    /// `layout`, each gift still given is settled (its event's decision
    /// consumed it), or given back (its event's attempt moved on, or the
    /// event was decided without it). Acts only on what is final, so it
    /// runs beside the deliveries. Returns how many gifts it finished.
    /// Only a delivery that crashed after another decided its event leaves
    /// such gifts; until they are finished, the units they hold keep
    /// short lines waiting rather than rejected.
    pub async fn sweep(&self, layout: &Layout) -> Result<usize, LedgerError> {
        use crate::domain::buckets::{Op, Reply};
        let b = Buckets {
            client: self.pool.next(),
            keys: layout.keys.clone(),
            ttl_secs: self.shared.bucket_ttl_secs,
            gate: self.wait_policy(),
        };
        let mut finished = 0;
        for j in 0..layout.k {
            let Reply::Gifts(open) = b.call::<Id>(j, &Op::OpenGifts).await? else {
                // Corrupt counters: the next sweep, after the repair.
                continue;
            };
            for (id, a, to) in open {
                let state = b.call(to, &Op::EventState { id: id.clone() }).await?;
                let Reply::Event { credited, attempt } = state else {
                    continue;
                };
                match credited {
                    Some(credited) => {
                        b.call(j, &Op::Cleanup { ev: id, credited }).await?;
                        finished += 1;
                    }
                    None if attempt.is_some_and(|cur| cur > a) => {
                        b.call(j, &Op::GiveBack { id, a }).await?;
                        finished += 1;
                    }
                    None => {}
                }
            }
        }
        Ok(finished)
    }

    /// Sweeps every bucketed promotion this process has met, every
    /// [`SWEEP_EVERY`], until `stop`.
    pub async fn sweep_forever(&self, stop: tokio_util::sync::CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(SWEEP_EVERY) => {}
            }
            let known: Vec<(Id, Arc<Layout>)> = {
                let l = self
                    .shared
                    .layouts
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                l.iter().map(|(p, x)| (p.clone(), x.clone())).collect()
            };
            for (p, layout) in known {
                // Deleted meanwhile: forgotten.
                match self.learn_layout(&p).await {
                    Ok(Some(_)) => {}
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(promotion = %p, error = %e, "reading a bucketed promotion's directory failed; tried again later");
                        continue;
                    }
                }
                match self.finish_pending_bucket_ops(&p, &layout).await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(promotion = %p, changes = n, "bucket sweeper finished operator changes left half way")
                    }
                    Err(e) => {
                        tracing::warn!(promotion = %p, error = %e, "finishing operator changes failed; tried again later")
                    }
                }
                match self.sweep(&layout).await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(promotion = %p, gifts = n, "bucket sweeper finished gifts a crashed delivery left")
                    }
                    Err(e) => {
                        tracing::warn!(promotion = %p, error = %e, "bucket sweep failed; tried again later")
                    }
                }
            }
        }
    }
}

/// A line's amount as the walk counts it (at most 15 digits, as every
/// amount the contract allows).
fn amount(x: u64) -> Result<i64, LedgerError> {
    i64::try_from(x).map_err(|_| LedgerError::malformed("bucket", format!("amount {x}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_changes_round_trip() {
        for op in [
            BucketOp::Add(Units::new(5, 0)),
            BucketOp::Remove(Units::new(0, 7)),
            BucketOp::Move {
                from: 2,
                to: 0,
                n: Units::new(1, 2),
            },
        ] {
            assert_eq!(BucketOp::parse(&op.encode()), Some(op));
        }
        for bad in [
            "",
            "add|1",
            "add|-1|2",
            "move|1|2|3",
            "swap|1|2",
            "remove|x|1",
        ] {
            assert_eq!(BucketOp::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn suffixes_parse_only_when_k_distinct_numbers() {
        assert_eq!(parse_suffixes("3", "0,5,9"), Some(vec![0, 5, 9]));
        assert_eq!(parse_suffixes("2", "0,5,9"), None);
        assert_eq!(parse_suffixes("2", "4,4"), None);
        assert_eq!(parse_suffixes("0", ""), None);
        assert_eq!(parse_suffixes("x", "1"), None);
        assert_eq!(parse_suffixes("2", "1,-2"), None);
    }
}
