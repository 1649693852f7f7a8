//! `deductor audit`: the ledger invariant of CONTRACT.md section 5, checked
//! on the stored data: a promotion's slot on a Cluster, its day indexes on
//! a standalone server, `SCAN` (never `KEYS`) for a promotion without them.
//!
//! For each promotion P: remaining stock and budget >= 0 and never above
//! the initial amounts; when the initial amounts are known (`promo set`
//! stores them as `initial_budget` / `initial_stock`): initial - remaining
//! == sum of outstanding amounts of P's `deducted` records of the current
//! incarnation (`gen`; records of a replaced incarnation are counted apart);
//! no customer holds more counted orders (records with `counted=1`) than
//! `per_customer` or than their `used` counter, and no counter is above
//! `per_customer`.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;

use crate::domain::event::Id;
use crate::domain::keys::Keys;
use crate::domain::stored::{canonical, event_id, record_fields};
use crate::ledger::calls::AuditMode;
use crate::ledger::reply::{AuditReply, Snapshot, Stored};
use crate::ledger::store::KeyType;
use crate::ledger::{Ledger, LedgerError};

/// The findings for one promotion.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub promotion: String,
    pub exists: bool,
    pub budget: Option<i64>,
    pub stock: Option<i64>,
    pub initial_budget: Option<i64>,
    pub initial_stock: Option<i64>,
    pub per_customer: Option<i64>,
    pub records: usize,
    pub held: usize,
    pub outstanding_budget: i64,
    pub outstanding_stock: i64,
    /// Records still held that were taken from a replaced incarnation of
    /// the promotion (another `gen`): refunds of them give nothing back.
    pub held_other_incarnation: usize,
    pub customers: usize,
    pub max_used: i64,
    /// Per customer: (counted orders held, `used` counter).
    pub counted: std::collections::BTreeMap<String, (i64, i64)>,
    /// Values the scripts would refuse as corrupt (lib.lua's parsing),
    /// each a breach.
    pub corrupt: Vec<String>,
    /// A large standalone keyspace only: the discrepancies of the last read
    /// while keys of the promotion kept appearing between listing and read
    /// ([`ATTEMPTS`] times): not a breach, and not clean either.
    pub unsettled: Vec<String>,
    pub breaches: Vec<String>,
}

impl Report {
    /// Applies the invariant to the gathered figures.
    pub fn judge(&mut self) {
        let mut b = self.corrupt.clone();
        if !self.exists && self.held > 0 {
            b.push(format!(
                "no such promotion, but {} record(s) still hold deductions (budget {}, stock {}) \
                 that no promotion accounts for",
                self.held, self.outstanding_budget, self.outstanding_stock
            ));
        }
        if let Some(s) = self.stock {
            if s < 0 {
                b.push(format!("remaining stock {s} < 0"));
            }
        }
        if let Some(x) = self.budget {
            if x < 0 {
                b.push(format!("remaining budget {x} < 0"));
            }
        }
        if let (Some(init), Some(rem)) = (self.initial_stock, self.stock) {
            if init - rem != self.outstanding_stock {
                b.push(format!(
                    "stock: initial {init} - remaining {rem} = {} but records hold {}",
                    init - rem,
                    self.outstanding_stock
                ));
            }
        }
        if let (Some(init), Some(rem)) = (self.initial_budget, self.budget) {
            if init - rem != self.outstanding_budget {
                b.push(format!(
                    "budget: initial {init} - remaining {rem} = {} but records hold {}",
                    init - rem,
                    self.outstanding_budget
                ));
            }
        }
        for (name, init, rem) in [
            ("stock", self.initial_stock, self.stock),
            ("budget", self.initial_budget, self.budget),
        ] {
            if let (Some(init), Some(rem)) = (init, rem) {
                if rem > init {
                    b.push(format!("remaining {name} {rem} > initial {init}"));
                }
            }
        }
        if let Some(limit) = self.per_customer {
            if self.max_used > limit {
                b.push(format!(
                    "a customer's counter is {}, per_customer is {limit}",
                    self.max_used
                ));
            }
        }
        for (customer, &(held, used)) in &self.counted {
            if self.per_customer.is_some_and(|limit| held > limit) {
                b.push(format!(
                    "customer {customer} holds {held} counted orders, per_customer is {}",
                    self.per_customer.unwrap_or_default()
                ));
            }
            if held > used {
                b.push(format!(
                    "customer {customer} holds {held} counted orders but the counter says {used}"
                ));
            }
        }
        self.breaches = b;
    }
}

/// A standalone server with more keys than this is not scanned inside the
/// audit script (a script blocks the server while it runs): the keys of the
/// promotion are listed by SCAN first, and the read is repeated until no key
/// of the promotion appeared meanwhile ([`ATTEMPTS`]).
pub const SCAN_IN_SCRIPT_LIMIT: u64 = 100_000;
/// Reads of a promotion tried on a large standalone keyspace before it is
/// reported unsettled.
pub const ATTEMPTS: usize = 10;

/// Every promotion id under the key prefix (keys `prefix:{P}` of type hash).
pub async fn promotions(ledger: &Ledger) -> Result<Vec<Id>, LedgerError> {
    let prefix = ledger.keys().prefix().to_owned();
    let open = format!("{prefix}:{{");
    let ids: BTreeSet<Id> = ledger
        .scan(&format!("{open}*}}"), KeyType::Hash)
        .await?
        .iter()
        .filter_map(|k| k.strip_prefix(&open)?.strip_suffix('}'))
        .filter_map(|i| Id::parse(i).ok())
        .collect();
    Ok(ids.into_iter().collect())
}

/// Gathers and judges one promotion from one read of it at one instant
/// (`audit.lua`): the hash, the records and the counters are never read
/// at different moments, so a sale in progress never shows a passing
/// difference. On Redis Cluster the script lists the keys of slot {P}
/// itself (cost in proportion to the promotion); on a standalone server of
/// at most [`SCAN_IN_SCRIPT_LIMIT`] keys it scans inside the script; above
/// that, the keys are listed first, and a breach counts only when no key
/// of the promotion appeared between the listing and a second one.
pub async fn audit_one(ledger: &Ledger, p: &Id) -> Result<Report, LedgerError> {
    audit_one_within(ledger, p, SCAN_IN_SCRIPT_LIMIT).await
}

/// [`audit_one`] with the largest standalone keyspace scanned inside the
/// script (`0`: always list first, as on a large server).
pub async fn audit_one_within(ledger: &Ledger, p: &Id, limit: u64) -> Result<Report, LedgerError> {
    if ledger.is_clustered() {
        return match ledger.audit_read(p, AuditMode::Slot).await? {
            AuditReply::Read(s) => Ok(report(ledger.keys(), p, &s)),
            _ => Err(LedgerError::malformed("audit", "not read in slot mode")),
        };
    }
    // A promotion created by this release on a standalone server: its day
    // indexes name every record (cost in proportion to the promotion). A
    // breach seen there is confirmed by the read of the whole promotion
    // below: a record that no index names (written by a previous release's
    // pod during a rollout, or restored by hand) must not make a false one.
    let today = crate::ledger::calls::today();
    let mut bad_indexes = Vec::new();
    if let AuditReply::Read(s) = ledger.audit_read(p, AuditMode::Index { today }).await? {
        let r = report(ledger.keys(), p, &s);
        if r.breaches.is_empty() {
            return Ok(r);
        }
        // A day index of another type is corrupt data (the scripts refuse
        // the promotion's lines over it); the keyspace read below does not
        // read indexes, so it is carried into its report.
        bad_indexes = s
            .indexes
            .iter()
            .map(|(key, t)| corrupt(key, "type", t))
            .collect();
    }
    let mut r = audit_keyspace(ledger, p, limit).await?;
    r.corrupt.extend(bad_indexes.iter().cloned());
    r.breaches.extend(bad_indexes);
    Ok(r)
}

/// The read of the whole promotion on a standalone server, in proportion to
/// the keyspace: the script's own scan on a small one, else `SCAN` listings
/// around a read of the keys listed.
async fn audit_keyspace(ledger: &Ledger, p: &Id, limit: u64) -> Result<Report, LedgerError> {
    if let AuditReply::Read(s) = ledger.audit_read(p, AuditMode::Scan { limit }).await? {
        return Ok(report(ledger.keys(), p, &s));
    }
    let pattern = ledger.keys().promotion_pattern(p);
    let mut listed = ledger.scan(&pattern, KeyType::Any).await?;
    let mut last = Report::default();
    for _ in 0..ATTEMPTS {
        let AuditReply::Read(s) = ledger.audit_read(p, AuditMode::Keys(&listed)).await? else {
            return Err(LedgerError::malformed("audit", "not read in keys mode"));
        };
        last = report(ledger.keys(), p, &s);
        if last.breaches.is_empty() {
            return Ok(last);
        }
        // A record created after the listing and before the read holds a
        // deduction the hash already shows: the read is whole only when a
        // second listing finds no key the first one lacked.
        let again = ledger.scan(&pattern, KeyType::Any).await?;
        let known: BTreeSet<&String> = listed.iter().collect();
        if again.iter().all(|k| known.contains(k)) {
            return Ok(last);
        }
        listed = again;
    }
    last.unsettled = last.breaches.clone();
    last.breaches = last.corrupt.clone();
    Ok(last)
}

fn out(line: std::fmt::Arguments<'_>) {
    println!("{line}");
}

/// One key's problem in lib.lua's words: `CORRUPT <key> <field>: <value>`.
fn corrupt(key: &str, field: &str, value: &str) -> String {
    let mut v: String = value.chars().take(64).collect();
    if value.chars().count() > 64 {
        v.push_str("...");
    }
    let v: String = v
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    format!("corrupt {key} {field}: {v}")
}

/// The figures of a snapshot, every value read as lib.lua reads it
/// (`read_promotion`, `read_record`, `read_used`): a value the scripts
/// call corrupt is reported corrupt (a breach), never read as unlimited
/// or 0.
pub fn report(keys: &Keys, p: &Id, s: &Snapshot) -> Report {
    let mut r = Report {
        promotion: p.to_string(),
        ..Report::default()
    };
    let k_promo = keys.promotion(p);
    let mut bad = Vec::new();
    let mut gen: Option<String> = None;
    match &s.promotion {
        None | Some(Stored::Absent) => {}
        Some(Stored::Hash(h)) => {
            r.exists = true;
            let mut num = |field: &str| -> Option<i64> {
                let v = h.get(field)?;
                match canonical(v) {
                    Some(n) => Some(n as i64),
                    None => {
                        bad.push(corrupt(&k_promo, field, v));
                        None
                    }
                }
            };
            r.budget = num("budget");
            r.stock = num("stock");
            r.per_customer = num("per_customer");
            r.initial_budget = num("initial_budget");
            r.initial_stock = num("initial_stock");
            num("starts_at");
            num("ends_at");
            num("gen");
            num("indexed");
            gen = h.get("gen").cloned();
            if let Some(st) = h.get("status") {
                if st != "active" && st != "paused" {
                    bad.push(corrupt(&k_promo, "status", st));
                }
            }
        }
        Some(Stored::String(_)) => {
            r.exists = true;
            bad.push(corrupt(&k_promo, "type", "string"));
        }
        Some(Stored::Other(t)) => {
            r.exists = true;
            bad.push(corrupt(&k_promo, "type", t));
        }
    }
    for (key, rec) in &s.records {
        let lean;
        let h = match rec {
            Stored::Absent => continue,
            Stored::Hash(h) => h,
            // The lean layout (docs/contract.md section 2), read as lib.lua reads it.
            Stored::String(v) => match record_fields(v) {
                Some(fields) => {
                    lean = fields;
                    &lean
                }
                None => {
                    r.records += 1;
                    bad.push(corrupt(key, "value", v));
                    continue;
                }
            },
            Stored::Other(t) => {
                r.records += 1;
                bad.push(corrupt(key, "type", t));
                continue;
            }
        };
        r.records += 1;
        match record(key, h) {
            Err(problem) => bad.push(problem),
            Ok(None) => {}
            Ok(Some(held)) => {
                r.held += 1;
                if h.get("gen") == gen.as_ref() {
                    r.outstanding_budget += held.budget;
                    r.outstanding_stock += held.stock;
                } else {
                    r.held_other_incarnation += 1;
                }
                if let (Some(c), true) = (h.get("customer"), held.counted) {
                    r.counted.entry(c.clone()).or_default().0 += 1;
                }
            }
        }
    }
    for (key, t) in &s.indexes {
        bad.push(corrupt(key, "type", t));
    }
    let used_prefix = format!("{k_promo}:used:");
    for (key, v) in &s.counters {
        let n = match v {
            Stored::Absent => continue,
            Stored::String(v) => match canonical(v) {
                Some(n) => n as i64,
                None => {
                    bad.push(corrupt(key, "value", v));
                    continue;
                }
            },
            Stored::Hash(_) => {
                bad.push(corrupt(key, "type", "hash"));
                continue;
            }
            Stored::Other(t) => {
                bad.push(corrupt(key, "type", t));
                continue;
            }
        };
        r.customers += 1;
        r.max_used = r.max_used.max(n);
        if let Some(c) = key.strip_prefix(&used_prefix) {
            r.counted.entry(c.to_owned()).or_default().1 = n;
        }
    }
    r.corrupt = bad;
    r.judge();
    r
}

/// What a `deducted` record holds.
struct Held {
    budget: i64,
    stock: i64,
    counted: bool,
}

/// lib.lua's `read_record`: the record's problem in its words, `None` for a
/// reverted record, else what it holds.
fn record(key: &str, h: &HashMap<String, String>) -> Result<Option<Held>, String> {
    let state = h.get("state").map(String::as_str);
    if state != Some("deducted") && state != Some("reverted") {
        return Err(corrupt(key, "state", state.unwrap_or("(absent)")));
    }
    let amount = |f: &str| -> Result<i64, String> {
        let v = h.get(f).map(String::as_str);
        canonical(v.unwrap_or(""))
            .map(|n| n as i64)
            .ok_or_else(|| corrupt(key, f, v.unwrap_or("(absent)")))
    };
    let (budget, stock) = (amount("budget")?, amount("stock")?);
    let (budget0, stock0) = (amount("budget0")?, amount("stock0")?);
    if budget > budget0 {
        return Err(corrupt(key, "budget", &budget.to_string()));
    }
    if stock > stock0 {
        return Err(corrupt(key, "stock", &stock.to_string()));
    }
    let event = h.get("event").map(String::as_str).unwrap_or("");
    if state == Some("deducted") && event.is_empty() {
        return Err(corrupt(key, "event", "(absent)"));
    }
    for f in ["customer", "absorbed"] {
        if let Some(v) = h.get(f) {
            if !event_id(v) {
                return Err(corrupt(key, f, v));
            }
        }
    }
    let counted = h.get("counted").map(String::as_str);
    if let Some(c) = counted {
        if c != "0" && c != "1" {
            return Err(corrupt(key, "counted", c));
        }
    }
    if let Some(g) = h.get("gen") {
        if canonical(g).is_none() {
            return Err(corrupt(key, "gen", g));
        }
    }
    if state == Some("reverted") {
        return Ok(None);
    }
    Ok(Some(Held {
        budget,
        stock,
        counted: counted == Some("1"),
    }))
}

/// Audits `ids` (or every promotion), printing a line per promotion and
/// progress on stderr; true when no breach was found.
pub async fn run(ledger: &Ledger, ids: &[Id]) -> anyhow::Result<bool> {
    let ids = if ids.is_empty() {
        promotions(ledger).await?
    } else {
        ids.to_vec()
    };
    let total = ids.len();
    let mut clean = true;
    for (n, p) in ids.iter().enumerate() {
        if let Some(b) = super::bucketed::audit(ledger, p).await? {
            let verdict = if !b.breaches.is_empty() {
                clean = false;
                format!(": BREACH: {}", b.breaches.join("; "))
            } else if !b.unsettled.is_empty() {
                clean = false;
                format!(
                    ": UNSETTLED (units in transit between buckets while it was read; not a \
                     breach, run it again at a quieter moment): {}",
                    b.unsettled.join("; ")
                )
            } else {
                ": ok".to_owned()
            };
            let (free, moving, held) = (b.free, b.in_transit, b.deducted);
            out(format_args!(
                "{p}: bucketed ({} buckets): stock {} free + {} in transit + {} deducted of {}, \
                 budget {} free + {} in transit + {} deducted of {}, {} orders held, max per \
                 customer {} (limit {}){verdict}",
                b.buckets,
                free.stock,
                moving.stock,
                held.stock,
                b.initial.map_or("?".to_owned(), |u| u.stock.to_string()),
                free.budget,
                moving.budget,
                held.budget,
                b.initial.map_or("?".to_owned(), |u| u.budget.to_string()),
                b.orders_held,
                b.max_per_customer,
                b.per_customer
                    .map_or("unlimited".to_owned(), |n| n.to_string()),
            ));
            continue;
        }
        let r = audit_one(ledger, p).await?;
        if total > 20 && (n + 1) % 100 == 0 {
            eprint!("\raudited {}/{total}", n + 1);
            let _ = std::io::stderr().flush();
        }
        let fmt = |v: Option<i64>| v.map_or("unlimited".to_owned(), |x| x.to_string());
        let verdict = if !r.breaches.is_empty() {
            format!(": BREACH: {}", r.breaches.join("; "))
        } else if !r.unsettled.is_empty() {
            format!(
                ": UNSETTLED (keys kept appearing while it was read, {ATTEMPTS} times; not a \
                 breach, run it again at a quieter moment): {}",
                r.unsettled.join("; ")
            )
        } else {
            ": ok".to_owned()
        };
        if !r.breaches.is_empty() || !r.unsettled.is_empty() {
            clean = false;
        }
        if !r.exists {
            out(format_args!(
                "{p}: no such promotion ({} records){verdict}",
                r.records
            ));
            continue;
        }
        out(format_args!(
            "{p}: stock {} of {} (outstanding {}), budget {} of {} (outstanding {}), {} orders held ({} from a replaced incarnation), {} customers, max per customer {} (limit {}){verdict}",
            fmt(r.stock), fmt(r.initial_stock), r.outstanding_stock,
            fmt(r.budget), fmt(r.initial_budget), r.outstanding_budget,
            r.held, r.held_other_incarnation, r.customers, r.max_used, fmt(r.per_customer),
        ));
    }
    if total > 20 {
        eprintln!();
    }
    out(format_args!(
        "{total} promotions audited, {}",
        if clean { "no breach" } else { "BREACHES FOUND" }
    ));
    Ok(clean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge_finds_each_breach() {
        let mut r = Report {
            stock: Some(3),
            initial_stock: Some(10),
            outstanding_stock: 7,
            per_customer: Some(1),
            max_used: 1,
            ..Report::default()
        };
        r.judge();
        assert!(r.breaches.is_empty(), "{:?}", r.breaches);
        r.outstanding_stock = 6;
        r.judge();
        assert_eq!(r.breaches.len(), 1);
        r.outstanding_stock = 7;
        r.max_used = 2;
        r.stock = Some(-1);
        r.initial_stock = Some(6);
        r.outstanding_stock = 7;
        r.judge();
        assert_eq!(r.breaches.len(), 2, "{:?}", r.breaches);

        // Orders held per customer, not only the counters.
        let mut r = Report {
            per_customer: Some(1),
            max_used: 1,
            ..Report::default()
        };
        r.counted.insert("c1".into(), (1, 1));
        r.judge();
        assert!(r.breaches.is_empty(), "{:?}", r.breaches);
        r.counted.insert("c2".into(), (2, 1));
        r.judge();
        assert_eq!(r.breaches.len(), 2, "{:?}", r.breaches);

        let mut r = Report {
            stock: Some(6),
            initial_stock: Some(5),
            outstanding_stock: -1,
            ..Report::default()
        };
        r.judge();
        assert!(
            r.breaches.iter().any(|b| b.contains("> initial")),
            "{:?}",
            r.breaches
        );
    }

    /// Issue 24 item 14: a promotion that is gone while records still hold
    /// deductions is a breach.
    #[test]
    fn a_missing_promotion_with_held_records_is_a_breach() {
        let mut r = Report {
            exists: false,
            records: 2,
            ..Report::default()
        };
        r.judge();
        assert!(r.breaches.is_empty(), "{:?}", r.breaches);
        r.held = 1;
        r.outstanding_stock = 3;
        r.judge();
        assert_eq!(r.breaches.len(), 1, "{:?}", r.breaches);
    }

    /// Issue 24 item 7: values the scripts call corrupt are corrupt here too
    /// (never "unlimited" or 0), in the promotion, a record and a counter.
    #[test]
    fn corrupt_values_are_breaches() {
        let keys = Keys::default();
        let p = Id::parse("p").unwrap();
        let hash = |pairs: &[(&str, &str)]| {
            Stored::Hash(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        for v in ["abc", "1e3", "007", "+5", "-1", " 5", "0x10"] {
            for field in [
                "stock",
                "budget",
                "per_customer",
                "initial_stock",
                "gen",
                "indexed",
            ] {
                let s = Snapshot {
                    promotion: Some(hash(&[(field, v)])),
                    ..Snapshot::default()
                };
                let r = report(&keys, &p, &s);
                assert!(!r.breaches.is_empty(), "{field}={v:?}: {r:?}");
                assert_eq!(r.stock, None);
            }
        }
        let ok = report(
            &keys,
            &p,
            &Snapshot {
                promotion: Some(hash(&[("stock", "5"), ("initial_stock", "5")])),
                ..Snapshot::default()
            },
        );
        assert!(ok.breaches.is_empty(), "{:?}", ok.breaches);
        let rec = hash(&[
            ("state", "deducted"),
            ("event", "e"),
            ("budget", "1"),
            ("stock", "1e0"),
            ("budget0", "1"),
            ("stock0", "1"),
        ]);
        let s = Snapshot {
            promotion: Some(hash(&[("stock", "5")])),
            records: vec![("promo:{p}:order:o".into(), rec)],
            counters: vec![("promo:{p}:used:c".into(), Stored::String("01".into()))],
            indexes: vec![("promo:{p}:index:1".into(), "string".into())],
        };
        let r = report(&keys, &p, &s);
        assert_eq!(r.corrupt.len(), 3, "{:?}", r.corrupt);
    }
}
