//! `deductor audit`: the ledger invariant of CONTRACT.md section 5, checked
//! on the stored data with `SCAN` (never `KEYS`).
//!
//! For each promotion P: remaining stock and budget >= 0 and never above
//! the initial amounts; when the initial amounts are known (`promo set`
//! stores them as `initial_budget` / `initial_stock`): initial - remaining
//! == sum of outstanding amounts of P's `deducted` records of the current
//! incarnation (`gen`; records of a replaced incarnation are counted apart);
//! no customer holds more counted orders (records with `counted=1`) than
//! `per_customer` or than their `used` counter, and no counter is above
//! `per_customer`.

use std::collections::BTreeSet;
use std::io::Write;

use crate::domain::event::Id;
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
    pub breaches: Vec<String>,
}

impl Report {
    /// Applies the invariant to the gathered figures.
    pub fn judge(&mut self) {
        let mut b = Vec::new();
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

fn int(v: Option<&String>) -> Option<i64> {
    v.and_then(|s| s.parse().ok())
}

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

/// Gathers and judges one promotion.
pub async fn audit_one(ledger: &Ledger, p: &Id) -> Result<Report, LedgerError> {
    let keys_of = ledger.keys();
    let mut r = Report {
        promotion: p.to_string(),
        ..Report::default()
    };
    let h = ledger.hash(&keys_of.promotion(p)).await?;
    r.exists = !h.is_empty();
    r.budget = int(h.get("budget"));
    r.stock = int(h.get("stock"));
    r.initial_budget = int(h.get("initial_budget"));
    r.initial_stock = int(h.get("initial_stock"));
    r.per_customer = int(h.get("per_customer"));
    let gen = h.get("gen");
    for key in ledger
        .scan(&keys_of.record_pattern(p), KeyType::Any)
        .await?
    {
        let rec = ledger.hash(&key).await?;
        r.records += 1;
        if rec.get("state").map(String::as_str) != Some("deducted") {
            continue;
        }
        r.held += 1;
        if rec.get("gen") == gen {
            r.outstanding_budget += int(rec.get("budget")).unwrap_or(0);
            r.outstanding_stock += int(rec.get("stock")).unwrap_or(0);
        } else {
            r.held_other_incarnation += 1;
        }
        if let (Some(c), Some("1")) = (rec.get("customer"), rec.get("counted").map(String::as_str))
        {
            r.counted.entry(c.clone()).or_default().0 += 1;
        }
    }
    let used_prefix = format!("{}:{{{}}}:used:", keys_of.prefix(), p);
    for key in ledger
        .scan(&format!("{used_prefix}*"), KeyType::Any)
        .await?
    {
        let v = ledger.string(&key).await?;
        let n = v.and_then(|s| s.parse::<i64>().ok()).unwrap_or(0);
        r.customers += 1;
        r.max_used = r.max_used.max(n);
        if let Some(c) = key.strip_prefix(&used_prefix) {
            r.counted.entry(c.to_owned()).or_default().1 = n;
        }
    }
    r.judge();
    Ok(r)
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
        let r = audit_one(ledger, p).await?;
        if total > 20 && (n + 1) % 100 == 0 {
            eprint!("\raudited {}/{total}", n + 1);
            let _ = std::io::stderr().flush();
        }
        let fmt = |v: Option<i64>| v.map_or("unlimited".to_owned(), |x| x.to_string());
        if !r.exists {
            println!("{p}: no such promotion ({} records)", r.records);
            continue;
        }
        println!(
            "{p}: stock {} of {} (outstanding {}), budget {} of {} (outstanding {}), {} orders held ({} from a replaced incarnation), {} customers, max per customer {} (limit {}){}",
            fmt(r.stock), fmt(r.initial_stock), r.outstanding_stock,
            fmt(r.budget), fmt(r.initial_budget), r.outstanding_budget,
            r.held, r.held_other_incarnation, r.customers, r.max_used, fmt(r.per_customer),
            if r.breaches.is_empty() { ": ok".to_owned() } else { format!(": BREACH: {}", r.breaches.join("; ")) }
        );
        if !r.breaches.is_empty() {
            clean = false;
        }
    }
    if total > 20 {
        eprintln!();
    }
    println!(
        "{total} promotions audited, {}",
        if clean { "no breach" } else { "BREACHES FOUND" }
    );
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
}
