//! The model of each call: deduct.lua, rollback.lua, release.lua and
//! memo.lua, each as the reply (or error code) and the keys afterwards it
//! must give for the keys before.

use super::stored::*;
use super::*;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Expect {
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
pub(super) enum Reply {
    S(String),
    I(i64),
}

pub(super) fn s(v: &str) -> Reply {
    Reply::S(v.to_owned())
}

/// What the promotion has left, as the scripts reply it (-1 = unlimited or none).
pub(super) fn left(p: &Option<Promo>) -> (i64, i64) {
    match p {
        Some(p) => (p.budget.unwrap_or(-1), p.stock.unwrap_or(-1)),
        None => (-1, -1),
    }
}

/// The 7-item reply of deduct.lua / rollback.lua.
pub(super) fn reply(
    st_: &str,
    reason: &str,
    dup: i64,
    rb: i64,
    rs: i64,
    l: (i64, i64),
) -> Vec<Reply> {
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
pub(super) fn credit(
    w: &mut Writer,
    kp: &str,
    p: &Option<Promo>,
    r: &Record,
    b: i64,
    st: i64,
) -> (i64, i64) {
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

pub(super) fn deduct(d: &Dump, keys: &[String], args: &[String]) -> Expect {
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
                } else if r.deducted
                    && r.absorbed.as_deref() != Some(ev)
                    && !r.more.iter().any(|e| e == ev)
                {
                    let last = r.seq.iter().copied().max().unwrap_or(0);
                    let f = format!("absorbed:{ev}");
                    w.hset(kr, &[(f.as_str(), (last + 1).to_string())]);
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

pub(super) fn rollback(d: &Dump, keys: &[String], args: &[String]) -> Expect {
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
pub(super) fn release(d: &Dump, keys: &[String], args: &[String]) -> Expect {
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
    if let Some(r) = &rec {
        let other = r.customer.as_deref().is_some_and(|c| c != customer);
        if r.deducted
            && r.event.as_deref() == Some(ev)
            && r.absorbed.is_none()
            && r.more.is_empty()
            && r.counted != Some(false)
            && other
        {
            // Nothing written: the caller releases with the record's customer.
            let c = r.customer.clone().unwrap_or_default();
            return Expect::Reply(vec![Reply::I(-1), Reply::S(c)], d.clone());
        }
    }
    let mut w = Writer(d.clone());
    let mut released = 0;
    if let Some(r) = &rec {
        // The absorbed events after the release (see release.lua).
        let mut more: Vec<String> = r.more.iter().filter(|e| *e != ev).cloned().collect();
        let mut noted = r.absorbed.clone().filter(|a| a != ev);
        let mut heir = None;
        if r.deducted && r.event.as_deref() == Some(ev) {
            heir = match noted.take() {
                Some(a) => Some(a),
                None if !more.is_empty() => Some(more.remove(0)),
                None => None,
            };
        }
        if noted.is_none() && !more.is_empty() {
            noted = Some(more.remove(0));
        }
        if let Some(a) = &heir {
            w.hset(kr, &[("event", a.clone())]);
        }
        if noted != r.absorbed {
            match &noted {
                Some(n) => w.hset(kr, &[("absorbed", n.clone())]),
                None => w.hdel(kr, "absorbed"),
            }
        }
        for e in &r.more {
            if !more.contains(e) {
                w.hdel(kr, &format!("absorbed:{e}"));
            }
        }
        if r.deducted && r.event.as_deref() == Some(ev) && heir.is_none() {
            {
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

pub(super) fn memo(d: &Dump, keys: &[String], args: &[String]) -> Expect {
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
