//! Typed replies of the scripts. Each decoder takes the raw reply of one
//! script (its `Reply:` lines in `lua/*.lua`) and returns an enum or struct
//! of this module; a reply of another shape is a
//! [`LedgerError::MalformedReply`] naming the script.

use std::fmt;

use fred::prelude::Value;

use super::error::LedgerError;
use super::scripts::{AUDIT, RELEASE, ROLLBACK};
use super::scripts::{MEMO, PROMO_ADJUST, PROMO_DELETE, PROMO_LIMIT, PROMO_SET, PROMO_STATUS};
use crate::domain::decision::{Reason, Remaining};
use crate::domain::event::Id;

/// What a line script decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineStatus {
    /// Accepted (deduct.lua) or applied (rollback.lua).
    Done,
    Rejected(Reason),
    /// deduct.lua found the line released for this event (release.lua): the
    /// event's decision is the reason stored on another of its lines.
    Released,
}

/// The decoded reply of `deduct.lua` or `rollback.lua` for one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineReply {
    pub status: LineStatus,
    pub duplicate: bool,
    pub budget: u64,
    pub stock: u64,
    pub remaining: Remaining,
}

impl LineReply {
    /// The status as the domain's result: a released line is the event's
    /// `order_reverted` where no other reason is known.
    pub fn result(&self) -> Result<(), Reason> {
        match &self.status {
            LineStatus::Done => Ok(()),
            LineStatus::Rejected(r) => Err(*r),
            LineStatus::Released => Err(Reason::OrderReverted),
        }
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.to_string()),
        Value::Bytes(b) => String::from_utf8(b.to_vec()).ok(),
        _ => None,
    }
}

fn integer(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(i) => Some(*i),
        _ => None,
    }
}

/// The items of an array reply of exactly `n` items.
fn items(script: &'static str, reply: Value, n: usize) -> Result<Vec<Value>, LedgerError> {
    match reply {
        Value::Array(items) if items.len() == n => Ok(items),
        other => Err(LedgerError::malformed(
            script,
            format!("expected {n} items, got {other:?}"),
        )),
    }
}

/// The first item of a reply as text: the script's verdict word.
fn word(script: &'static str, v: &Value) -> Result<String, LedgerError> {
    text(v).ok_or_else(|| LedgerError::malformed(script, format!("result {v:?}")))
}

fn unexpected<T>(script: &'static str, word: &str) -> Result<T, LedgerError> {
    Err(LedgerError::malformed(script, format!("result {word:?}")))
}

/// Decodes `{status, reason, duplicate, budget, stock, remaining_budget,
/// remaining_stock}` of `script` (deduct.lua: `ok_status` "accepted", and a
/// line may be released; rollback.lua: "applied").
fn decode_line(
    script: &'static str,
    ok_status: &str,
    may_be_released: bool,
    reply: Value,
) -> Result<LineReply, LedgerError> {
    let bad = |detail: String| LedgerError::malformed(script, detail);
    let Value::Array(items) = reply else {
        return Err(bad(format!("expected an array, got {reply:?}")));
    };
    if items.len() != 7 {
        return Err(bad(format!("expected 7 items, got {items:?}")));
    }
    let status = text(&items[0]).ok_or_else(|| bad(format!("status {:?}", items[0])))?;
    let reason = text(&items[1]).ok_or_else(|| bad(format!("reason {:?}", items[1])))?;
    let status = match (status.as_str(), reason.as_str()) {
        (s, "") if s == ok_status => LineStatus::Done,
        ("rejected", "released") if may_be_released => LineStatus::Released,
        ("rejected", r) => {
            LineStatus::Rejected(Reason::parse(r).ok_or_else(|| bad(format!("reason {r:?}")))?)
        }
        (s, r) => return Err(bad(format!("status {s:?} with reason {r:?}"))),
    };
    let duplicate = match integer(&items[2]) {
        Some(0) => false,
        Some(1) => true,
        _ => return Err(bad(format!("duplicate {:?}", items[2]))),
    };
    let amount = |i: usize, name: &str| {
        integer(&items[i])
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| bad(format!("{name} {:?}", items[i])))
    };
    let left = |i: usize, name: &str| match integer(&items[i]) {
        Some(-1) => Ok(None),
        Some(n) if n >= 0 => Ok(Some(n as u64)),
        _ => Err(bad(format!("{name} {:?}", items[i]))),
    };
    Ok(LineReply {
        status,
        duplicate,
        budget: amount(3, "budget")?,
        stock: amount(4, "stock")?,
        remaining: Remaining {
            budget: left(5, "remaining_budget")?,
            stock: left(6, "remaining_stock")?,
        },
    })
}

/// Decodes `deduct.lua`'s reply.
pub fn decode_deduct(reply: Value) -> Result<LineReply, LedgerError> {
    decode_line(super::scripts::DEDUCT.name, "accepted", true, reply)
}

/// `rollback.lua`'s reply: the line's result, or the customer the record
/// counted for when the refund event named another one (nothing written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollbackReply {
    Line(LineReply),
    Customer(Id),
}

/// Decodes `rollback.lua`'s reply.
pub fn decode_rollback(reply: Value) -> Result<RollbackReply, LedgerError> {
    if let Value::Array(items) = &reply {
        if items.len() == 7 && text(&items[0]).as_deref() == Some("customer") {
            let c = text(&items[1]).unwrap_or_default();
            return Id::parse(&c)
                .map(RollbackReply::Customer)
                .map_err(|_| LedgerError::malformed(ROLLBACK.name, format!("customer {c:?}")));
        }
    }
    decode_line(ROLLBACK.name, "applied", false, reply).map(RollbackReply::Line)
}

/// Decodes `release.lua`'s `{released}`.
/// `release.lua`'s reply: whether a deduction was given back, or the
/// customer whose slot the record counted when the call named another one
/// (nothing written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseReply {
    Released(bool),
    Customer(Id),
}

pub fn decode_release(reply: Value) -> Result<ReleaseReply, LedgerError> {
    match &reply {
        Value::Array(items) if items.len() == 1 => match integer(&items[0]) {
            Some(0) => return Ok(ReleaseReply::Released(false)),
            Some(1) => return Ok(ReleaseReply::Released(true)),
            _ => {}
        },
        Value::Array(items) if items.len() == 2 && integer(&items[0]) == Some(-1) => {
            if let Some(c) = text(&items[1]).and_then(|c| Id::parse(&c).ok()) {
                return Ok(ReleaseReply::Customer(c));
            }
        }
        _ => {}
    }
    Err(LedgerError::malformed(
        RELEASE.name,
        format!("expected {{0|1}} or {{-1, customer}}, got {reply:?}"),
    ))
}

/// Decodes `memo.lua`'s reply: the stored rejection, if any.
pub fn decode_memo(reply: Value) -> Result<Option<Reason>, LedgerError> {
    match text(&reply).as_deref() {
        Some("") => Ok(None),
        Some(r) => Reason::parse(r)
            .map(Some)
            .ok_or_else(|| LedgerError::malformed(MEMO.name, format!("reason {r:?}"))),
        None => Err(LedgerError::malformed(
            MEMO.name,
            format!("expected a string, got {reply:?}"),
        )),
    }
}

/// `promo_set.lua`'s verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetReply {
    Created,
    Replaced,
    /// It exists and the call did not ask to replace it.
    Exists,
    /// Its records hold deductions; nothing replaced.
    Outstanding,
}

pub fn decode_promo_set(reply: Value) -> Result<SetReply, LedgerError> {
    let w = word(PROMO_SET.name, &reply)?;
    match w.as_str() {
        "created" => Ok(SetReply::Created),
        "replaced" => Ok(SetReply::Replaced),
        "exists" => Ok(SetReply::Exists),
        "outstanding" => Ok(SetReply::Outstanding),
        other => unexpected(PROMO_SET.name, other),
    }
}

/// `promo_status.lua`'s verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusReply {
    Changed,
    /// It already was that way; nothing written.
    Unchanged,
    NotFound,
}

pub fn decode_promo_status(reply: Value) -> Result<StatusReply, LedgerError> {
    let items = items(PROMO_STATUS.name, reply, 2)?;
    match word(PROMO_STATUS.name, &items[0])?.as_str() {
        "changed" => Ok(StatusReply::Changed),
        "unchanged" => Ok(StatusReply::Unchanged),
        "not_found" => Ok(StatusReply::NotFound),
        other => unexpected(PROMO_STATUS.name, other),
    }
}

/// An amount of a reply: `-1` = absent.
fn amount(script: &'static str, v: &Value) -> Result<Option<u64>, LedgerError> {
    match v {
        Value::Integer(-1) => Ok(None),
        Value::Integer(n) if *n >= 0 => Ok(Some(*n as u64)),
        other => Err(LedgerError::malformed(script, format!("amount {other:?}"))),
    }
}

/// A promotion's amounts after an adjustment; `None` = absent (unlimited,
/// or for `initial_*`, not recorded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amounts {
    pub budget: Option<u64>,
    pub initial_budget: Option<u64>,
    pub stock: Option<u64>,
    pub initial_stock: Option<u64>,
}

impl fmt::Display for Amounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let one = |left: Option<u64>, initial: Option<u64>| match (left, initial) {
            (None, _) => "unlimited".to_owned(),
            (Some(l), Some(i)) => format!("{l} remaining of {i}"),
            (Some(l), None) => format!("{l} remaining"),
        };
        write!(
            f,
            "budget {}, stock {}",
            one(self.budget, self.initial_budget),
            one(self.stock, self.initial_stock)
        )
    }
}

/// `promo_adjust.lua`'s verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdjustVerdict {
    Adjusted,
    NotFound,
    /// The dimension named in the reply has no limit.
    Unlimited,
    BelowZero,
    AboveMax,
}

/// `promo_adjust.lua`'s reply: the verdict, the dimension it is about
/// (`budget` or `stock`) and the amounts now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdjustReply {
    pub verdict: AdjustVerdict,
    pub field: String,
    pub amounts: Amounts,
}

pub fn decode_promo_adjust(reply: Value) -> Result<AdjustReply, LedgerError> {
    let name = PROMO_ADJUST.name;
    let items = items(name, reply, 6)?;
    let verdict = match word(name, &items[0])?.as_str() {
        "adjusted" => AdjustVerdict::Adjusted,
        "not_found" => AdjustVerdict::NotFound,
        "unlimited" => AdjustVerdict::Unlimited,
        "below_zero" => AdjustVerdict::BelowZero,
        "above_max" => AdjustVerdict::AboveMax,
        other => return unexpected(name, other),
    };
    Ok(AdjustReply {
        verdict,
        field: text(&items[1]).unwrap_or_default(),
        amounts: Amounts {
            budget: amount(name, &items[2])?,
            initial_budget: amount(name, &items[3])?,
            stock: amount(name, &items[4])?,
            initial_stock: amount(name, &items[5])?,
        },
    })
}

/// `promo_limit.lua`'s verdict, with the limit before the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitReply {
    Changed { previous: Option<u64> },
    Unchanged { previous: Option<u64> },
    NotFound,
}

pub fn decode_promo_limit(reply: Value) -> Result<LimitReply, LedgerError> {
    let name = PROMO_LIMIT.name;
    let items = items(name, reply, 2)?;
    let previous = amount(name, &items[1])?;
    match word(name, &items[0])?.as_str() {
        "set" | "removed" => Ok(LimitReply::Changed { previous }),
        "unchanged" => Ok(LimitReply::Unchanged { previous }),
        "not_found" => Ok(LimitReply::NotFound),
        other => unexpected(name, other),
    }
}

/// `promo_delete.lua`'s verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteReply {
    Deleted,
    NotFound,
    /// `initial - remaining` per dimension (`None` where not derivable).
    Outstanding {
        budget: Option<i64>,
        stock: Option<i64>,
    },
    /// The hash cannot say what is outstanding: the caller counts records.
    Unknown,
}

pub fn decode_promo_delete(reply: Value) -> Result<DeleteReply, LedgerError> {
    let name = PROMO_DELETE.name;
    let items = items(name, reply, 3)?;
    let signed = |v: &Value| -> Result<Option<i64>, LedgerError> {
        match text(v).as_deref() {
            Some("") => Ok(None),
            Some(s) => s
                .parse()
                .map(Some)
                .map_err(|_| LedgerError::malformed(name, format!("amount {s:?}"))),
            None => Err(LedgerError::malformed(name, format!("amount {v:?}"))),
        }
    };
    match word(name, &items[0])?.as_str() {
        "deleted" => Ok(DeleteReply::Deleted),
        "not_found" => Ok(DeleteReply::NotFound),
        "outstanding" => Ok(DeleteReply::Outstanding {
            budget: signed(&items[1])?,
            stock: signed(&items[2])?,
        }),
        "unknown" => Ok(DeleteReply::Unknown),
        other => unexpected(name, other),
    }
}

/// One key as `audit.lua` read it, its values raw (the caller judges them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    Absent,
    Hash(std::collections::HashMap<String, String>),
    String(String),
    /// Another Redis type (corrupt): its `TYPE`.
    Other(String),
}

/// A promotion, its records and counters, read at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub promotion: Option<Stored>,
    pub records: Vec<(String, Stored)>,
    pub counters: Vec<(String, Stored)>,
    /// Mode "index": each day index of the promotion that is not a set,
    /// with its `TYPE` (corrupt).
    pub indexes: Vec<(String, String)>,
}

/// `audit.lua`'s reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditReply {
    Read(Snapshot),
    /// Mode "scan" on a database holding this many keys: nothing was read.
    TooBig(u64),
    /// Mode "index" on a promotion without `indexed` (created by an
    /// earlier release, or on a Redis Cluster): nothing was read.
    Unindexed,
}

/// `{type, values...}` of audit.lua as a [`Stored`].
fn stored(name: &'static str, parts: &[Value]) -> Result<Stored, LedgerError> {
    let bad = || LedgerError::malformed(name, format!("value {parts:?}"));
    let kind = parts.first().and_then(text).ok_or_else(bad)?;
    let rest: Vec<String> = parts[1..]
        .iter()
        .map(|v| text(v).ok_or_else(bad))
        .collect::<Result<_, _>>()?;
    Ok(match kind.as_str() {
        "none" => Stored::Absent,
        "hash" if rest.len() % 2 == 0 => Stored::Hash(
            rest.chunks(2)
                .map(|kv| (kv[0].clone(), kv[1].clone()))
                .collect(),
        ),
        "string" if rest.len() == 1 => Stored::String(rest[0].clone()),
        "hash" | "string" => return Err(bad()),
        other => Stored::Other(other.to_owned()),
    })
}

/// `{key, type, values...}` items of audit.lua.
fn keyed(name: &'static str, v: Value) -> Result<Vec<(String, Stored)>, LedgerError> {
    let Value::Array(items) = v else {
        return Err(LedgerError::malformed(name, format!("list {v:?}")));
    };
    items
        .into_iter()
        .map(|item| match item {
            Value::Array(parts) if !parts.is_empty() => {
                let key = text(&parts[0])
                    .ok_or_else(|| LedgerError::malformed(name, format!("key {:?}", parts[0])))?;
                Ok((key, stored(name, &parts[1..])?))
            }
            other => Err(LedgerError::malformed(name, format!("item {other:?}"))),
        })
        .collect()
}

/// `{key, type}` items of audit.lua (a key of the wrong type, no value).
fn typed(name: &'static str, v: Value) -> Result<Vec<(String, String)>, LedgerError> {
    let Value::Array(items) = v else {
        return Err(LedgerError::malformed(name, format!("list {v:?}")));
    };
    items
        .into_iter()
        .map(|item| match &item {
            Value::Array(parts) => match parts.as_slice() {
                [key, kind] => text(key).zip(text(kind)),
                _ => None,
            }
            .ok_or_else(|| LedgerError::malformed(name, format!("item {item:?}"))),
            _ => Err(LedgerError::malformed(name, format!("item {item:?}"))),
        })
        .collect()
}

/// Decodes `{"ok", promotion, records, counters, indexes}`, `{"too_big", n}`
/// or `{"unindexed"}`.
pub fn decode_audit(reply: Value) -> Result<AuditReply, LedgerError> {
    let name = AUDIT.name;
    let Value::Array(mut items) = reply else {
        return Err(LedgerError::malformed(name, format!("reply {reply:?}")));
    };
    match items.first().and_then(text).as_deref() {
        Some("too_big") if items.len() == 2 => {
            let n = integer(&items[1]).unwrap_or_default();
            Ok(AuditReply::TooBig(n.max(0) as u64))
        }
        Some("unindexed") if items.len() == 1 => Ok(AuditReply::Unindexed),
        Some("ok") if items.len() == 5 => {
            let indexes = typed(name, items.pop().unwrap_or(Value::Null))?;
            let counters = keyed(name, items.pop().unwrap_or(Value::Null))?;
            let records = keyed(name, items.pop().unwrap_or(Value::Null))?;
            let promotion = match items.pop() {
                Some(Value::Array(parts)) => stored(name, &parts)?,
                other => return Err(LedgerError::malformed(name, format!("promotion {other:?}"))),
            };
            Ok(AuditReply::Read(Snapshot {
                promotion: Some(promotion),
                records,
                counters,
                indexes,
            }))
        }
        _ => Err(LedgerError::malformed(name, format!("reply {items:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::ErrorClass;

    fn s(v: &str) -> Value {
        Value::String(v.into())
    }

    fn i(n: i64) -> Value {
        Value::Integer(n)
    }

    #[test]
    fn decodes_a_line() {
        let reply = Value::Array(vec![s("accepted"), s(""), i(0), i(30), i(1), i(70), i(-1)]);
        let line = decode_deduct(reply).unwrap();
        assert_eq!(line.status, LineStatus::Done);
        assert_eq!((line.budget, line.stock), (30, 1));
        assert_eq!(
            line.remaining,
            Remaining {
                budget: Some(70),
                stock: None
            }
        );

        let reply = Value::Array(vec![
            s("rejected"),
            s("budget_exceeded"),
            i(1),
            i(0),
            i(0),
            i(-1),
            i(-1),
        ]);
        let line = decode_deduct(reply).unwrap();
        assert_eq!(line.status, LineStatus::Rejected(Reason::BudgetExceeded));
        assert_eq!(line.result(), Err(Reason::BudgetExceeded));
        assert!(line.duplicate);
    }

    #[test]
    fn a_released_line_is_its_own_status_and_only_deduct_has_it() {
        let released = vec![s("rejected"), s("released"), i(1), i(0), i(0), i(-1), i(-1)];
        let line = decode_deduct(Value::Array(released.clone())).unwrap();
        assert_eq!(line.status, LineStatus::Released);
        assert_eq!(line.result(), Err(Reason::OrderReverted));
        let e = decode_rollback(Value::Array(released)).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Reply, "{e}");
    }

    #[test]
    fn malformed_lines_are_errors() {
        let good = vec![s("applied"), s(""), i(0), i(3), i(1), i(7), i(-1)];
        assert!(decode_rollback(Value::Array(good.clone())).is_ok());
        let mut cases = Vec::new();
        for (n, v) in [
            (0, s("accepted")),
            (1, s("budget_exceeded")),
            (2, i(2)),
            (3, i(-1)),
            (5, i(-2)),
            (6, s("7")),
        ] {
            let mut bad = good.clone();
            bad[n] = v;
            cases.push(Value::Array(bad));
        }
        cases.push(Value::Array(good[..6].to_vec()));
        cases.push(s("applied"));
        for case in cases {
            let e = decode_rollback(case.clone()).unwrap_err();
            assert_eq!(e.class(), ErrorClass::Reply, "{case:?}");
        }
        let mut unknown = good;
        unknown[0] = s("rejected");
        unknown[1] = s("no_such_reason");
        assert!(decode_rollback(Value::Array(unknown)).is_err());
    }

    #[test]
    fn decodes_the_other_customer_of_a_rollback() {
        let reply = Value::Array(vec![s("customer"), s("c7"), i(0), i(0), i(0), i(0), i(0)]);
        assert_eq!(
            decode_rollback(reply).unwrap(),
            RollbackReply::Customer(Id::parse("c7").unwrap())
        );
        let bad = Value::Array(vec![s("customer"), s(""), i(0), i(0), i(0), i(0), i(0)]);
        assert!(decode_rollback(bad).is_err());
    }

    #[test]
    fn decodes_release_and_memo() {
        assert_eq!(
            decode_release(Value::Array(vec![i(1)])).unwrap(),
            ReleaseReply::Released(true)
        );
        assert_eq!(
            decode_release(Value::Array(vec![i(0)])).unwrap(),
            ReleaseReply::Released(false)
        );
        assert_eq!(
            decode_release(Value::Array(vec![i(-1), s("c7")])).unwrap(),
            ReleaseReply::Customer(Id::parse("c7").unwrap())
        );
        assert!(decode_release(Value::Array(vec![i(-1), s("a:b")])).is_err());
        assert!(decode_release(i(1)).is_err());
        assert_eq!(decode_memo(s("")).unwrap(), None);
        assert_eq!(
            decode_memo(s("order_reverted")).unwrap(),
            Some(Reason::OrderReverted)
        );
        assert!(decode_memo(s("nope")).is_err());
        assert!(decode_memo(Value::Null).is_err());
    }

    #[test]
    fn decodes_the_promo_scripts() {
        assert_eq!(decode_promo_set(s("replaced")).unwrap(), SetReply::Replaced);
        assert!(decode_promo_set(s("maybe")).is_err());
        assert_eq!(
            decode_promo_status(Value::Array(vec![s("unchanged"), s("paused")])).unwrap(),
            StatusReply::Unchanged
        );
        assert!(decode_promo_status(s("changed")).is_err());
        let adjust = decode_promo_adjust(Value::Array(vec![
            s("below_zero"),
            s("stock"),
            i(-1),
            i(-1),
            i(4),
            i(10),
        ]))
        .unwrap();
        assert_eq!(adjust.verdict, AdjustVerdict::BelowZero);
        assert_eq!(adjust.field, "stock");
        assert_eq!(adjust.amounts.stock, Some(4));
        assert_eq!(adjust.amounts.budget, None);
        assert_eq!(
            adjust.amounts.to_string(),
            "budget unlimited, stock 4 remaining of 10"
        );
        assert_eq!(
            decode_promo_limit(Value::Array(vec![s("removed"), i(3)])).unwrap(),
            LimitReply::Changed { previous: Some(3) }
        );
        assert!(decode_promo_limit(Value::Array(vec![s("set"), i(-5)])).is_err());
        assert_eq!(
            decode_promo_delete(Value::Array(vec![s("outstanding"), s("-2"), s("")])).unwrap(),
            DeleteReply::Outstanding {
                budget: Some(-2),
                stock: None
            }
        );
        assert!(decode_promo_delete(Value::Array(vec![s("outstanding"), s("x"), s("")])).is_err());
    }
}
