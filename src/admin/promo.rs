//! Changing a live promotion in place: `promo pause | resume | adjust |
//! limit | delete`, and `promo list`.
//!
//! Each change is one script (`lua/promo_*.lua`) that writes only the
//! fields it changes, so it is safe while the consumer group runs: the
//! deductions and refunds the service makes meanwhile are kept. `promo set
//! --force`, which rewrites the whole hash, is guarded by [`guard_replace`].

use std::fmt;

use super::{promo_show, AdminError, PromoView, MAX_PROMO_AMOUNT};
use crate::domain::event::Id;
pub use crate::ledger::reply::Amounts;
use crate::ledger::reply::{
    AdjustReply, AdjustVerdict, DeleteReply, LimitReply, StatusReply, Stored,
};
use crate::ledger::store::KeyType;
use crate::ledger::Ledger;

/// What pause / resume / limit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Changed,
    /// The promotion already was that way; nothing written.
    Unchanged,
}

/// Pauses (`paused`) or resumes promotion `p`: only its `status` is written.
/// A paused promotion rejects placements `promotion_inactive`; refunds still
/// return their amounts to it.
pub async fn set_paused(ledger: &Ledger, p: &Id, paused: bool) -> Result<Change, AdminError> {
    match ledger.promo_status(p, paused).await? {
        StatusReply::Changed => Ok(Change::Changed),
        StatusReply::Unchanged => Ok(Change::Unchanged),
        StatusReply::NotFound => Err(AdminError::NotFound(p.clone())),
    }
}

/// Signed changes of budget and stock; `None` leaves a dimension alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Adjustment {
    pub budget: Option<i64>,
    pub stock: Option<i64>,
}

/// Moves the remaining amount and `initial_*` of each given dimension by
/// its delta, in one script, so `initial - remaining == outstanding` keeps
/// holding while the service deducts. Refused (nothing written, neither
/// dimension) when a dimension is unlimited, or when a value would leave
/// `0..=MAX_PROMO_AMOUNT`.
pub async fn adjust(ledger: &Ledger, p: &Id, a: Adjustment) -> Result<Amounts, AdminError> {
    if a.budget.is_none() && a.stock.is_none() {
        return Err(AdminError::Invalid(
            "give --budget and/or --stock (+N or -N)".to_owned(),
        ));
    }
    for (name, d) in [("budget", a.budget), ("stock", a.stock)] {
        if d.is_some_and(|d| d.unsigned_abs() > MAX_PROMO_AMOUNT) {
            return Err(AdminError::Invalid(format!(
                "the {name} delta must be between -{MAX_PROMO_AMOUNT} and +{MAX_PROMO_AMOUNT}"
            )));
        }
    }
    let AdjustReply {
        verdict,
        field,
        amounts: now,
    } = ledger.promo_adjust(p, a.budget, a.stock).await?;
    let (delta, left) = match field.as_str() {
        "budget" => (a.budget.unwrap_or(0), now.budget),
        _ => (a.stock.unwrap_or(0), now.stock),
    };
    let left = left.map_or("none".to_owned(), |v| v.to_string());
    match verdict {
        AdjustVerdict::Adjusted => Ok(now),
        AdjustVerdict::NotFound => Err(AdminError::NotFound(p.clone())),
        AdjustVerdict::Unlimited => Err(AdminError::Refused(format!(
            "promotion {p} has no {field} limit (unlimited): there is nothing to adjust; \
             nothing changed"
        ))),
        AdjustVerdict::BelowZero => Err(AdminError::Refused(format!(
            "{field} {delta:+} would take promotion {p}'s {field} below 0 \
             ({left} remaining); nothing changed"
        ))),
        AdjustVerdict::AboveMax => Err(AdminError::Refused(format!(
            "{field} {delta:+} would take promotion {p}'s {field} above {MAX_PROMO_AMOUNT} \
             ({left} remaining); nothing changed"
        ))),
    }
}

/// Sets (`Some`) or removes (`None`) the per-customer limit; returns what
/// changed and the limit before. Only `per_customer` is written: a limit
/// counts the orders placed while it is in force (records with
/// `counted=1`), never the orders placed before it.
pub async fn limit(
    ledger: &Ledger,
    p: &Id,
    per_customer: Option<u64>,
) -> Result<(Change, Option<u64>), AdminError> {
    if per_customer.is_some_and(|n| n > MAX_PROMO_AMOUNT) {
        return Err(AdminError::Invalid(format!(
            "per_customer must be at most {MAX_PROMO_AMOUNT}"
        )));
    }
    match ledger.promo_limit(p, per_customer).await? {
        LimitReply::Changed { previous } => Ok((Change::Changed, previous)),
        LimitReply::Unchanged { previous } => Ok((Change::Unchanged, previous)),
        LimitReply::NotFound => Err(AdminError::NotFound(p.clone())),
    }
}

/// What a promotion's records still hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outstanding {
    /// `initial_budget - budget`, when both are stored.
    pub budget: Option<i64>,
    pub stock: Option<i64>,
    /// `deducted` records found by SCAN (when neither dimension could be
    /// derived from the hash).
    pub orders: Option<usize>,
}

impl Outstanding {
    /// True when something is (or may be) held.
    pub fn any(&self) -> bool {
        self.budget.is_some_and(|v| v != 0)
            || self.stock.is_some_and(|v| v != 0)
            || self.orders.is_some_and(|n| n > 0)
    }
}

impl fmt::Display for Outstanding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (name, v) in [("stock", self.stock), ("budget", self.budget)] {
            match v {
                Some(v) if v != 0 => parts.push(format!("{name} {v}")),
                _ => {}
            }
        }
        if !parts.is_empty() {
            write!(
                f,
                "{} held by orders (initial - remaining)",
                parts.join(", ")
            )?;
        }
        if let Some(n) = self.orders {
            if !parts.is_empty() {
                f.write_str("; ")?;
            }
            write!(f, "{n} order(s) still deducted")?;
        }
        Ok(())
    }
}

/// Counts `p`'s `deducted` records of its current incarnation (a record's
/// `gen` equal to the hash's; both absent for data written before `gen`)
/// with SCAN: a fallback, not atomic, for promotions whose hash cannot say
/// what is outstanding. Records of a replaced incarnation are not counted:
/// refunds give them nothing back anyway.
pub async fn count_deducted(ledger: &Ledger, p: &Id) -> Result<usize, AdminError> {
    let gen = ledger
        .hash_field(&ledger.keys().promotion(p), "gen")
        .await?;
    let keys = ledger
        .scan(&ledger.keys().record_pattern(p), KeyType::Any)
        .await?;
    let mut n = 0;
    for key in keys {
        // Either layout (docs/contract.md section 2).
        let Stored::Hash(fields) = ledger.record(&key).await? else {
            continue;
        };
        if fields.get("state").map(String::as_str) == Some("deducted")
            && fields.get("gen") == gen.as_ref()
        {
            n += 1;
        }
    }
    Ok(n)
}

/// Customers of `p` whose counter of counted orders is above `limit`, and
/// the highest counter (SCAN of `promo:{P}:used:*`): lowering a limit does
/// not take orders away, and `audit` reports such customers until refunds
/// bring them down.
pub async fn customers_over(
    ledger: &Ledger,
    p: &Id,
    limit: u64,
) -> Result<(usize, u64), AdminError> {
    let pattern = format!("{}:{{{p}}}:used:*", ledger.keys().prefix());
    let mut over = 0;
    let mut max = 0;
    for key in ledger.scan(&pattern, KeyType::Any).await? {
        let v = ledger.string(&key).await?;
        let n: u64 = v.and_then(|v| v.parse().ok()).unwrap_or(0);
        if n > limit {
            over += 1;
            max = max.max(n);
        }
    }
    Ok((over, max))
}

/// What `p`'s records hold: from one read of its hash (`initial_* -
/// remaining`) where both are stored, else by counting its `deducted`
/// records. `None` when the promotion does not exist.
pub async fn outstanding(ledger: &Ledger, p: &Id) -> Result<Option<Outstanding>, AdminError> {
    let Some(v) = promo_show(ledger, p).await? else {
        return Ok(None);
    };
    let diff = |init: Option<u64>, left: Option<u64>| match (init, left) {
        (Some(i), Some(l)) => Some(i as i64 - l as i64),
        _ => None,
    };
    let mut o = Outstanding {
        budget: diff(v.initial_budget, v.budget),
        stock: diff(v.initial_stock, v.stock),
        orders: None,
    };
    if o.budget.is_none() && o.stock.is_none() {
        o.orders = Some(count_deducted(ledger, p).await?);
    }
    Ok(Some(o))
}

/// Refuses a `promo set --force` of `p` while its records hold deductions:
/// replacing the hash starts a new incarnation (`gen`) with fresh
/// `initial_*` and remaining amounts, and refunds of the outstanding orders
/// then give nothing back to it. A check before the write, not in the same
/// script (promo_set.lua): a deduction landing between the two is not seen.
pub async fn guard_replace(ledger: &Ledger, p: &Id) -> Result<(), AdminError> {
    match outstanding(ledger, p).await? {
        Some(o) if o.any() => Err(AdminError::Refused(format!(
            "promotion {p} has outstanding deductions ({o}); promo set --force would start \
             a new incarnation with fresh initial and remaining amounts, and refunds of \
             those orders would give nothing back to it. Change it in place with \
             promo adjust / limit / pause / resume, or pass --discard-outstanding to \
             replace it anyway"
        ))),
        _ => Ok(()),
    }
}

/// Deletes promotion `p`'s hash. Without `force`, refused while its records
/// hold deductions: derived in the same script from the hash where it can
/// be, else by counting records with SCAN first. Records, memos and
/// per-customer counters are left to expire with their TTLs.
pub async fn delete(ledger: &Ledger, p: &Id, force: bool) -> Result<(), AdminError> {
    let refuse = |o: Outstanding| {
        AdminError::Refused(format!(
            "promotion {p} has outstanding deductions ({o}): once it is deleted, refunds \
             cannot return them; pass --force to delete it anyway"
        ))
    };
    match ledger.promo_delete(p, force).await? {
        DeleteReply::Deleted => Ok(()),
        DeleteReply::NotFound => Err(AdminError::NotFound(p.clone())),
        DeleteReply::Outstanding { budget, stock } => Err(refuse(Outstanding {
            budget,
            stock,
            orders: None,
        })),
        DeleteReply::Unknown => {
            let n = count_deducted(ledger, p).await?;
            if n > 0 {
                return Err(refuse(Outstanding {
                    orders: Some(n),
                    ..Outstanding::default()
                }));
            }
            Box::pin(delete(ledger, p, true)).await
        }
    }
}

/// One promotion of `promo list`: its view, or why it cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub promotion_id: Id,
    pub view: Result<PromoView, String>,
}

impl Listed {
    pub fn to_json(&self) -> serde_json::Value {
        match &self.view {
            Ok(v) => v.to_json(),
            Err(e) => serde_json::json!({"promotion_id": self.promotion_id.as_str(), "error": e}),
        }
    }

    /// One line: id, status, stock, budget, limit.
    pub fn line(&self) -> String {
        let v = match &self.view {
            Ok(v) => v,
            Err(e) => return format!("{}  UNREADABLE: {e}", self.promotion_id),
        };
        let amount = |left: Option<u64>, initial: Option<u64>| match (left, initial) {
            (None, _) => "unlimited".to_owned(),
            (Some(l), Some(i)) => format!("{l}/{i}"),
            (Some(l), None) => l.to_string(),
        };
        format!(
            "{}  {}  stock {}  budget {}  per customer {}",
            v.promotion_id,
            if v.paused { "paused" } else { "active" },
            amount(v.stock, v.initial_stock),
            amount(v.budget, v.initial_budget),
            v.per_customer
                .map_or("unlimited".to_owned(), |n| n.to_string()),
        )
    }
}

/// The promotions under the key prefix (hash keys `prefix:{P}`, found with
/// SCAN), sorted by id: the page of at most `limit` ids after `after`. A
/// promotion that cannot be read is listed with the reason.
pub async fn list(
    ledger: &Ledger,
    after: Option<&Id>,
    limit: Option<usize>,
) -> Result<Vec<Listed>, AdminError> {
    // Sorted and deduplicated already.
    let mut ids = super::audit::promotions(ledger).await?;
    ids.retain(|id| after.is_none_or(|a| id.as_str() > a.as_str()));
    ids.truncate(limit.unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let view = match promo_show(ledger, &id).await {
            Ok(Some(v)) => Ok(v),
            // Deleted between the scan and the read.
            Ok(None) => continue,
            Err(AdminError::Corrupt { field, value, .. }) => {
                Err(format!("field {field} = {value:?}"))
            }
            Err(e) => return Err(e),
        };
        out.push(Listed {
            promotion_id: id,
            view,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outstanding_reads_in_words() {
        let o = Outstanding {
            budget: Some(3500),
            stock: Some(7),
            orders: None,
        };
        assert!(o.any());
        assert_eq!(
            o.to_string(),
            "stock 7, budget 3500 held by orders (initial - remaining)"
        );
        let none = Outstanding {
            budget: Some(0),
            stock: None,
            orders: None,
        };
        assert!(!none.any());
        let one = Outstanding {
            budget: Some(0),
            stock: Some(1),
            orders: None,
        };
        assert_eq!(
            one.to_string(),
            "stock 1 held by orders (initial - remaining)"
        );
        let counted = Outstanding {
            orders: Some(2),
            ..Outstanding::default()
        };
        assert!(counted.any());
        assert_eq!(counted.to_string(), "2 order(s) still deducted");
    }

    #[test]
    fn amounts_display() {
        let a = Amounts {
            budget: None,
            initial_budget: None,
            stock: Some(3),
            initial_stock: Some(8),
        };
        assert_eq!(a.to_string(), "budget unlimited, stock 3 remaining of 8");
    }
}
