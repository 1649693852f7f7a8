//! The keys as the four scripts read them (promotion hash, used counter,
//! order record, memos), what section 2 of the contract allows in each,
//! and a writer of the keys the model expects afterwards.

use std::collections::BTreeMap;

use super::*;
use crate::common::redis::{Dumped, DumpedValue};

/// A key as the scripts read it.
pub(super) enum Read<'a> {
    Absent,
    Hash(&'a BTreeMap<String, String>),
    Str(&'a str),
    WrongType,
}

pub(super) fn read<'a>(d: &'a Dump, key: &str, want_hash: bool) -> Read<'a> {
    match d.get(key).map(|k| &k.value) {
        None => Read::Absent,
        Some(DumpedValue::Hash(h)) if want_hash => Read::Hash(h),
        Some(DumpedValue::String(v)) if !want_hash => Read::Str(v),
        Some(_) => Read::WrongType,
    }
}

pub(super) struct Promo {
    pub(super) budget: Option<i64>,
    pub(super) stock: Option<i64>,
    pub(super) per_customer: Option<i64>,
    pub(super) starts_at: Option<i64>,
    pub(super) ends_at: Option<i64>,
    pub(super) initial_budget: Option<i64>,
    pub(super) initial_stock: Option<i64>,
    pub(super) paused: bool,
    pub(super) gen: Option<String>,
}

/// The largest canonical value.
pub(super) const MAX_AMOUNT: i64 = 999_999_999_999_999;

/// `Err(())` = corrupt.
pub(super) fn promo(d: &Dump, key: &str) -> Result<Option<Promo>, ()> {
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

pub(super) fn used(d: &Dump, key: &str) -> Result<Option<i64>, ()> {
    match read(d, key, false) {
        Read::Absent => Ok(None),
        Read::Str(v) if canonical(v) => Ok(Some(num(v))),
        _ => Err(()),
    }
}

#[derive(Clone)]
pub(super) struct Record {
    pub(super) deducted: bool,
    pub(super) event: Option<String>,
    pub(super) budget: i64,
    pub(super) stock: i64,
    pub(super) budget0: i64,
    pub(super) stock0: i64,
    pub(super) customer: Option<String>,
    /// `None`: a record older than the field.
    pub(super) counted: Option<bool>,
    pub(super) gen: Option<String>,
    pub(super) absorbed: Option<String>,
    /// The further absorbed events (`absorbed:<E>` fields), in the order
    /// of their numbers (`seq`).
    pub(super) more: Vec<String>,
    pub(super) seq: Vec<i64>,
    pub(super) fields: BTreeMap<String, String>,
}

pub(super) fn record(d: &Dump, key: &str) -> Result<Option<Record>, ()> {
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
    // The further absorbed events, in the order their numbers give.
    let mut numbered: Vec<(i64, String)> = Vec::new();
    for (f, v) in h.iter() {
        if let Some(e) = f.strip_prefix("absorbed:") {
            if !valid_event(e) || !canonical(v) {
                return Err(());
            }
            numbered.push((num(v), e.to_owned()));
        }
    }
    numbered.sort();
    Ok(Some(Record {
        seq: numbered.iter().map(|x| x.0).collect(),
        more: numbered.into_iter().map(|x| x.1).collect(),
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
pub(super) struct Writer(pub(super) Dump);

impl Writer {
    pub(super) fn hash(&mut self, key: &str) -> &mut BTreeMap<String, String> {
        let k = self.0.entry(key.to_owned()).or_insert(Dumped {
            value: DumpedValue::Hash(BTreeMap::new()),
            expires: false,
        });
        match &mut k.value {
            DumpedValue::Hash(h) => h,
            _ => unreachable!("model writes a hash over another type"),
        }
    }
    pub(super) fn hset(&mut self, key: &str, pairs: &[(&str, String)]) {
        let h = self.hash(key);
        for (f, v) in pairs {
            h.insert((*f).to_owned(), v.clone());
        }
    }
    /// HDEL; Redis removes a hash left empty.
    pub(super) fn hdel(&mut self, key: &str, f: &str) {
        let h = self.hash(key);
        h.remove(f);
        if h.is_empty() {
            self.0.remove(key);
        }
    }
    pub(super) fn hincrby(&mut self, key: &str, f: &str, by: i64) -> i64 {
        let h = self.hash(key);
        let v = h.get(f).map_or(0, |x| num(x)) + by;
        h.insert(f.to_owned(), v.to_string());
        v
    }
    pub(super) fn set_ex(&mut self, key: &str, v: &str) {
        self.0.insert(
            key.to_owned(),
            Dumped {
                value: DumpedValue::String(v.to_owned()),
                expires: true,
            },
        );
    }
    pub(super) fn incr(&mut self, key: &str, by: i64) {
        let k = self.0.entry(key.to_owned()).or_insert(Dumped {
            value: DumpedValue::String("0".into()),
            expires: false,
        });
        if let DumpedValue::String(v) = &mut k.value {
            *v = (num(v) + by).to_string();
        }
    }
    pub(super) fn expire(&mut self, key: &str) {
        if let Some(k) = self.0.get_mut(key) {
            k.expires = true;
        }
    }
}

pub(super) fn placement_memo(d: &Dump, km: &str) -> Result<Option<String>, ()> {
    match read(d, km, false) {
        Read::Absent => Ok(None),
        Read::Str(v) if REASONS.contains(&v) || v == "accepted" || v == "released" => {
            Ok(Some(v.to_owned()))
        }
        _ => Err(()),
    }
}

/// A stored refund result: (status, reason, budget, stock), or corrupt.
pub(super) fn refund_result(v: &str) -> Result<(String, String, i64, i64), ()> {
    let parts: Vec<&str> = v.split(' ').collect();
    match parts.as_slice() {
        ["applied", b, st] if canonical(b) && canonical(st) => {
            Ok(("applied".into(), String::new(), num(b), num(st)))
        }
        ["rejected", r] if REFUND_REASONS.contains(r) => Ok(("rejected".into(), (*r).into(), 0, 0)),
        _ => Err(()),
    }
}
