//! The Lua scripts of `lua/`: compiled in, called by SHA1 with EVALSHA, and
//! sent whole with EVAL when a node's script cache lacks them (`NOSCRIPT`:
//! after a restart, a failover or `SCRIPT FLUSH`; EVAL also caches it there).
//! Each Cluster node has its own cache, and EVALSHA/EVAL are routed by the
//! first key, so the fallback runs on the node that said `NOSCRIPT`.
//! `lua/lib.lua` (helpers shared by the scripts) is compiled in front of
//! each script that uses it: the SHA1 is of that whole text.
//!
//! Replies are decoded into typed structs here; a reply of another shape is
//! a [`LedgerError::MalformedReply`].

use std::sync::LazyLock;

use fred::prelude::{Client, LuaInterface, Value};

use super::error::{classify, ErrorClass, LedgerError};
use crate::domain::decision::{Reason, Remaining};

/// One script: its metric name, body and SHA1 (computed once).
#[derive(Debug)]
pub struct Script {
    pub name: &'static str,
    pub body: &'static str,
    pub sha1: String,
}

impl Script {
    fn new(name: &'static str, body: &'static str) -> Script {
        #[cfg(feature = "mutants")] // TEST-ONLY mutant: a redelivery deducts again.
        let body = if name == "deduct" && crate::mutants::mutant("double-deduct") {
            String::leak(format!("{DOUBLE_DEDUCT}{body}"))
        } else {
            body
        };
        #[cfg(feature = "mutants")] // TEST-ONLY mutant: corrupt data is not remembered.
        let body = if crate::mutants::mutant("forget-corrupt") {
            assert!(
                body.contains(REMEMBER_CORRUPT),
                "forget-corrupt: lib.lua changed"
            );
            String::leak(body.replace(REMEMBER_CORRUPT, ""))
        } else {
            body
        };
        Script {
            name,
            body,
            sha1: fred::util::sha1_hash(body),
        }
    }
}

/// TEST-ONLY (feature `mutants`): put in front of deduct.lua, forgets the
/// record (KEYS[3]) when it is this event's (ARGV[4]): a redelivery deducts again.
#[cfg(feature = "mutants")]
const DOUBLE_DEDUCT: &str =
    "if redis.call('HGET', KEYS[3], 'event') == ARGV[4] then redis.call('DEL', KEYS[3]) end\n";

/// TEST-ONLY (feature `mutants`): the line of lua/lib.lua's
/// `remembering_corrupt` that stores the memo; without it, corrupt data is
/// forgotten as before the fix of issue 10 item 1, and a redelivery after the
/// data is repaired decides afresh.
#[cfg_attr(not(feature = "mutants"), allow(dead_code))]
const REMEMBER_CORRUPT: &str =
    "if is_corrupt(err) then redis.call('SET', key, value, 'EX', ttl) end";

/// A script of `lua/` with `lua/lib.lua` (the shared helpers) in front:
/// Redis scripts cannot load one another.
macro_rules! with_lib {
    ($name:literal) => {
        LazyLock::new(|| {
            Script::new(
                $name,
                concat!(
                    include_str!("../../lua/lib.lua"),
                    include_str!(concat!("../../lua/", $name, ".lua"))
                ),
            )
        })
    };
}

pub static DEDUCT: LazyLock<Script> = with_lib!("deduct");
pub static RELEASE: LazyLock<Script> = with_lib!("release");
pub static ROLLBACK: LazyLock<Script> = with_lib!("rollback");
pub static MEMO: LazyLock<Script> = with_lib!("memo");
pub static PROMO_SET: LazyLock<Script> =
    LazyLock::new(|| Script::new("promo_set", include_str!("../../lua/promo_set.lua")));
// The operator's in-place changes of a live promotion (src/admin/promo.rs).
pub static PROMO_STATUS: LazyLock<Script> = with_lib!("promo_status");
pub static PROMO_ADJUST: LazyLock<Script> = with_lib!("promo_adjust");
pub static PROMO_LIMIT: LazyLock<Script> = with_lib!("promo_limit");
pub static PROMO_DELETE: LazyLock<Script> = with_lib!("promo_delete");

/// Every script, for `SCRIPT LOAD` at startup.
pub fn all() -> [&'static Script; 9] {
    [
        &DEDUCT,
        &RELEASE,
        &ROLLBACK,
        &MEMO,
        &PROMO_SET,
        &PROMO_STATUS,
        &PROMO_ADJUST,
        &PROMO_LIMIT,
        &PROMO_DELETE,
    ]
}

/// EVALSHA, falling back to EVAL on `NOSCRIPT`.
pub(crate) async fn eval(
    client: &Client,
    script: &Script,
    keys: Vec<String>,
    args: Vec<String>,
) -> Result<Value, fred::error::Error> {
    match client
        .evalsha::<Value, _, _, _>(script.sha1.clone(), keys.clone(), args.clone())
        .await
    {
        Err(e) if classify(&e) == ErrorClass::NoScript => {
            tracing::debug!(
                script = script.name,
                "script not cached on the node; sending it whole"
            );
            client.eval::<Value, _, _, _>(script.body, keys, args).await
        }
        other => other,
    }
}

/// The decoded reply of `deduct.lua` or `rollback.lua` for one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineReply {
    /// `Ok(())` when accepted / applied, else the reason.
    pub status: Result<(), Reason>,
    pub duplicate: bool,
    pub budget: u64,
    pub stock: u64,
    pub remaining: Remaining,
    /// deduct.lua found the line released for this rejected event: the
    /// decision is the reason stored on another line (`status` is a
    /// placeholder then).
    pub released: bool,
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

/// Decodes `{status, reason, duplicate, budget, stock, remaining_budget,
/// remaining_stock}`; `ok_status` is `accepted` or `applied`.
pub(crate) fn decode_line(
    script: &Script,
    ok_status: &str,
    reply: Value,
) -> Result<LineReply, LedgerError> {
    let bad = |detail: String| LedgerError::malformed(script.name, detail);
    let Value::Array(items) = reply else {
        return Err(bad(format!("expected an array, got {reply:?}")));
    };
    if items.len() != 7 {
        return Err(bad(format!("expected 7 items, got {items:?}")));
    }
    let status = text(&items[0]).ok_or_else(|| bad(format!("status {:?}", items[0])))?;
    let reason = text(&items[1]).ok_or_else(|| bad(format!("reason {:?}", items[1])))?;
    let released = status == "rejected" && reason == "released";
    let status = match (status.as_str(), reason.as_str()) {
        (s, "") if s == ok_status => Ok(()),
        ("rejected", "released") => Err(Reason::OrderReverted),
        ("rejected", r) => Err(Reason::parse(r).ok_or_else(|| bad(format!("reason {r:?}")))?),
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
        released,
        duplicate,
        budget: amount(3, "budget")?,
        stock: amount(4, "stock")?,
        remaining: Remaining {
            budget: left(5, "remaining_budget")?,
            stock: left(6, "remaining_stock")?,
        },
    })
}

/// `rollback.lua`'s reply: the line's result, or the customer the record
/// counted for when the refund event named another one (nothing written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RollbackReply {
    Line(LineReply),
    Customer(crate::domain::event::Id),
}

/// Decodes `rollback.lua`'s reply.
pub(crate) fn decode_rollback(reply: Value) -> Result<RollbackReply, LedgerError> {
    if let Value::Array(items) = &reply {
        if items.len() == 7 && text(&items[0]).as_deref() == Some("customer") {
            let c = text(&items[1]).unwrap_or_default();
            return crate::domain::event::Id::parse(&c)
                .map(RollbackReply::Customer)
                .map_err(|_| LedgerError::malformed(ROLLBACK.name, format!("customer {c:?}")));
        }
    }
    decode_line(&ROLLBACK, "applied", reply).map(RollbackReply::Line)
}

/// Decodes `release.lua`'s `{released}`.
pub(crate) fn decode_release(reply: Value) -> Result<bool, LedgerError> {
    match &reply {
        Value::Array(items) if items.len() == 1 => match integer(&items[0]) {
            Some(0) => return Ok(false),
            Some(1) => return Ok(true),
            _ => {}
        },
        _ => {}
    }
    Err(LedgerError::malformed(
        RELEASE.name,
        format!("expected {{0|1}}, got {reply:?}"),
    ))
}

/// Decodes `memo.lua`'s reply: the stored rejection, if any.
pub(crate) fn decode_memo(reply: Value) -> Result<Option<Reason>, LedgerError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The forget-corrupt mutant removes this line; if lib.lua changes, the
    /// mutant would silently be the real build.
    #[test]
    fn the_forget_corrupt_mutant_finds_its_line() {
        assert!(include_str!("../../lua/lib.lua").contains(REMEMBER_CORRUPT));
    }

    fn s(v: &str) -> Value {
        Value::String(v.into())
    }

    #[test]
    fn sha1_is_of_the_body() {
        assert_eq!(DEDUCT.sha1.len(), 40);
        assert_ne!(DEDUCT.sha1, ROLLBACK.sha1);
        assert_eq!(DEDUCT.sha1, fred::util::sha1_hash(DEDUCT.body));
    }

    #[test]
    fn decodes_a_line() {
        let reply = Value::Array(vec![
            s("accepted"),
            s(""),
            Value::Integer(0),
            Value::Integer(30),
            Value::Integer(1),
            Value::Integer(70),
            Value::Integer(-1),
        ]);
        let line = decode_line(&DEDUCT, "accepted", reply).unwrap();
        assert_eq!(line.status, Ok(()));
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
            Value::Integer(1),
            Value::Integer(0),
            Value::Integer(0),
            Value::Integer(-1),
            Value::Integer(-1),
        ]);
        let line = decode_line(&DEDUCT, "accepted", reply).unwrap();
        assert_eq!(line.status, Err(Reason::BudgetExceeded));
        assert!(line.duplicate);
    }

    #[test]
    fn malformed_lines_are_errors() {
        let good = vec![
            s("applied"),
            s(""),
            Value::Integer(0),
            Value::Integer(3),
            Value::Integer(1),
            Value::Integer(7),
            Value::Integer(-1),
        ];
        assert!(decode_line(&ROLLBACK, "applied", Value::Array(good.clone())).is_ok());
        let mut cases = Vec::new();
        for (i, v) in [
            (0, s("accepted")),
            (1, s("budget_exceeded")),
            (2, Value::Integer(2)),
            (3, Value::Integer(-1)),
            (5, Value::Integer(-2)),
            (6, s("7")),
        ] {
            let mut bad = good.clone();
            bad[i] = v;
            cases.push(Value::Array(bad));
        }
        cases.push(Value::Array(good[..6].to_vec()));
        cases.push(s("applied"));
        for case in cases {
            let e = decode_line(&ROLLBACK, "applied", case.clone()).unwrap_err();
            assert_eq!(e.class(), ErrorClass::Reply, "{case:?}");
        }
        let mut unknown = good;
        unknown[0] = s("rejected");
        unknown[1] = s("no_such_reason");
        assert!(decode_line(&ROLLBACK, "applied", Value::Array(unknown)).is_err());
    }

    #[test]
    fn decodes_release_and_memo() {
        assert!(decode_release(Value::Array(vec![Value::Integer(1)])).unwrap());
        assert!(!decode_release(Value::Array(vec![Value::Integer(0)])).unwrap());
        assert!(decode_release(Value::Integer(1)).is_err());
        assert_eq!(decode_memo(s("")).unwrap(), None);
        assert_eq!(
            decode_memo(s("order_reverted")).unwrap(),
            Some(Reason::OrderReverted)
        );
        assert!(decode_memo(s("nope")).is_err());
        assert!(decode_memo(Value::Null).is_err());
    }
}
