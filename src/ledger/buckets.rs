//! The service's side of the bucket protocol (docs/buckets.md, issue 28):
//! each `Op` a walk of `domain::buckets` asks for, as one call of
//! lua/bucket.lua on its bucket's hash `promo:{P~k}`, and the reply parsed
//! back (`drive`). The differential test (tests/it/ledger/buckets/scripts.rs)
//! replays the model's calls through this same encoding.
//!
//! The service's lines of bucketed promotions ([`super::bucketed`]) run
//! through [`drive`].

use std::time::Duration;

use fred::prelude::{Client, ClientInterface, ClientLike, ClusterInterface, Value};
use fred::util::redis_keyslot;

use super::durability::confirm;
use super::error::LedgerError;
use super::scripts::{bucket, eval};
use crate::domain::buckets::{
    bucket_suffixes, BucketId, Credit, Dim, Gather, Op, Placed, Refund, Reply, Report, Step, Units,
    Walk,
};
use crate::domain::event::Id;

/// An id as the script's arguments and replies carry it.
pub trait BucketArg: BucketId + Sized {
    fn to_arg(&self) -> String;
    fn from_arg(s: &str) -> Option<Self>;
}

impl BucketArg for Id {
    fn to_arg(&self) -> String {
        self.as_str().to_owned()
    }

    fn from_arg(s: &str) -> Option<Id> {
        Id::parse(s).ok()
    }
}

/// The model's ids (tests/it/ledger/buckets), zero-padded so that the
/// script, which orders ids as strings (a gift's seniority), orders them as
/// the model does, by number.
impl BucketArg for u32 {
    fn to_arg(&self) -> String {
        format!("e{self:010}")
    }

    fn from_arg(s: &str) -> Option<u32> {
        let digits = s.strip_prefix('e')?;
        (digits.len() == 10).then_some(())?;
        digits.parse().ok()
    }
}

fn n(x: impl ToString) -> String {
    x.to_string()
}

/// A dimension as the script names it (the short reason).
pub fn dim(d: Dim) -> &'static str {
    match d {
        Dim::Budget => "budget_exceeded",
        Dim::Stock => "stock_insufficient",
    }
}

fn triples(xs: &[(usize, Units)]) -> String {
    xs.iter()
        .map(|(m, u)| format!("{m}:{}:{}", u.budget, u.stock))
        .collect::<Vec<_>>()
        .join(";")
}

fn credits(cs: &[Credit]) -> String {
    cs.iter()
        .map(|c| {
            format!(
                "{}:{}:{}:{}",
                c.from, c.attempt, c.units.budget, c.units.stock
            )
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// The operation's name and arguments (ARGV[1] and ARGV[3..]).
pub fn op_args<I: BucketArg>(op: &Op<I>) -> (&'static str, Vec<String>) {
    let u = |x: &Units| [n(x.budget), n(x.stock)];
    match op {
        Op::Start {
            ev,
            cust,
            units,
            at,
        } => {
            let [b, s] = u(units);
            ("Start", vec![ev.to_arg(), cust.to_arg(), b, s, n(at)])
        }
        Op::Peek { ev } => ("Peek", vec![ev.to_arg()]),
        Op::Reject {
            ev,
            a,
            incr,
            notify,
            dim: d,
            saw_corrupt,
            seen,
        } => (
            "Reject",
            vec![
                ev.to_arg(),
                n(a),
                n(incr),
                n(notify),
                dim(*d).into(),
                n(u8::from(*saw_corrupt)),
                triples(seen),
            ],
        ),
        Op::Give {
            ev,
            a,
            want,
            receiver,
        } => {
            let [b, s] = u(want);
            ("Give", vec![ev.to_arg(), n(a), b, s, n(receiver)])
        }
        Op::Accept {
            ev,
            cust,
            units,
            a,
            mine,
        } => {
            let [b, s] = u(units);
            (
                "Accept",
                vec![ev.to_arg(), cust.to_arg(), b, s, n(a), triples(mine)],
            )
        }
        Op::Yield { ev, a } => ("Yield", vec![ev.to_arg(), n(a)]),
        Op::ReturnAll { ev, upto } => ("ReturnAll", vec![ev.to_arg(), n(upto)]),
        Op::Reserve { order, cust } => ("Reserve", vec![order.to_arg(), cust.to_arg()]),
        Op::Settle { ev } => ("Settle", vec![ev.to_arg()]),
        Op::Undo { ev } => ("Undo", vec![ev.to_arg()]),
        Op::Unreserve { order } => ("Unreserve", vec![order.to_arg()]),
        Op::Cleanup { ev, credited } => ("Cleanup", vec![ev.to_arg(), credits(credited)]),
        Op::RefundLook { ev, order } => ("RefundLook", vec![ev.to_arg(), order.to_arg()]),
        Op::Notify { to, units } => {
            let [b, s] = u(units);
            ("Notify", vec![n(to), b, s])
        }
        Op::RefundRevert { ev, order } => ("RefundRevert", vec![ev.to_arg(), order.to_arg()]),
        Op::ReleaseLook { ev } => ("ReleaseLook", vec![ev.to_arg()]),
        Op::ReleaseRevert { ev } => ("ReleaseRevert", vec![ev.to_arg()]),
        Op::Memo { ev } => ("Memo", vec![ev.to_arg()]),
        Op::TransferMark { id } => ("TransferMark", vec![id.to_arg()]),
        Op::TransferTake { id, n: x, to } => {
            let [b, s] = u(x);
            ("TransferTake", vec![id.to_arg(), b, s, n(to)])
        }
        Op::TransferCredit { id, from, took } => {
            let [b, s] = u(took);
            ("TransferCredit", vec![id.to_arg(), n(from), b, s])
        }
        Op::TransferSettle { id, credited } => {
            let [b, s] = u(credited);
            ("TransferSettle", vec![id.to_arg(), b, s])
        }
        Op::AdjustMark { id } => ("AdjustMark", vec![id.to_arg()]),
        Op::AdjustCredit { id, share } => {
            let [b, s] = u(share);
            ("AdjustCredit", vec![id.to_arg(), b, s])
        }
        Op::AdjustRemove { id, share } => {
            let [b, s] = u(share);
            ("AdjustRemove", vec![id.to_arg(), b, s])
        }
        Op::OpenGifts => ("OpenGifts", vec![]),
        Op::EventState { id } => ("EventState", vec![id.to_arg()]),
        Op::GiveBack { id, a } => ("GiveBack", vec![id.to_arg(), n(a)]),
    }
}

fn strings(v: Value) -> Result<Vec<String>, String> {
    let Value::Array(items) = v else {
        return Err(format!("not an array: {v:?}"));
    };
    items
        .into_iter()
        .map(|x| match x {
            Value::String(s) => Ok(s.to_string()),
            Value::Bytes(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
            Value::Integer(i) => Ok(i.to_string()),
            other => Err(format!("element {other:?}")),
        })
        .collect()
}

fn int<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("not a number: {s:?}"))
}

fn units(b: &str, s: &str) -> Result<Units, String> {
    Ok(Units::new(int(b)?, int(s)?))
}

fn id_of<I: BucketArg>(s: &str) -> Result<I, String> {
    I::from_arg(s).ok_or(format!("not an id: {s:?}"))
}

/// A reason of lua/bucket.lua's replies and memos as a decision.
fn placed(reason: &str, u: Units) -> Result<Placed, String> {
    Ok(match reason {
        "accepted" => Placed::Accepted(u),
        "budget_exceeded" => Placed::Short(Dim::Budget),
        "stock_insufficient" => Placed::Short(Dim::Stock),
        "user_limit_reached" => Placed::Limit,
        "order_reverted" => Placed::Refunded,
        "corrupt_promotion" => Placed::Corrupt,
        "promotion_inactive" => Placed::Inactive,
        "released" => Placed::Released,
        other => return Err(format!("reason {other:?}")),
    })
}

fn dim_of(s: &str) -> Result<Dim, String> {
    match placed(s, Units::ZERO)? {
        Placed::Short(d) => Ok(d),
        other => Err(format!("not a dimension: {other:?}")),
    }
}

fn parse_credits(s: &str) -> Result<Vec<Credit>, String> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(';')
        .map(|c| {
            let p: Vec<&str> = c.split(':').collect();
            if p.len() != 4 {
                return Err(format!("credit {c:?}"));
            }
            Ok(Credit {
                from: int(p[0])?,
                attempt: int(p[1])?,
                units: units(p[2], p[3])?,
            })
        })
        .collect()
}

fn flag(s: &str) -> bool {
    s == "1"
}

/// lua/bucket.lua's reply as a `Reply`.
pub fn parse_reply<I: BucketArg>(v: Value) -> Result<Reply<I>, String> {
    let r = strings(v)?;
    let a = |i: usize| -> Result<&str, String> {
        r.get(i)
            .map(String::as_str)
            .ok_or(format!("reply {r:?}: no element {i}"))
    };
    Ok(match a(0)? {
        "ok" => Reply::Ok,
        "corrupt" => Reply::Corrupt,
        "decided" => Reply::Decided(placed(a(1)?, units(a(2)?, a(3)?)?)?, parse_credits(a(4)?)?),
        "tentative" => Reply::Tentative,
        "short" => Reply::Short {
            dim: dim_of(a(1)?)?,
            fast: flag(a(2)?),
        },
        "wait" => Reply::Wait,
        "restart" => Reply::Restart,
        "yield" => Reply::Yield,
        "gather" => Reply::Gather(Gather {
            a: int(a(1)?)?,
            incr: int(a(2)?)?,
            notify: int(a(3)?)?,
            avail: units(a(4)?, a(5)?)?,
            held: units(a(6)?, a(7)?)?,
            pending: flag(a(8)?),
            senior: flag(a(9)?),
            bounds: a(10)?
                .split(';')
                .map(|x| match x.split_once(',') {
                    None => Ok(None),
                    Some((b, s)) => units(b, s).map(Some),
                })
                .collect::<Result<_, _>>()?,
        }),
        "peeked" => Reply::Peeked {
            corrupt: flag(a(1)?),
            avail: units(a(2)?, a(3)?)?,
            held: units(a(4)?, a(5)?)?,
            holds: flag(a(6)?),
            pending: flag(a(7)?),
            senior: flag(a(8)?),
        },
        "gave" => Reply::Gave {
            total: units(a(1)?, a(2)?)?,
            senior: flag(a(3)?),
        },
        "reserved" => Reply::Reserved {
            ok: flag(a(1)?),
            refused_now: flag(a(2)?),
        },
        "refund" => Reply::Refund(match a(1)? {
            "no_deduction" => Refund::NoDeduction,
            "already_reverted" => Refund::AlreadyReverted,
            "corrupt" => Refund::Corrupt,
            other => return Err(format!("refund {other:?}")),
        }),
        "marked" => Reply::Marked(units(a(1)?, a(2)?)?),
        "release" => Reply::Release(id_of(a(1)?)?, units(a(2)?, a(3)?)?),
        "relook" => Reply::Relook,
        "nothing" => Reply::Nothing,
        "memo" => Reply::Memo(match a(1)? {
            "" => None,
            m => Some(placed(m, Units::ZERO)?),
        }),
        "amount" => Reply::Amount(units(a(1)?, a(2)?)?),
        "gifts" => {
            let mut g = r[1..]
                .iter()
                .map(|x| {
                    let p: Vec<&str> = x.split('#').collect();
                    if p.len() != 3 {
                        return Err(format!("gift {x:?}"));
                    }
                    Ok((id_of(p[0])?, int(p[1])?, int(p[2])?))
                })
                .collect::<Result<Vec<_>, String>>()?;
            g.sort();
            Reply::Gifts(g)
        }
        "event" => Reply::Event {
            credited: if flag(a(1)?) {
                Some(parse_credits(a(2)?)?)
            } else {
                None
            },
            attempt: match a(3)? {
                "" => None,
                x => Some(int(x)?),
            },
        },
        other => return Err(format!("reply kind {other:?}: {r:?}")),
    })
}

/// The suffixes of promotion `promo`'s K bucket tags on the Redis that
/// `client` talks to: on a Cluster, spread over its primaries by the slot
/// each tag hashes to (`domain::buckets::bucket_suffixes`); else 0..K-1.
pub fn choose_suffixes(client: &Client, promo: &str, k: usize) -> Vec<u32> {
    let Some(routing) = client.cached_cluster_state() else {
        return bucket_suffixes(promo, k, 1, |_| None);
    };
    let primaries = routing.unique_primary_nodes();
    bucket_suffixes(promo, k, primaries.len(), |tag| {
        let slot = redis_keyslot(format!("{{{tag}}}").as_bytes());
        let server = routing.get_server(slot)?;
        primaries.iter().position(|p| p == server)
    })
}

/// The durability gate between a walk's steps (`redis.wait_replicas`).
///
/// A walk's steps on different buckets stand on each other: a Give at
/// bucket A takes units out of A's free units, and the Accept at bucket B
/// records a deduction that consumes them. The event's gate
/// (`Ledger::durable`) waits only when the event is done, so a failover
/// of A's node that took back the Give would leave B's Accept standing on
/// units A has again: sold twice (found by the chaos suite's `--long`
/// Cluster reshard run). With the gate on, every call is followed by a
/// `WAIT` on its bucket's node, on the connection that made the call,
/// before the walk's next call: no step stands on a write a failover can
/// take back. A short count, or a connection that changed under the call,
/// is retryable (`NotDurable`): the event is retried and its every step
/// is idempotent by the event.
pub use super::durability::WaitPolicy as StepGate;

/// A bucketed promotion's buckets, as a driver calls them.
pub struct Buckets<'a> {
    pub client: &'a Client,
    /// Bucket k's hash key, `promo:{P~k}` (with the key prefix), by k.
    pub keys: Vec<String>,
    /// The TTL, in seconds, of every key a call writes but the bucket
    /// hashes and their sets.
    pub ttl_secs: u64,
    /// `Some`: each call waits for its writes to reach the replicas
    /// ([`StepGate`]); `None`: the gate is off.
    pub gate: Option<StepGate>,
}

impl Buckets<'_> {
    /// One call of lua/bucket.lua on bucket `j` (and, with the gate on,
    /// the `WAIT` that makes it durable before the walk goes on).
    pub async fn call<I: BucketArg>(&self, j: usize, op: &Op<I>) -> Result<Reply<I>, LedgerError> {
        let key = self
            .keys
            .get(j)
            .ok_or_else(|| LedgerError::malformed("bucket", format!("no bucket {j}")))?;
        let (name, rest) = op_args(op);
        let mut argv = Vec::with_capacity(rest.len() + 2);
        argv.push(name.to_owned());
        argv.push(self.ttl_secs.to_string());
        argv.extend(rest);
        let connections = self.gate.map(|_| self.client.connection_ids());
        let script = bucket(name).ok_or_else(|| {
            LedgerError::malformed("bucket", format!("lua/bucket.lua has no operation {name}"))
        })?;
        let v = eval(self.client, script, vec![key.clone()], argv)
            .await
            .map_err(|e| LedgerError::redis("bucket", e))?;
        if let (Some(gate), Some(connections)) = (self.gate, connections) {
            // On the node of the bucket's slot, for the writes just made.
            let slot = self
                .client
                .is_clustered()
                .then(|| redis_keyslot(key.as_bytes()));
            confirm(
                self.client,
                gate,
                &[slot],
                &connections,
                "a bucket step",
                key,
            )
            .await?;
        }
        parse_reply(v).map_err(|d| LedgerError::malformed("bucket", d))
    }
}

/// The longest pause between two tries of a delivery that backs off.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Runs `w` to its decision on Redis: every call it asks for, the
/// notifications of one step one after the other. A delivery that backs
/// off (units on their way) or meets corrupt counters where it must finish
/// what a decision started pauses between tries, 1 ms doubling to 1 s.
/// An error of Redis or of the script ends the walk: the caller retries
/// the event, and the walk's every step is idempotent by the event.
pub async fn drive<I: BucketArg, W: Walk<I>>(
    b: &Buckets<'_>,
    w: &mut W,
) -> Result<Report, LedgerError> {
    let mut replies = None;
    let mut pause = Duration::from_millis(1);
    loop {
        match w.walk(replies.take()) {
            Step::Report(Report::Running) => {
                if w.waiting() {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                }
            }
            // Decided short; the gifts it gathered are settled before the
            // walk ends (with the same decision).
            Step::Report(Report::Short { .. }) if w.cleaning() => {}
            Step::Report(r) => return Ok(r),
            Step::Call(calls) => {
                let mut got = Vec::with_capacity(calls.len());
                for (j, op) in &calls {
                    got.push(b.call(*j, op).await?);
                }
                if calls.len() == 1 && got.first() == Some(&Reply::Corrupt) {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                replies = Some(got);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each operation's ARGV as lua/bucket.lua's SIGNATURES reads it, and
    /// replies parsed back, for the service's ids.
    #[test]
    fn ops_encode_as_the_script_reads_them() {
        let o = Id::parse("o-1").unwrap();
        let c = Id::parse("c-9").unwrap();
        let (name, args) = op_args(&Op::Start {
            ev: o.clone(),
            cust: c.clone(),
            units: Units::new(100, 1),
            at: 1_800_000_000,
        });
        assert_eq!(name, "Start");
        assert_eq!(args, ["o-1", "c-9", "100", "1", "1800000000"]);
        let (name, args) = op_args(&Op::<Id>::Notify {
            to: 2,
            units: Units::new(3, 4),
        });
        assert_eq!(
            (name, args),
            ("Notify", vec!["2".into(), "3".into(), "4".into()])
        );
        let (name, args) = op_args(&Op::Cleanup {
            ev: o.clone(),
            credited: vec![Credit {
                from: 1,
                attempt: 2,
                units: Units::new(5, 6),
            }],
        });
        assert_eq!(
            (name, args),
            ("Cleanup", vec!["o-1".into(), "1:2:5:6".into()])
        );
        let reply = Value::Array(vec![
            Value::from("decided"),
            Value::from("promotion_inactive"),
            Value::from("0"),
            Value::from("0"),
            Value::from(""),
        ]);
        assert_eq!(
            parse_reply::<Id>(reply),
            Ok(Reply::Decided(Placed::Inactive, vec![]))
        );
        let reply = Value::Array(vec![
            Value::from("release"),
            Value::from("c-9"),
            Value::from("7"),
            Value::from("1"),
        ]);
        assert_eq!(
            parse_reply::<Id>(reply),
            Ok(Reply::Release(c, Units::new(7, 1)))
        );
        assert!(parse_reply::<Id>(Value::Array(vec![Value::from("nonsense")])).is_err());
    }
}
