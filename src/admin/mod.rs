//! Operator tools as library functions (the CLI wires them up).
//!
//! `promo set` / `promo show`: create, replace and read a promotion hash
//! (CONTRACT.md section 2). Besides the contract's fields, `promo set` stores
//! `initial_budget` / `initial_stock`, which the scripts ignore, so that an
//! audit can check `initial - remaining == outstanding`.
//!
//! [`promo`]: in-place changes of a live promotion (pause, resume, adjust,
//! limit, delete) and `promo list`; [`lookup`]: `order show` / `event show`;
//! [`dlq`]: the dead-letter topic.

pub mod audit;
pub mod bucketed;
pub mod check;
pub mod dataset;
pub mod dlq;
pub mod healthcheck;
pub mod lookup;
pub mod promo;
pub mod publish;

use std::fmt;

use crate::domain::event::Id;
use crate::ledger::calls::SetMode;
use crate::ledger::reply::SetReply;
use crate::ledger::{Ledger, LedgerError};

/// Largest amount a promotion field may hold: 15 digits keep the scripts'
/// Lua arithmetic exact.
pub const MAX_PROMO_AMOUNT: u64 = 999_999_999_999_999;

/// What `promo set` writes. `None` amounts are unlimited; `None` window
/// bounds are open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromoSpec {
    pub budget: Option<u64>,
    pub stock: Option<u64>,
    pub per_customer: Option<u64>,
    /// Unix seconds, inclusive.
    pub starts_at: Option<i64>,
    /// Unix seconds, exclusive.
    pub ends_at: Option<i64>,
    pub paused: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromoSetResult {
    Created,
    /// `--force` replaced an existing promotion hash (records and per-customer
    /// counters of the old one are kept).
    Replaced,
}

impl fmt::Display for PromoSetResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PromoSetResult::Created => "created",
            PromoSetResult::Replaced => "replaced",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("promotion {0} exists; pass --force to overwrite")]
    Exists(Id),
    #[error("promotion {0} does not exist")]
    NotFound(Id),
    /// The change was refused as it stands; nothing was written. The text
    /// says why and what to do instead.
    #[error("{0}")]
    Refused(String),
    #[error("invalid promotion: {0}")]
    Invalid(String),
    #[error("promotion {promotion} has corrupt data: field {field} = {value:?}")]
    Corrupt {
        promotion: Id,
        field: String,
        value: String,
    },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// A promotion as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromoView {
    pub promotion_id: Id,
    /// Remaining budget; `None` = unlimited.
    pub budget: Option<u64>,
    pub stock: Option<u64>,
    pub per_customer: Option<u64>,
    pub paused: bool,
    pub starts_at: Option<i64>,
    pub ends_at: Option<i64>,
    pub initial_budget: Option<u64>,
    pub initial_stock: Option<u64>,
    /// The promotion's incarnation (`gen`), when stored: promotions written
    /// before it existed lack it.
    pub gen: Option<u64>,
    /// A bucketed promotion's buckets (then `budget` / `stock` are their
    /// free units and those in transit between them, summed).
    pub buckets: Option<Vec<bucketed::BucketView>>,
}

impl PromoSpec {
    pub(crate) fn validate(&self) -> Result<(), AdminError> {
        for (name, v) in [
            ("budget", self.budget),
            ("stock", self.stock),
            ("per_customer", self.per_customer),
        ] {
            if v.is_some_and(|v| v > MAX_PROMO_AMOUNT) {
                return Err(AdminError::Invalid(format!(
                    "{name} must be at most {MAX_PROMO_AMOUNT}"
                )));
            }
        }
        for (name, v) in [("starts_at", self.starts_at), ("ends_at", self.ends_at)] {
            if v.is_some_and(|v| !(0..=MAX_PROMO_AMOUNT as i64).contains(&v)) {
                return Err(AdminError::Invalid(format!(
                    "{name} must be unix seconds from 0 to {MAX_PROMO_AMOUNT}"
                )));
            }
        }
        if let (Some(s), Some(e)) = (self.starts_at, self.ends_at) {
            if s >= e {
                return Err(AdminError::Invalid(format!(
                    "starts_at ({s}) must be before ends_at ({e})"
                )));
            }
        }
        Ok(())
    }

    /// The hash's field/value pairs.
    pub(crate) fn fields(&self) -> Vec<(&'static str, String)> {
        let mut f = vec![(
            "status",
            if self.paused { "paused" } else { "active" }.to_owned(),
        )];
        let mut put = |name, v: Option<String>| {
            if let Some(v) = v {
                f.push((name, v));
            }
        };
        put("budget", self.budget.map(|v| v.to_string()));
        put("initial_budget", self.budget.map(|v| v.to_string()));
        put("stock", self.stock.map(|v| v.to_string()));
        put("initial_stock", self.stock.map(|v| v.to_string()));
        put("per_customer", self.per_customer.map(|v| v.to_string()));
        put("starts_at", self.starts_at.map(|v| v.to_string()));
        put("ends_at", self.ends_at.map(|v| v.to_string()));
        f
    }
}

/// Creates promotion `p`, or with `force` replaces its whole hash; both in
/// one script, so the existence check and the write cannot interleave with
/// another writer.
pub async fn promo_set(
    ledger: &Ledger,
    p: &Id,
    spec: PromoSpec,
    force: bool,
) -> Result<PromoSetResult, AdminError> {
    let mode = if force {
        SetMode::Replace
    } else {
        SetMode::Create
    };
    set_as(ledger, p, spec, mode).await
}

/// `promo set --force` without `--discard-outstanding`: replaces `p` only
/// when its hash shows nothing outstanding at the moment of the write (the
/// check and the replace are one script); refused otherwise.
pub async fn promo_replace_if_settled(
    ledger: &Ledger,
    p: &Id,
    spec: PromoSpec,
) -> Result<PromoSetResult, AdminError> {
    set_as(ledger, p, spec, SetMode::ReplaceIdle).await
}

async fn set_as(
    ledger: &Ledger,
    p: &Id,
    spec: PromoSpec,
    mode: SetMode,
) -> Result<PromoSetResult, AdminError> {
    spec.validate()?;
    let fields = spec.fields();
    let reply = ledger.promo_set(p, mode, fields).await?;
    // The first promotion of a ledger marks it (created once): a Redis that
    // later comes back empty is told apart from one never used (`dataset`).
    ledger.ensure_ledger_marker().await?;
    match reply {
        SetReply::Created => Ok(PromoSetResult::Created),
        SetReply::Replaced => Ok(PromoSetResult::Replaced),
        SetReply::Exists => Err(AdminError::Exists(p.clone())),
        SetReply::Outstanding => Err(AdminError::Refused(format!(
            "promotion {p} has outstanding deductions (a deduction landed meanwhile); \
             nothing was replaced: change it in place with promo adjust / limit / pause / \
             resume, or pass --discard-outstanding"
        ))),
    }
}

/// Reads promotion `p`; `None` when it does not exist.
pub async fn promo_show(ledger: &Ledger, p: &Id) -> Result<Option<PromoView>, AdminError> {
    let key = ledger.keys().promotion(p);
    let h = ledger.hash(&key).await?;
    if h.is_empty() {
        return Ok(None);
    }
    let corrupt = |field: &str, value: &str| AdminError::Corrupt {
        promotion: p.clone(),
        field: field.to_owned(),
        value: value.to_owned(),
    };
    let num = |field: &str| -> Result<Option<u64>, AdminError> {
        match h.get(field) {
            None => Ok(None),
            Some(v) if is_canonical(v) => Ok(Some(v.parse().map_err(|_| corrupt(field, v))?)),
            Some(v) => Err(corrupt(field, v)),
        }
    };
    let paused = match h.get("status").map(String::as_str) {
        None | Some("active") => false,
        Some("paused") => true,
        Some(other) => return Err(corrupt("status", other)),
    };
    let buckets = bucketed::buckets_of(ledger, p, &h).await?;
    let (budget, stock) = match &buckets {
        Some(b) => (
            Some(b.iter().map(|x| x.budget + x.held_budget).sum()),
            Some(b.iter().map(|x| x.stock + x.held_stock).sum()),
        ),
        None => (num("budget")?, num("stock")?),
    };
    Ok(Some(PromoView {
        promotion_id: p.clone(),
        budget,
        stock,
        per_customer: num("per_customer")?,
        paused,
        starts_at: num("starts_at")?.map(|v| v as i64),
        ends_at: num("ends_at")?.map(|v| v as i64),
        initial_budget: num("initial_budget")?,
        initial_stock: num("initial_stock")?,
        gen: num("gen")?,
        buckets,
    }))
}

/// The contract's canonical integer (lib.lua's `canonical`).
fn is_canonical(s: &str) -> bool {
    crate::domain::stored::canonical(s).is_some()
}

pub(crate) fn unix(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| secs.to_string())
}

impl PromoView {
    /// The `--output json` form: amounts as numbers, `null` = unlimited
    /// (or, for a window bound, open).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "promotion_id": self.promotion_id.as_str(),
            "status": if self.paused { "paused" } else { "active" },
            "budget": self.budget,
            "initial_budget": self.initial_budget,
            "stock": self.stock,
            "initial_stock": self.initial_stock,
            "per_customer": self.per_customer,
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "gen": self.gen,
            "buckets": self.buckets.as_ref().map(|b| b.iter().map(|x| serde_json::json!({
                "key": x.key,
                "budget": x.budget,
                "stock": x.stock,
                "in_transit_budget": x.held_budget,
                "in_transit_stock": x.held_stock,
                "set_aside_budget": x.set_budget,
                "set_aside_stock": x.set_stock,
            })).collect::<Vec<_>>()),
        })
    }
}

impl fmt::Display for PromoView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = if self.paused { "paused" } else { "active" };
        writeln!(f, "promotion {}: {status}", self.promotion_id)?;
        for (name, left, initial) in [
            ("budget", self.budget, self.initial_budget),
            ("stock", self.stock, self.initial_stock),
        ] {
            match (left, initial) {
                (None, _) => writeln!(f, "  {name}: unlimited")?,
                (Some(l), Some(i)) => writeln!(f, "  {name}: {l} remaining of {i}")?,
                (Some(l), None) => writeln!(f, "  {name}: {l} remaining")?,
            }
        }
        match self.per_customer {
            None => writeln!(f, "  per customer: unlimited")?,
            Some(n) => writeln!(f, "  per customer: {n} order(s)")?,
        }
        let from = self.starts_at.map(unix).unwrap_or_else(|| "always".into());
        let until = self.ends_at.map(unix).unwrap_or_else(|| "forever".into());
        write!(f, "  window: from {from} until {until} (end exclusive)")?;
        if let Some(b) = &self.buckets {
            write!(
                f,
                "\n  buckets: {} (remaining = free + in transit)",
                b.len()
            )?;
            for x in b {
                write!(f, "\n    {x}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_numbers() {
        for ok in ["0", "1", "42", "999999999999999"] {
            assert!(is_canonical(ok), "{ok}");
        }
        for bad in [
            "",
            "-3",
            "1e3",
            "007",
            "abc",
            " 5 ",
            "9007199254740993",
            "+1",
        ] {
            assert!(!is_canonical(bad), "{bad}");
        }
    }

    #[test]
    fn spec_validation() {
        assert!(PromoSpec::default().validate().is_ok());
        let bad = [
            PromoSpec {
                budget: Some(MAX_PROMO_AMOUNT + 1),
                ..Default::default()
            },
            PromoSpec {
                starts_at: Some(-1),
                ..Default::default()
            },
            PromoSpec {
                starts_at: Some(10),
                ends_at: Some(10),
                ..Default::default()
            },
        ];
        for spec in bad {
            assert!(spec.validate().is_err(), "{spec:?}");
        }
    }

    #[test]
    fn view_displays_readably() {
        let v = PromoView {
            promotion_id: Id::parse("flash-42").unwrap(),
            budget: Some(98_500),
            stock: None,
            per_customer: Some(1),
            paused: false,
            starts_at: Some(0),
            ends_at: None,
            initial_budget: Some(100_000),
            initial_stock: None,
            gen: Some(3),
            buckets: None,
        };
        let s = v.to_string();
        assert!(s.contains("flash-42: active"), "{s}");
        assert!(s.contains("budget: 98500 remaining of 100000"), "{s}");
        assert!(s.contains("stock: unlimited"), "{s}");
        assert!(s.contains("1970-01-01T00:00:00Z"), "{s}");
        let j = v.to_json();
        assert_eq!(j["budget"], 98_500);
        assert_eq!(j["stock"], serde_json::Value::Null);
        assert_eq!(j["status"], "active");
        assert_eq!(j["gen"], 3);
    }
}
