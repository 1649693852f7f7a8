//! Script-level fuzzing against the real Redis: the four ledger scripts are
//! called with random (often malformed) arguments on keys holding random
//! (often corrupt) values: `nan`, `inf`, `0x10`, `1e3`, ` 5 `, `-0`,
//! `9007199254740993`, huge strings, keys of the wrong type. Lua's
//! `tonumber` accepts most of those and `nan` passes every comparison, so
//! each call is held to a reference model of CONTRACT.md sections 2 and 3:
//!
//! - when an argument is malformed the reply is `BADARG`, when a value read
//!   is not what section 2 allows it is `CORRUPT`, and either way the keys
//!   are exactly as before (a dump of every key under the test's prefix);
//! - otherwise the reply is the model's decision (including the project's
//!   changes to deduct steps 0-2 and to the release of a rejected event's
//!   lines in docs/contract.md) and the keys afterwards
//!   are exactly the model's (values and whether a TTL is set).
//!
//! Any other error (a Lua runtime error) is a crash of the script: a failure.
//! `SCRIPT_FUZZ_CASES` sets the number of calls (default 2000); the seed is
//! printed and `SCRIPT_FUZZ_SEED` replays a run.

use std::collections::BTreeMap;

use crate::common::redis::{self, Dumped, DumpedValue, TestRedis};
use deductor::domain::event::Id;
use deductor::ledger::scripts::{DEDUCT, MEMO, RELEASE, ROLLBACK};
use fred::prelude::Value;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Dump = BTreeMap<String, Dumped>;

/// Values that look numeric to Lua (or to a human) but are not canonical.
const WEIRD: &[&str] = &[
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "0x10",
    "1e3",
    "1E3",
    " 5 ",
    "5 ",
    " 5",
    "-0",
    "-3",
    "+1",
    "007",
    "1.5",
    "1.0",
    "9007199254740993",
    "1000000000000000",
    "",
    "abc",
    "\0",
    "5\n",
    "１",
    "deducted ",
    "DEDUCTED",
    "applied",
    "applied 1",
    "applied -1 2",
    "applied 1 2 3",
    "rejected",
    "rejected nope",
    "budget_exceeded ",
    "active ",
];

/// Canonical values, including the 15-digit edge.
const GOOD: &[&str] = &["0", "1", "2", "5", "10", "100", "4000", "999999999999999"];

const REASONS: &[&str] = &[
    "budget_exceeded",
    "stock_insufficient",
    "user_limit_reached",
    "promotion_not_found",
    "promotion_inactive",
    "order_reverted",
    "corrupt_promotion",
];
const REFUND_REASONS: &[&str] = &[
    "no_deduction",
    "already_reverted",
    "exceeds_deducted",
    "corrupt_promotion",
];

fn canonical(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'))
}

fn signed(s: &str) -> bool {
    match s.strip_prefix('-') {
        Some(m) => m != "0" && canonical(m),
        None => canonical(s),
    }
}

fn valid_event(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

fn num(s: &str) -> i64 {
    s.parse().expect("canonical")
}

// ---------------------------------------------------------------- the model

#[derive(Debug, Clone, PartialEq)]
enum Expect {
    /// An error reply with this code and no write.
    Error(&'static str),
    /// An error reply with this code, and the keys afterwards (deduct.lua
    /// remembers corrupt data under the event's memo).
    ErrorWrote(&'static str, Dump),
    /// This reply, and the keys afterwards.
    Reply(Vec<Reply>, Dump),
    /// memo.lua's string reply.
    Text(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Reply {
    S(String),
    I(i64),
}

fn s(v: &str) -> Reply {
    Reply::S(v.to_owned())
}

/// A key as the scripts read it.
enum Read<'a> {
    Absent,
    Hash(&'a BTreeMap<String, String>),
    Str(&'a str),
    WrongType,
}

fn read<'a>(d: &'a Dump, key: &str, want_hash: bool) -> Read<'a> {
    match d.get(key).map(|k| &k.value) {
        None => Read::Absent,
        Some(DumpedValue::Hash(h)) if want_hash => Read::Hash(h),
        Some(DumpedValue::String(v)) if !want_hash => Read::Str(v),
        Some(_) => Read::WrongType,
    }
}

struct Promo {
    budget: Option<i64>,
    stock: Option<i64>,
    per_customer: Option<i64>,
    starts_at: Option<i64>,
    ends_at: Option<i64>,
    initial_budget: Option<i64>,
    initial_stock: Option<i64>,
    paused: bool,
    gen: Option<String>,
}

/// The largest canonical value.
const MAX_AMOUNT: i64 = 999_999_999_999_999;

/// `Err(())` = corrupt.
fn promo(d: &Dump, key: &str) -> Result<Option<Promo>, ()> {
    let h = match read(d, key, true) {
        Read::Absent => return Ok(None),
        Read::Hash(h) => h,
        _ => return Err(()),
    };
    let field = |f: &str| -> Result<Option<i64>, ()> {
        match h.get(f) {
            None => Ok(None),
            Some(v) if canonical(v) => Ok(Some(num(v))),
            Some(_) => Err(()),
        }
    };
    let paused = match h.get("status").map(String::as_str) {
        None | Some("active") => false,
        Some("paused") => true,
        Some(_) => return Err(()),
    };
    let gen = h.get("gen").cloned();
    if gen.as_deref().is_some_and(|g| !canonical(g)) {
        return Err(());
    }
    Ok(Some(Promo {
        budget: field("budget")?,
        stock: field("stock")?,
        per_customer: field("per_customer")?,
        starts_at: field("starts_at")?,
        ends_at: field("ends_at")?,
        initial_budget: field("initial_budget")?,
        initial_stock: field("initial_stock")?,
        paused,
        gen,
    }))
}

fn used(d: &Dump, key: &str) -> Result<Option<i64>, ()> {
    match read(d, key, false) {
        Read::Absent => Ok(None),
        Read::Str(v) if canonical(v) => Ok(Some(num(v))),
        _ => Err(()),
    }
}

#[derive(Clone)]
struct Record {
    deducted: bool,
    event: Option<String>,
    budget: i64,
    stock: i64,
    budget0: i64,
    stock0: i64,
    customer: Option<String>,
    /// `None`: a record older than the field.
    counted: Option<bool>,
    gen: Option<String>,
    absorbed: Option<String>,
    fields: BTreeMap<String, String>,
}

fn record(d: &Dump, key: &str) -> Result<Option<Record>, ()> {
    let h = match read(d, key, true) {
        Read::Absent => return Ok(None),
        Read::Hash(h) => h,
        _ => return Err(()),
    };
    let deducted = match h.get("state").map(String::as_str) {
        Some("deducted") => true,
        Some("reverted") => false,
        _ => return Err(()),
    };
    let mut n = [0i64; 4];
    for (i, f) in ["budget", "stock", "budget0", "stock0"].iter().enumerate() {
        match h.get(*f) {
            Some(v) if canonical(v) => n[i] = num(v),
            _ => return Err(()),
        }
    }
    if n[0] > n[2] || n[1] > n[3] {
        return Err(());
    }
    let event = h.get("event").cloned();
    if deducted && event.as_deref().is_none_or(str::is_empty) {
        return Err(());
    }
    let id_field = |f: &str| -> Result<Option<String>, ()> {
        match h.get(f) {
            None => Ok(None),
            Some(v) if valid_event(v) => Ok(Some(v.clone())),
            Some(_) => Err(()),
        }
    };
    let counted = match h.get("counted").map(String::as_str) {
        None => None,
        Some("0") => Some(false),
        Some("1") => Some(true),
        Some(_) => return Err(()),
    };
    let gen = h.get("gen").cloned();
    if gen.as_deref().is_some_and(|g| !canonical(g)) {
        return Err(());
    }
    Ok(Some(Record {
        deducted,
        event,
        budget: n[0],
        stock: n[1],
        budget0: n[2],
        stock0: n[3],
        customer: id_field("customer")?,
        counted,
        gen,
        absorbed: id_field("absorbed")?,
        fields: h.clone(),
    }))
}

/// Writes into the model's dump, with Redis's TTL rules: HSET, HINCRBY,
/// INCR and DECR keep a key's TTL; SET .. EX and EXPIRE set one.
struct Writer(Dump);

impl Writer {
    fn hash(&mut self, key: &str) -> &mut BTreeMap<String, String> {
        let k = self.0.entry(key.to_owned()).or_insert(Dumped {
            value: DumpedValue::Hash(BTreeMap::new()),
            expires: false,
        });
        match &mut k.value {
            DumpedValue::Hash(h) => h,
            _ => unreachable!("model writes a hash over another type"),
        }
    }
    fn hset(&mut self, key: &str, pairs: &[(&str, String)]) {
        let h = self.hash(key);
        for (f, v) in pairs {
            h.insert((*f).to_owned(), v.clone());
        }
    }
    /// HDEL; Redis removes a hash left empty.
    fn hdel(&mut self, key: &str, f: &str) {
        let h = self.hash(key);
        h.remove(f);
        if h.is_empty() {
            self.0.remove(key);
        }
    }
    fn hincrby(&mut self, key: &str, f: &str, by: i64) -> i64 {
        let h = self.hash(key);
        let v = h.get(f).map_or(0, |x| num(x)) + by;
        h.insert(f.to_owned(), v.to_string());
        v
    }
    fn set_ex(&mut self, key: &str, v: &str) {
        self.0.insert(
            key.to_owned(),
            Dumped {
                value: DumpedValue::String(v.to_owned()),
                expires: true,
            },
        );
    }
    fn incr(&mut self, key: &str, by: i64) {
        let k = self.0.entry(key.to_owned()).or_insert(Dumped {
            value: DumpedValue::String("0".into()),
            expires: false,
        });
        if let DumpedValue::String(v) = &mut k.value {
            *v = (num(v) + by).to_string();
        }
    }
    fn expire(&mut self, key: &str) {
        if let Some(k) = self.0.get_mut(key) {
            k.expires = true;
        }
    }
}

/// What the promotion has left, as the scripts reply it (-1 = unlimited or none).
fn left(p: &Option<Promo>) -> (i64, i64) {
    match p {
        Some(p) => (p.budget.unwrap_or(-1), p.stock.unwrap_or(-1)),
        None => (-1, -1),
    }
}

/// The 7-item reply of deduct.lua / rollback.lua.
fn reply(st_: &str, reason: &str, dup: i64, rb: i64, rs: i64, l: (i64, i64)) -> Vec<Reply> {
    vec![
        s(st_),
        s(reason),
        Reply::I(dup),
        Reply::I(rb),
        Reply::I(rs),
        Reply::I(l.0),
        Reply::I(l.1),
    ]
}

/// A refund of what was taken from this incarnation (`gen`) of the
/// promotion: added back, never past `initial_*` nor the 15-digit bound.
/// Returns what the promotion has left afterwards.
fn credit(w: &mut Writer, kp: &str, p: &Option<Promo>, r: &Record, b: i64, st: i64) -> (i64, i64) {
    let mut l = left(p);
    let Some(pr) = p else { return l };
    if pr.gen != r.gen {
        return l;
    }
    for (field, rem, init, amount, out) in [
        ("budget", pr.budget, pr.initial_budget, b, &mut l.0),
        ("stock", pr.stock, pr.initial_stock, st, &mut l.1),
    ] {
        let Some(rem) = rem else { continue };
        if amount == 0 {
            continue;
        }
        let cap = init.unwrap_or(MAX_AMOUNT).min(MAX_AMOUNT);
        let room = cap - rem;
        if room > 0 {
            *out = w.hincrby(kp, field, amount.min(room));
        }
    }
    l
}

fn placement_memo(d: &Dump, km: &str) -> Result<Option<String>, ()> {
    match read(d, km, false) {
        Read::Absent => Ok(None),
        Read::Str(v) if REASONS.contains(&v) || v == "accepted" || v == "released" => {
            Ok(Some(v.to_owned()))
        }
        _ => Err(()),
    }
}

fn deduct(d: &Dump, keys: &[String], args: &[String]) -> Expect {
    if keys.len() != 4 || args.len() != 7 {
        return Expect::Error("BADARG");
    }
    let ok_args = canonical(&args[0])
        && canonical(&args[1])
        && signed(&args[2])
        && valid_event(&args[3])
        && canonical(&args[4])
        && args[4] != "0"
        && canonical(&args[5])
        && args[5] != "0"
        && valid_event(&args[6]);
    if !ok_args {
        return Expect::Error("BADARG");
    }
    let (b, st, t, ev) = (
        num(&args[0]),
        num(&args[1]),
        num(&args[2]),
        args[3].as_str(),
    );
    let (kp, ku, kr, km) = (&keys[0], &keys[1], &keys[2], &keys[3]);
    // Step 0: a rejection reason, `accepted` (step 1 absorbed the event) or
    // `released` (the line was released for a rejection on another line),
    // answered whatever the other keys hold.
    let Ok(memo) = placement_memo(d, km) else {
        return Expect::Error("CORRUPT");
    };
    let mut w = Writer(d.clone());
    match memo.as_deref() {
        Some("released") => {
            return Expect::Reply(reply("rejected", "released", 1, 0, 0, (-1, -1)), w.0)
        }
        Some("accepted") => {
            // Corrupt data never turns the acceptance into a rejection.
            let rec = record(d, kr).ok().flatten();
            let p = promo(d, kp).ok().flatten();
            let (b0, s0) = rec.as_ref().map_or((0, 0), |r| (r.budget0, r.stock0));
            return Expect::Reply(reply("accepted", "", 1, b0, s0, left(&p)), w.0);
        }
        Some(m) => return Expect::Reply(reply("rejected", m, 1, 0, 0, (-1, -1)), w.0),
        None => {}
    }
    // Corrupt data is a decision too: remembered under the memo.
    let remembered = |mut w: Writer| {
        w.set_ex(km, "corrupt_promotion");
        Expect::ErrorWrote("CORRUPT", w.0)
    };
    let Ok(rec) = record(d, kr) else {
        return remembered(w);
    };
    // The record decides before the promotion is read.
    if let Some(r) = &rec {
        if r.deducted || r.event.as_deref() == Some(ev) {
            if r.event.as_deref() != Some(ev) {
                // Absorbed into another event's record: remembered, and the
                // first absorbed event noted in the record.
                w.set_ex(km, "accepted");
                if r.deducted && r.absorbed.is_none() {
                    w.hset(kr, &[("absorbed", ev.into())]);
                }
            }
            let p = promo(d, kp).ok().flatten();
            return Expect::Reply(reply("accepted", "", 1, r.budget0, r.stock0, left(&p)), w.0);
        }
    }
    let (Ok(p), Ok(u)) = (promo(d, kp), used(d, ku)) else {
        return remembered(w);
    };
    let u = u.unwrap_or(0);
    let reject = |w: &mut Writer, reason: &str| {
        w.set_ex(km, reason);
        reply("rejected", reason, 0, 0, 0, left(&p))
    };
    if rec.is_some() {
        let rep = reject(&mut w, "order_reverted");
        return Expect::Reply(rep, w.0);
    }
    let Some(pr) = &p else {
        let rep = reject(&mut w, "promotion_not_found");
        return Expect::Reply(rep, w.0);
    };
    let inactive =
        pr.paused || pr.starts_at.is_some_and(|x| t < x) || pr.ends_at.is_some_and(|x| t >= x);
    let reason = if inactive {
        Some("promotion_inactive")
    } else if pr.budget.is_some_and(|x| x < b) {
        Some("budget_exceeded")
    } else if pr.stock.is_some_and(|x| x < st) {
        Some("stock_insufficient")
    } else if pr.per_customer.is_some_and(|x| u >= x) {
        Some("user_limit_reached")
    } else {
        None
    };
    if let Some(r) = reason {
        let rep = reject(&mut w, r);
        return Expect::Reply(rep, w.0);
    }
    let mut l = left(&p);
    if pr.budget.is_some() {
        l.0 = w.hincrby(kp, "budget", -b);
    }
    if pr.stock.is_some() {
        l.1 = w.hincrby(kp, "stock", -st);
    }
    if pr.per_customer.is_some() {
        w.incr(ku, 1);
        w.expire(ku);
    }
    let counted = if pr.per_customer.is_some() { "1" } else { "0" };
    w.hset(
        kr,
        &[
            ("state", "deducted".into()),
            ("event", ev.into()),
            ("budget", args[0].clone()),
            ("stock", args[1].clone()),
            ("budget0", args[0].clone()),
            ("stock0", args[1].clone()),
            ("customer", args[6].clone()),
            ("counted", counted.into()),
        ],
    );
    if let Some(g) = &pr.gen {
        w.hset(kr, &[("gen", g.clone())]);
    }
    w.expire(kr);
    Expect::Reply(reply("accepted", "", 0, b, st, l), w.0)
}

/// A stored refund result: (status, reason, budget, stock), or corrupt.
fn refund_result(v: &str) -> Result<(String, String, i64, i64), ()> {
    let parts: Vec<&str> = v.split(' ').collect();
    match parts.as_slice() {
        ["applied", b, st] if canonical(b) && canonical(st) => {
            Ok(("applied".into(), String::new(), num(b), num(st)))
        }
        ["rejected", r] if REFUND_REASONS.contains(r) => Ok(("rejected".into(), (*r).into(), 0, 0)),
        _ => Err(()),
    }
}

fn rollback(d: &Dump, keys: &[String], args: &[String]) -> Expect {
    if keys.len() != 4 || args.len() != 6 {
        return Expect::Error("BADARG");
    }
    let amount = |v: &str| v.is_empty() || canonical(v);
    let ttl = |v: &str| canonical(v) && v != "0";
    if !(amount(&args[0])
        && amount(&args[1])
        && ttl(&args[2])
        && ttl(&args[3])
        && valid_event(&args[4])
        && valid_event(&args[5]))
    {
        return Expect::Error("BADARG");
    }
    let (ev, customer) = (args[4].as_str(), args[5].as_str());
    let field = format!("refund:{ev}");
    let (kp, ku, kr, km) = (&keys[0], &keys[1], &keys[2], &keys[3]);
    // Step 1: the memo key (a corrupt_promotion rejection, or an older
    // version's result), answered whatever the other keys hold.
    match read(d, km, false) {
        Read::Absent => {}
        Read::Str(v) => match refund_result(v) {
            Ok((st_, r, b, st)) => {
                return Expect::Reply(reply(&st_, &r, 1, b, st, (-1, -1)), d.clone())
            }
            Err(()) => return Expect::Error("CORRUPT"),
        },
        _ => return Expect::Error("CORRUPT"),
    }
    let mut w = Writer(d.clone());
    // Corrupt data from here on is remembered under the memo key.
    let remembered = |mut w: Writer| {
        w.set_ex(km, "rejected corrupt_promotion");
        Expect::ErrorWrote("CORRUPT", w.0)
    };
    let Ok(rec) = record(d, kr) else {
        return remembered(w);
    };
    let stored = match rec.as_ref().and_then(|r| r.fields.get(&field)) {
        None => None,
        Some(v) => match refund_result(v) {
            Ok(r) => Some(r),
            Err(()) => return remembered(w),
        },
    };
    if let Some((st_, r, b, st)) = stored {
        let p = promo(d, kp).ok().flatten();
        return Expect::Reply(reply(&st_, &r, 1, b, st, left(&p)), w.0);
    }
    let (Ok(p), Ok(u)) = (promo(d, kp), used(d, ku)) else {
        return remembered(w);
    };
    let before = left(&p);
    let reject = |w: &mut Writer, reason: &str| {
        w.hset(kr, &[(field.as_str(), format!("rejected {reason}"))]);
        reply("rejected", reason, 0, 0, 0, before)
    };
    let Some(r) = rec else {
        let zero = || "0".to_owned();
        w.hset(
            kr,
            &[
                ("state", "reverted".into()),
                ("budget", zero()),
                ("stock", zero()),
                ("budget0", zero()),
                ("stock0", zero()),
            ],
        );
        w.expire(kr);
        let rep = reject(&mut w, "no_deduction");
        return Expect::Reply(rep, w.0);
    };
    if !r.deducted {
        let rep = reject(&mut w, "already_reverted");
        return Expect::Reply(rep, w.0);
    }
    if let Some(c) = r.customer.as_deref().filter(|c| *c != customer) {
        // Another customer's deduction: named, nothing written.
        return Expect::Reply(reply("customer", c, 0, 0, 0, before), w.0);
    }
    let b = if args[0].is_empty() {
        r.budget
    } else {
        num(&args[0])
    };
    let st = if args[1].is_empty() {
        r.stock
    } else {
        num(&args[1])
    };
    if b > r.budget || st > r.stock {
        let rep = reject(&mut w, "exceeds_deducted");
        return Expect::Reply(rep, w.0);
    }
    let l = credit(&mut w, kp, &p, &r, b, st);
    let (lb, ls) = (r.budget - b, r.stock - st);
    w.hset(
        kr,
        &[
            ("budget", lb.to_string()),
            ("stock", ls.to_string()),
            (field.as_str(), format!("applied {b} {st}")),
        ],
    );
    if lb == 0 && ls == 0 {
        w.hset(kr, &[("state", "reverted".into())]);
        if r.counted != Some(false) && u.is_some_and(|x| x > 0) {
            w.incr(ku, -1);
        }
    }
    Expect::Reply(reply("applied", "", 0, b, st, l), w.0)
}

/// Releases what event E deducted on this line and marks the line's memo
/// `released` where it is absent or `accepted`; hands the record over to an
/// absorbed event instead of giving it back.
fn release(d: &Dump, keys: &[String], args: &[String]) -> Expect {
    if keys.len() != 4 || args.len() != 3 {
        return Expect::Error("BADARG");
    }
    if !(valid_event(&args[0]) && canonical(&args[1]) && args[1] != "0" && valid_event(&args[2])) {
        return Expect::Error("BADARG");
    }
    let (ev, customer) = (args[0].as_str(), args[2].as_str());
    let (kp, ku, kr, km) = (&keys[0], &keys[1], &keys[2], &keys[3]);
    let (Ok(p), Ok(u), Ok(rec), Ok(memo)) = (
        promo(d, kp),
        used(d, ku),
        record(d, kr),
        placement_memo(d, km),
    ) else {
        return Expect::Error("CORRUPT");
    };
    let mut w = Writer(d.clone());
    let mut released = 0;
    if let Some(r) = &rec {
        if r.absorbed.as_deref() == Some(ev) {
            w.hdel(kr, "absorbed");
        }
        if r.deducted && r.event.as_deref() == Some(ev) {
            if let Some(a) = &r.absorbed {
                w.hset(kr, &[("event", a.clone())]);
                w.hdel(kr, "absorbed");
            } else {
                credit(&mut w, kp, &p, r, r.budget, r.stock);
                let mine = r.customer.as_deref().is_none_or(|c| c == customer);
                if mine && r.counted != Some(false) && u.is_some_and(|x| x > 0) {
                    w.incr(ku, -1);
                }
                if r.fields.keys().any(|f| f.starts_with("refund:")) {
                    w.hset(
                        kr,
                        &[
                            ("state", "reverted".into()),
                            ("budget", "0".into()),
                            ("stock", "0".into()),
                        ],
                    );
                    w.hdel(kr, "event");
                } else {
                    w.0.remove(kr);
                }
                released = 1;
            }
        }
    }
    if memo.as_deref().is_none_or(|m| m == "accepted") {
        w.set_ex(km, "released");
    }
    Expect::Reply(vec![Reply::I(released)], w.0)
}

fn memo(d: &Dump, keys: &[String], args: &[String]) -> Expect {
    if keys.len() != 1 || !args.is_empty() {
        return Expect::Error("BADARG");
    }
    match read(d, &keys[0], false) {
        Read::Absent => Expect::Text(String::new()),
        Read::Str("accepted" | "released") => Expect::Text(String::new()),
        Read::Str(v) if REASONS.contains(&v) => Expect::Text(v.to_owned()),
        _ => Expect::Error("CORRUPT"),
    }
}

// ---------------------------------------------------------------- the fuzzer

struct Fuzz {
    rng: StdRng,
    r: TestRedis,
}

impl Fuzz {
    fn pick<'a>(&mut self, xs: &'a [&'a str]) -> &'a str {
        xs[self.rng.random_range(0..xs.len())]
    }

    fn huge(&mut self) -> String {
        let n = self.rng.random_range(1_000..200_000);
        if self.rng.random_bool(0.5) {
            "9".repeat(n)
        } else {
            "x".repeat(n)
        }
    }

    /// A stored value: mostly plausible, often not.
    fn value(&mut self, plausible: &[&str]) -> String {
        match self.rng.random_range(0..10) {
            0..=3 => self.pick(plausible).to_owned(),
            4..=5 => self.pick(GOOD).to_owned(),
            6..=8 => self.pick(WEIRD).to_owned(),
            _ => self.huge(),
        }
    }

    /// A malformed argument.
    fn bad_arg(&mut self) -> String {
        match self.rng.random_range(0..10) {
            0..=6 => self.pick(WEIRD).to_owned(),
            7..=8 => self
                .pick(&[
                    "e:1",
                    "{e}",
                    "e 1",
                    "a-very-long-event-id-that-is-longer-than-sixty-four-characters-xx",
                ])
                .to_owned(),
            _ => self.huge(),
        }
    }

    /// Arguments: all valid three times in four, else one or two malformed.
    fn args(&mut self, valid: Vec<String>) -> Vec<String> {
        let mut a = valid;
        if self.rng.random_ratio(1, 4) && !a.is_empty() {
            for _ in 0..self.rng.random_range(1..=2) {
                let i = self.rng.random_range(0..a.len());
                a[i] = self.bad_arg();
            }
        }
        a
    }

    /// HSET that first replaces a key of another type.
    async fn hset(&self, key: &str, pairs: &[(&str, &str)]) {
        let mut args = Vec::new();
        for (f, v) in pairs {
            args.push((*f).to_owned());
            args.push((*v).to_owned());
        }
        let body =
            "if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then redis.call('DEL', KEYS[1]) end \
                    return redis.call('HSET', KEYS[1], unpack(ARGV))";
        self.r
            .eval(body, vec![key.to_owned()], args)
            .await
            .expect("hset");
    }

    /// Turns `key` into something of the wrong type (or an empty one).
    async fn wrong_type(&mut self, key: &str) {
        let body = match self.rng.random_range(0..4) {
            0 => "redis.call('DEL', KEYS[1]); return redis.call('RPUSH', KEYS[1], 'x')",
            1 => "redis.call('DEL', KEYS[1]); return redis.call('SADD', KEYS[1], 'x')",
            2 => "redis.call('DEL', KEYS[1]); return redis.call('ZADD', KEYS[1], 1, 'x')",
            _ => "redis.call('DEL', KEYS[1]); return redis.call('SET', KEYS[1], 'x')",
        };
        self.r
            .eval(body, vec![key.to_owned()], vec![])
            .await
            .expect("write");
    }

    async fn wrong_kind(&mut self, key: &str, want_hash: bool) {
        if want_hash || self.rng.random_bool(0.7) {
            self.wrong_type(key).await;
        } else {
            self.r.del(key).await;
            self.hset(key, &[("a", "1")]).await;
        }
    }

    /// Disturbs the stored state of the keys one script call will touch.
    async fn disturb(&mut self, promo: &str, used: &str, rec: &str, memo: &str, refund_memo: bool) {
        // Start over now and then, so that decisions are reached, not only
        // corrupt data left by earlier calls.
        if self.rng.random_bool(0.4) {
            for k in [used, rec, memo] {
                self.r.del(k).await;
            }
        }
        if self.rng.random_bool(0.35) {
            // A sane promotion, to get decisions too.
            self.r.del(promo).await;
            let mut fields = vec![(
                "status",
                self.pick(&["active", "active", "paused"]).to_owned(),
            )];
            for f in ["budget", "stock", "per_customer"] {
                if self.rng.random_bool(0.7) {
                    fields.push((f, self.pick(GOOD).to_owned()));
                }
            }
            if self.rng.random_bool(0.3) {
                fields.push((
                    "starts_at",
                    self.pick(&["0", "1000", "1800000000"]).to_owned(),
                ));
                fields.push((
                    "ends_at",
                    self.pick(&["1", "2000", "1900000000"]).to_owned(),
                ));
            }
            // Operator changes: an initial amount (refunds never lift the
            // remaining past it) and an incarnation (a re-seed changes it).
            if self.rng.random_bool(0.5) {
                fields.push(("initial_budget", self.pick(GOOD).to_owned()));
                fields.push(("initial_stock", self.pick(GOOD).to_owned()));
            }
            if self.rng.random_bool(0.6) {
                fields.push(("gen", self.pick(&["1", "2"]).to_owned()));
            }
            let f: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            self.hset(promo, &f).await;
        }
        let n = [0, 0, 1, 1, 2][self.rng.random_range(0..5)];
        for _ in 0..n {
            match self.rng.random_range(0..12) {
                0 => {
                    let f = self.pick(&[
                        "budget",
                        "stock",
                        "per_customer",
                        "starts_at",
                        "ends_at",
                        "status",
                        "initial_budget",
                        "initial_stock",
                        "gen",
                    ]);
                    let v = self.value(&["active", "paused", "10", "1", "2"]);
                    self.hset(promo, &[(f, &v)]).await;
                }
                1 => self.wrong_kind(promo, true).await,
                2 => {
                    let v = self.value(&["0", "1", "2"]);
                    self.r.set(used, &v).await;
                }
                3 => self.wrong_kind(used, false).await,
                4 => {
                    // A consistent record.
                    let b0 = self.pick(&["0", "5", "100"]);
                    let s0 = self.pick(&["0", "1", "2"]);
                    let state = self.pick(&["deducted", "deducted", "reverted"]);
                    let (b, s) = if state == "reverted" {
                        ("0", "0")
                    } else {
                        (b0, s0)
                    };
                    let ev = self.pick(&["e1", "e2", "e3"]);
                    self.r.del(rec).await;
                    let mut f = vec![
                        ("state", state),
                        ("budget", b),
                        ("stock", s),
                        ("budget0", b0),
                        ("stock0", s0),
                    ];
                    if state == "deducted" || self.rng.random_bool(0.5) {
                        f.push(("event", ev));
                    }
                    // The fields of this version (older records lack them).
                    if self.rng.random_bool(0.7) {
                        f.push(("customer", self.pick(&["c1", "c2"])));
                        f.push(("counted", self.pick(&["0", "1"])));
                    }
                    if self.rng.random_bool(0.5) {
                        f.push(("gen", self.pick(&["1", "2"])));
                    }
                    if self.rng.random_bool(0.3) {
                        f.push(("absorbed", self.pick(&["e1", "e2", "e3"])));
                    }
                    if self.rng.random_bool(0.3) {
                        let field = self.pick(&["refund:e1", "refund:e2", "refund:e3"]);
                        let v = self.pick(&[
                            "applied 0 0",
                            "applied 1 0",
                            "rejected no_deduction",
                            "rejected exceeds_deducted",
                        ]);
                        f.push((field, v));
                    }
                    self.hset(rec, &f).await;
                }
                5 => {
                    let f = self.pick(&[
                        "state",
                        "event",
                        "budget",
                        "stock",
                        "budget0",
                        "stock0",
                        "customer",
                        "counted",
                        "gen",
                        "absorbed",
                        "refund:e1",
                    ]);
                    let v = self.value(&["deducted", "reverted", "e1", "c1", "1", "applied 1 0"]);
                    self.hset(rec, &[(f, &v)]).await;
                }
                6 => self.wrong_kind(rec, true).await,
                7 => {
                    let plausible: &[&str] = if refund_memo {
                        &[
                            "applied 1 0",
                            "applied 0 0",
                            "rejected no_deduction",
                            "rejected already_reverted",
                            "rejected corrupt_promotion",
                        ]
                    } else {
                        &[
                            "accepted",
                            "released",
                            "budget_exceeded",
                            "order_reverted",
                            "corrupt_promotion",
                        ]
                    };
                    let v = self.value(plausible);
                    self.r.set(memo, &v).await;
                }
                8 => self.wrong_kind(memo, false).await,
                _ => {
                    let k = self.pick(&[promo, used, rec, memo]).to_owned();
                    self.r.del(&k).await;
                }
            }
        }
    }
}

fn reply_of(v: &Value) -> Option<Vec<Reply>> {
    let Value::Array(items) = v else { return None };
    items
        .iter()
        .map(|i| match i {
            Value::Integer(n) => Some(Reply::I(*n)),
            Value::String(s) => Some(Reply::S(s.to_string())),
            Value::Bytes(b) => Some(Reply::S(String::from_utf8_lossy(b).into_owned())),
            _ => None,
        })
        .collect()
}

fn short(s: &str) -> String {
    if s.len() > 80 {
        format!(
            "{}...({} bytes)",
            &s[..s.char_indices().nth(60).map_or(s.len(), |(i, _)| i)],
            s.len()
        )
    } else {
        format!("{s:?}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_decide_correctly_or_refuse_without_writing() {
    let cases: usize = std::env::var("SCRIPT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let seed: u64 = std::env::var("SCRIPT_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    println!("script fuzz: {cases} calls, SCRIPT_FUZZ_SEED={seed}");
    let mut f = Fuzz {
        rng: StdRng::seed_from_u64(seed),
        r: redis::standalone().await,
    };
    let id = |s: &str| Id::parse(s).unwrap();
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for n in 0..cases {
        let p = id(f.pick(&["p1", "p2"]));
        let o = id(f.pick(&["o1", "o2"]));
        let c = id(f.pick(&["c1", "c2"]));
        let e = f.pick(&["e1", "e2", "e3"]).to_owned();
        let keys = f.r.keys().clone();
        let line = keys.deduct_line(&p, &o, &c, &id(&e));
        let refund_memo = keys.refund(&p, &id(&e));
        let which = f.rng.random_range(0..10);
        let (script, mut k, mut a): (&str, Vec<String>, Vec<String>) = match which {
            0..=3 => {
                let t = f.pick(&["1500", "0", "1800000000", "-5"]).to_owned();
                let (b, st) = (
                    GOOD[f.rng.random_range(0..5)],
                    GOOD[f.rng.random_range(0..4)],
                );
                let valid = [b, st, &t, &e, "2592000", "604800", c.as_str()]
                    .map(str::to_owned)
                    .to_vec();
                let args = f.args(valid);
                ("deduct", line.as_vec(), args)
            }
            4..=6 => {
                let amounts = ["", "", "0", "1", "5", "100"];
                let (b, st) = (
                    amounts[f.rng.random_range(0..amounts.len())],
                    amounts[f.rng.random_range(0..amounts.len())],
                );
                let args = f.args(
                    [b, st, "2592000", "604800", &e, c.as_str()]
                        .map(str::to_owned)
                        .to_vec(),
                );
                let k = vec![
                    line.promotion.clone(),
                    line.used.clone(),
                    line.record.clone(),
                    refund_memo.clone(),
                ];
                ("rollback", k, args)
            }
            7..=8 => {
                let valid = vec![e.clone(), "604800".to_owned(), c.to_string()];
                ("release", line.as_vec(), f.args(valid))
            }
            _ => ("memo", vec![line.memo.clone()], vec![]),
        };
        // Sometimes the wrong number of keys or arguments.
        if f.rng.random_ratio(1, 40) {
            if f.rng.random_bool(0.5) {
                k.pop();
            } else {
                a.push("1".into());
            }
        }
        let memo_key = if script == "rollback" {
            &refund_memo
        } else {
            &line.memo
        };
        f.disturb(
            &line.promotion,
            &line.used,
            &line.record,
            memo_key,
            script == "rollback",
        )
        .await;

        if script == "release" && f.rng.random_bool(0.5) {
            // Often the record this event deducted, so that releases happen.
            f.r.del(&line.record).await;
            f.r.del(&line.memo).await;
            let counted = f.pick(&["0", "1"]);
            f.hset(
                &line.record,
                &[
                    ("state", "deducted"),
                    ("event", e.as_str()),
                    ("budget", "5"),
                    ("stock", "1"),
                    ("budget0", "5"),
                    ("stock0", "1"),
                    ("customer", c.as_str()),
                    ("counted", counted),
                ],
            )
            .await;
        }
        let before = f.r.dump().await;
        let expect = match script {
            "deduct" => deduct(&before, &k, &a),
            "rollback" => rollback(&before, &k, &a),
            "release" => release(&before, &k, &a),
            _ => memo(&before, &k, &a),
        };
        let body = match script {
            "deduct" => DEDUCT.body,
            "rollback" => ROLLBACK.body,
            "release" => RELEASE.body,
            _ => MEMO.body,
        };
        let got = f.r.eval(body, k.clone(), a.clone()).await;
        let after = f.r.dump().await;
        let context = || {
            format!(
                "call {n} (SCRIPT_FUZZ_SEED={seed}): {script} keys {k:?} args {:?}\nbefore: {}",
                a.iter().map(|x| short(x)).collect::<Vec<_>>(),
                short(&format!("{before:?}"))
            )
        };
        let outcome = match (&expect, &got) {
            (Expect::Error(code), Err(e)) => {
                let first = e.details().split_whitespace().next().unwrap_or("");
                assert_eq!(first, *code, "{}\nerror: {e}", context());
                redis::assert_same(
                    &before,
                    &after,
                    &format!("{}\nan error reply wrote", context()),
                );
                format!("{script} {code}")
            }
            (Expect::ErrorWrote(code, want_after), Err(e)) => {
                let first = e.details().split_whitespace().next().unwrap_or("");
                assert_eq!(first, *code, "{}\nerror: {e}", context());
                assert_eq!(
                    &after,
                    want_after,
                    "{}\nkeys differ: {:?}",
                    context(),
                    redis::diff(want_after, &after)
                );
                format!("{script} {code} remembered")
            }
            (Expect::Reply(want, want_after), Ok(v)) => {
                assert_eq!(
                    reply_of(v).as_ref(),
                    Some(want),
                    "{}\nreply {v:?}",
                    context()
                );
                assert_eq!(
                    &after,
                    want_after,
                    "{}\nkeys differ: {:?}",
                    context(),
                    redis::diff(want_after, &after)
                );
                let tag = match want.first() {
                    Some(Reply::S(st)) => format!(
                        "{st} {}",
                        match want.get(1) {
                            Some(Reply::S(r)) => r.as_str(),
                            _ => "",
                        }
                    ),
                    _ => format!("{want:?}"),
                };
                format!("{script} {}", tag.trim())
            }
            (Expect::Text(want), Ok(v)) => {
                assert_eq!(
                    v.as_string().as_deref(),
                    Some(want.as_str()),
                    "{}\nreply {v:?}",
                    context()
                );
                assert_eq!(before, after, "{}\nmemo.lua wrote", context());
                format!("memo {}", if want.is_empty() { "none" } else { "found" })
            }
            (want, got) => panic!("{}\nexpected {want:?}\ngot {got:?}", context()),
        };
        *tally.entry(outcome).or_default() += 1;
    }
    for (k, v) in &tally {
        println!("  {k:<40} {v}");
    }
    // The run must have reached the interesting places, not only errors.
    for needed in [
        "deduct accepted",
        "deduct BADARG",
        "deduct CORRUPT",
        "deduct CORRUPT remembered",
        "rollback CORRUPT remembered",
        "rollback applied",
        "rollback customer",
        "rollback CORRUPT",
        "release [I(1)]",
        "release [I(0)]",
    ] {
        assert!(
            tally.keys().any(|k| k.starts_with(needed)),
            "no call ended in {needed:?}: {tally:?}"
        );
    }
}
