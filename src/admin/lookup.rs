//! `order show` and `event show`: what the ledger remembers of an order or
//! an event, for support staff ("why was order O rejected?").
//!
//! Read only, and tolerant: records written before a field existed
//! (`customer`, `counted`, `gen`, `absorbed`, `refund:<E>`) are shown
//! without it, and a value that is not what the contract says is shown as
//! stored rather than refused. Without `--promotion`, the keys are found
//! with SCAN across every promotion under the prefix.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use crate::domain::event::Id;
use crate::ledger::reply::Stored;
use crate::ledger::store::KeyType;
use crate::ledger::{Ledger, LedgerError};

/// One refund result: from a record's `refund:<E>` field or from an old
/// `promo:{P}:refund:{E}` key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundResult {
    pub event_id: String,
    /// The stored text, `applied <b> <s>` or `rejected <reason>`.
    pub raw: String,
}

impl RefundResult {
    pub fn to_json(&self) -> serde_json::Value {
        let mut words = self.raw.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("applied"), Some(b), Some(s)) => serde_json::json!({
                "event_id": self.event_id, "result": "applied",
                "budget": b.parse::<u64>().ok(), "stock": s.parse::<u64>().ok(),
            }),
            (Some("rejected"), Some(reason), None) => serde_json::json!({
                "event_id": self.event_id, "result": "rejected", "reason": reason,
            }),
            _ => {
                serde_json::json!({"event_id": self.event_id, "result": "unknown", "raw": self.raw})
            }
        }
    }

    fn words(&self) -> String {
        let mut w = self.raw.split_whitespace();
        match (w.next(), w.next(), w.next()) {
            (Some("applied"), Some(b), Some(s)) => {
                format!(
                    "refund {}: applied, returned budget {b}, stock {s}",
                    self.event_id
                )
            }
            (Some("rejected"), Some(reason), None) => {
                format!("refund {}: rejected {reason}", self.event_id)
            }
            _ => format!(
                "refund {}: {:?} (not a known result)",
                self.event_id, self.raw
            ),
        }
    }
}

/// A record `promo:{P}:order:{O}` as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub promotion_id: String,
    pub order_id: String,
    pub fields: BTreeMap<String, String>,
    /// Whether the promotion hash exists now, and its `gen`.
    pub promotion: Option<Option<String>>,
}

impl Record {
    fn get(&self, f: &str) -> Option<&str> {
        self.fields.get(f).map(String::as_str)
    }

    fn amount(&self, f: &str) -> serde_json::Value {
        match self.get(f) {
            None => serde_json::Value::Null,
            Some(v) => v
                .parse::<u64>()
                .map(serde_json::Value::from)
                .unwrap_or_else(|_| v.into()),
        }
    }

    /// The further events absorbed into the record (`absorbed:<E>` fields),
    /// in the order they came.
    pub fn further_absorbed(&self) -> Vec<String> {
        let mut v: Vec<(u64, &str)> = self
            .fields
            .iter()
            .filter_map(|(k, n)| {
                Some((n.parse().unwrap_or(u64::MAX), k.strip_prefix("absorbed:")?))
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, e)| e.to_owned()).collect()
    }

    /// Refund results stored in the record (`refund:<E>` fields).
    pub fn refunds(&self) -> Vec<RefundResult> {
        self.fields
            .iter()
            .filter_map(|(k, v)| {
                Some(RefundResult {
                    event_id: k.strip_prefix("refund:")?.to_owned(),
                    raw: v.clone(),
                })
            })
            .collect()
    }

    /// Whether the record was taken from another incarnation than the
    /// promotion's current one (replaced or re-created since): refunds give
    /// it nothing back. `None` when the promotion is gone.
    fn replaced(&self) -> Option<bool> {
        self.promotion
            .as_ref()
            .map(|gen| gen.as_deref() != self.get("gen"))
    }

    /// A tombstone: a refund that found nothing deducted, so that a late
    /// placement of the order is rejected `order_reverted`.
    fn tombstone(&self) -> bool {
        self.get("state") == Some("reverted")
            && self.get("event").is_none_or(str::is_empty)
            && self.get("budget0") == Some("0")
            && self.get("stock0") == Some("0")
    }

    pub fn to_json(&self) -> serde_json::Value {
        let refunds: Vec<_> = self.refunds().iter().map(RefundResult::to_json).collect();
        serde_json::json!({
            "promotion_id": self.promotion_id,
            "order_id": self.order_id,
            "bucket": self.get("bucket"),
            "state": self.get("state"),
            "event_id": self.get("event"),
            "customer_id": self.get("customer"),
            "counted": self.get("counted").map(|c| c == "1"),
            "gen": self.amount("gen"),
            "absorbed": self.get("absorbed"),
            "absorbed_further": self.further_absorbed(),
            "budget": self.amount("budget"),
            "stock": self.amount("stock"),
            "budget0": self.amount("budget0"),
            "stock0": self.amount("stock0"),
            "tombstone": self.tombstone(),
            "promotion_exists": self.promotion.is_some(),
            "replaced_incarnation": self.replaced(),
            "refunds": refunds,
        })
    }

    /// Lines in words, indented under the order.
    pub fn words(&self) -> String {
        let mut s = String::new();
        let p = &self.promotion_id;
        let or = |v: Option<&str>| v.unwrap_or("?").to_owned();
        if self.tombstone() {
            let _ = writeln!(
                s,
                "  {p}: reverted before any placement (a refund found nothing deducted); \
                 a later placement of the order is rejected order_reverted"
            );
        } else {
            let state = match self.get("state") {
                Some("deducted") => "deducted".to_owned(),
                Some("reverted") => "reverted (everything returned)".to_owned(),
                Some("set_aside") => {
                    "set aside (waiting for the customer's reservation)".to_owned()
                }
                Some("released") => "released (its event was rejected on another line)".to_owned(),
                other => format!("state {:?} (not a known state)", other.unwrap_or("")),
            };
            match self.get("bucket") {
                Some(b) => {
                    let _ = writeln!(s, "  {p}: {state} at bucket {{{b}}} (decided per order)");
                }
                None => {
                    let _ = writeln!(s, "  {p}: {state} by event {}", or(self.get("event")));
                }
            }
            let _ = writeln!(
                s,
                "    holds budget {} of {}, stock {} of {}",
                or(self.get("budget")),
                or(self.get("budget0")),
                or(self.get("stock")),
                or(self.get("stock0"))
            );
        }
        let mut who = Vec::new();
        if let Some(c) = self.get("customer") {
            who.push(format!("customer {c}"));
        }
        match self.get("counted") {
            Some("1") => who.push("counted towards the per-customer limit".to_owned()),
            Some("0") => who.push("not counted towards a per-customer limit".to_owned()),
            _ => {}
        }
        if let Some(g) = self.get("gen") {
            who.push(format!("promotion incarnation {g}"));
        }
        if !who.is_empty() {
            let _ = writeln!(s, "    {}", who.join(", "));
        }
        match self.replaced() {
            None => {
                let _ = writeln!(
                    s,
                    "    the promotion no longer exists: a refund gives nothing back"
                );
            }
            Some(true) if self.get("state") == Some("deducted") => {
                let _ = writeln!(
                    s,
                    "    taken from a replaced incarnation of the promotion (now {}): \
                     a refund gives nothing back to it",
                    self.promotion
                        .as_ref()
                        .and_then(|g| g.as_deref())
                        .map_or("without gen".to_owned(), |g| format!("gen {g}"))
                );
            }
            _ => {}
        }
        if let Some(a) = self.get("absorbed") {
            let _ = writeln!(
                s,
                "    event {a} (a second placement of this order) was absorbed into it: accepted as a duplicate"
            );
        }
        for a in self.further_absorbed() {
            let _ = writeln!(s, "    event {a} was absorbed into it too");
        }
        for r in self.refunds() {
            let _ = writeln!(s, "    {}", r.words());
        }
        s
    }
}

/// What `order show` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrderView {
    pub order_id: String,
    pub records: Vec<Record>,
}

impl OrderView {
    pub fn to_json(&self) -> serde_json::Value {
        let records: Vec<_> = self.records.iter().map(Record::to_json).collect();
        serde_json::json!({"order_id": self.order_id, "records": records})
    }

    pub fn words(&self) -> String {
        let mut s = format!("order {}\n", self.order_id);
        if self.records.is_empty() {
            s.push_str(
                "  no record: the order holds no deduction and was never refunded here \
                 (a rejected placement is remembered by its event: deductor event show E)\n",
            );
        }
        for r in &self.records {
            s.push_str(&r.words());
        }
        s
    }
}

/// A placement memo `promo:{P}:rejected:{E}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memo {
    pub promotion_id: String,
    pub value: String,
}

impl Memo {
    fn meaning(&self) -> String {
        match self.value.as_str() {
            "accepted" => "accepted: absorbed into the order's existing record \
                           (a new event of an order already deducted)"
                .to_owned(),
            "released" => "rejected on another promotion of the order; this line's \
                           deduction was released (all or nothing)"
                .to_owned(),
            reason => format!("rejected: {reason}"),
        }
    }
}

/// What `event show` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventView {
    pub event_id: String,
    pub memos: Vec<Memo>,
    /// Old `promo:{P}:refund:{E}` keys: (promotion, result).
    pub refund_keys: Vec<(String, RefundResult)>,
    /// Records the event deducted, was absorbed into, or refunded.
    pub records: Vec<Record>,
}

impl EventView {
    pub fn to_json(&self) -> serde_json::Value {
        let e = &self.event_id;
        let placements: Vec<_> = self
            .memos
            .iter()
            .map(|m| {
                let (decision, reason) = match m.value.as_str() {
                    "accepted" => ("accepted", None),
                    "released" => ("released", None),
                    r => ("rejected", Some(r)),
                };
                serde_json::json!({"promotion_id": m.promotion_id, "memo": m.value,
                    "decision": decision, "reason": reason})
            })
            .collect();
        let mut refunds: Vec<_> = self
            .records
            .iter()
            .flat_map(|r| {
                r.refunds()
                    .into_iter()
                    .filter(|x| &x.event_id == e)
                    .map(|x| (r.promotion_id.clone(), x))
            })
            .chain(self.refund_keys.iter().cloned())
            .map(|(p, x)| {
                let mut v = x.to_json();
                v["promotion_id"] = p.into();
                v
            })
            .collect();
        refunds.dedup();
        let records: Vec<_> = self.records.iter().map(Record::to_json).collect();
        serde_json::json!({"event_id": e, "placements": placements,
            "refunds": refunds, "records": records})
    }

    pub fn words(&self) -> String {
        let e = &self.event_id;
        let mut s = format!("event {e}\n");
        if self.memos.is_empty() && self.refund_keys.is_empty() && self.records.is_empty() {
            s.push_str(
                "  nothing stored: not processed (yet), invalid (see deductor dlq list), \
                 or its keys expired\n",
            );
        }
        for m in &self.memos {
            let _ = writeln!(s, "  {}: {}", m.promotion_id, m.meaning());
        }
        for (p, r) in &self.refund_keys {
            let _ = writeln!(s, "  {p}: {}", r.words());
        }
        for r in &self.records {
            let role = if r.get("event") == Some(e.as_str()) {
                "deducted order"
            } else if r.get("absorbed") == Some(e.as_str())
                || r.fields.contains_key(&format!("absorbed:{e}"))
            {
                "was absorbed into order"
            } else {
                "refunded order"
            };
            let _ = writeln!(s, "  {}: {role} {}", r.promotion_id, r.order_id);
            for line in r.words().lines() {
                let _ = writeln!(s, "    {line}");
            }
        }
        s
    }
}

/// The promotion id and the rest of a key `prefix:{P}:<rest>`.
fn split_key<'a>(prefix: &str, key: &'a str) -> Option<(&'a str, &'a str)> {
    let inner = key.strip_prefix(prefix)?.strip_prefix(":{")?;
    let (p, rest) = inner.split_once("}:")?;
    Some((p, rest))
}

/// The keys `prefix:{P}:<suffix>` of the given promotion, or (SCAN) of
/// every promotion.
async fn find(ledger: &Ledger, p: Option<&Id>, suffix: &str) -> Result<Vec<String>, LedgerError> {
    let prefix = ledger.keys().prefix();
    match p {
        // A bucketed promotion: the key at each of its buckets.
        Some(p) => Ok(match ledger.learn_layout(p).await? {
            Some(l) => l.keys.iter().map(|b| format!("{b}:{suffix}")).collect(),
            None => vec![format!("{prefix}:{{{p}}}:{suffix}")],
        }),
        None => {
            ledger
                .scan(&format!("{prefix}:{{*}}:{suffix}"), KeyType::Any)
                .await
        }
    }
}

async fn read_record(ledger: &Ledger, key: &str) -> Result<Option<Record>, LedgerError> {
    let prefix = ledger.keys().prefix();
    let Some((p, rest)) = split_key(prefix, key) else {
        return Ok(None);
    };
    let Some(order) = rest.strip_prefix("order:") else {
        return Ok(None);
    };
    // Either layout (docs/contract.md section 2); a value that is no record is
    // shown as it is stored.
    // A bucket's record (docs/contract.md section 2b): `promo:{P~s}:order:{O}`.
    let (p, bucket) = match p.split_once('~') {
        Some((p, _)) => (p, Some(p.len())),
        None => (p, None),
    };
    let stored = match bucket {
        // (Not the plain layout's decoding: the bucket's own.)
        Some(_) => match ledger.string(key).await? {
            Some(v) => Stored::String(v),
            None => Stored::Absent,
        },
        None => ledger.record(key).await?,
    };
    let h = match stored {
        Stored::Absent => return Ok(None),
        Stored::String(v) if bucket.is_some() => bucket_record(&v),
        Stored::Hash(h) => h,
        Stored::String(v) => HashMap::from([("value".to_owned(), v)]),
        Stored::Other(t) => HashMap::from([("type".to_owned(), t)]),
    };
    let mut h = h;
    if bucket.is_some() {
        let tag = key
            .strip_prefix(prefix)
            .and_then(|k| k.strip_prefix(":{"))
            .and_then(|k| k.split_once('}'))
            .map(|(t, _)| t.to_owned())
            .unwrap_or_default();
        h.insert("bucket".to_owned(), tag);
    }
    let promo_key = format!("{prefix}:{{{p}}}");
    let promotion = if ledger.exists(&promo_key).await? {
        Some(ledger.hash_field(&promo_key, "gen").await?)
    } else {
        None
    };
    // A bucket's record is of the directory's incarnation.
    if let (Some(_), Some(Some(g))) = (bucket, &promotion) {
        h.insert("gen".to_owned(), g.clone());
    }
    Ok(Some(Record {
        promotion_id: p.to_owned(),
        order_id: order.to_owned(),
        fields: h.into_iter().collect(),
        promotion,
    }))
}

/// A bucket's record (lua/bucket.lua: `d|C|b|s|CR` deducted, `t|C|b|s|ob|os|CR`
/// set aside, `v|C|b|s|CR|by` reverted by refund `by`, `x|by` a tombstone,
/// `r|C|b|s|CR` released) as the fields `order show` prints.
fn bucket_record(v: &str) -> HashMap<String, String> {
    let f: Vec<&str> = v.split('|').collect();
    let mut h = HashMap::new();
    let mut put = |k: &str, v: &str| {
        h.insert(k.to_owned(), v.to_owned());
    };
    let state = match f.first().copied() {
        Some("d") => "deducted",
        Some("t") => "set_aside",
        Some("v") => "reverted",
        Some("r") => "released",
        Some("x") => "reverted",
        _ => {
            put("value", v);
            return h;
        }
    };
    put("state", state);
    if f[0] == "x" {
        for k in ["budget", "stock", "budget0", "stock0"] {
            put(k, "0");
        }
        return h;
    }
    if let (Some(c), Some(b), Some(s)) = (f.get(1), f.get(2), f.get(3)) {
        put("customer", c);
        let held = matches!(state, "deducted" | "set_aside");
        put("budget", if held { b } else { "0" });
        put("stock", if held { s } else { "0" });
        put("budget0", b);
        put("stock0", s);
    }
    if f[0] == "v" {
        if let Some(by) = f.get(5) {
            put(
                &format!("refund:{by}"),
                &format!("applied {} {}", f[2], f[3]),
            );
        }
    }
    h
}

/// The records of order `o` (on `p`, or on every promotion).
pub async fn order_show(ledger: &Ledger, o: &Id, p: Option<&Id>) -> Result<OrderView, LedgerError> {
    let mut records = Vec::new();
    for key in find(ledger, p, &format!("order:{o}")).await? {
        if let Some(r) = read_record(ledger, &key).await? {
            records.push(r);
        }
    }
    records.sort_by(|a, b| a.promotion_id.cmp(&b.promotion_id));
    Ok(OrderView {
        order_id: o.to_string(),
        records,
    })
}

/// What the ledger remembers of event `e` (on `p`, or on every promotion):
/// its placement memos, refund results, and the records it deducted, was
/// absorbed into or refunded (found by SCAN over the records).
pub async fn event_show(ledger: &Ledger, e: &Id, p: Option<&Id>) -> Result<EventView, LedgerError> {
    let prefix = ledger.keys().prefix().to_owned();
    let mut view = EventView {
        event_id: e.to_string(),
        ..EventView::default()
    };
    for key in find(ledger, p, &format!("rejected:{e}")).await? {
        let v = ledger.string(&key).await?;
        if let (Some(v), Some((p, _))) = (v, split_key(&prefix, &key)) {
            view.memos.push(Memo {
                promotion_id: p.to_owned(),
                value: v,
            });
        }
    }
    for key in find(ledger, p, &format!("refund:{e}")).await? {
        let v = ledger.string(&key).await?;
        if let (Some(v), Some((p, _))) = (v, split_key(&prefix, &key)) {
            let r = RefundResult {
                event_id: e.to_string(),
                raw: v,
            };
            view.refund_keys.push((p.to_owned(), r));
        }
    }
    let pattern = match p {
        Some(p) => ledger.keys().record_pattern(p),
        None => format!("{prefix}:{{*}}:order:*"),
    };
    let refund_field = format!("refund:{e}");
    for key in ledger.scan(&pattern, KeyType::Any).await? {
        let Some(r) = read_record(ledger, &key).await? else {
            continue;
        };
        let mine = r.get("event") == Some(e.as_str())
            || r.get("absorbed") == Some(e.as_str())
            || r.fields.contains_key(&format!("absorbed:{e}"))
            || r.fields.contains_key(&refund_field);
        if mine {
            view.records.push(r);
        }
    }
    view.memos
        .sort_by(|a, b| a.promotion_id.cmp(&b.promotion_id));
    view.refund_keys.sort_by(|a, b| a.0.cmp(&b.0));
    view.records
        .sort_by(|a, b| (&a.promotion_id, &a.order_id).cmp(&(&b.promotion_id, &b.order_id)));
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(fields: &[(&str, &str)]) -> Record {
        Record {
            promotion_id: "flash".into(),
            order_id: "o-1".into(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            promotion: Some(Some("2".into())),
        }
    }

    #[test]
    fn keys_split_into_promotion_and_rest() {
        assert_eq!(
            split_key("promo", "promo:{flash}:order:o-1"),
            Some(("flash", "order:o-1"))
        );
        assert_eq!(split_key("promo", "other:{flash}:order:o-1"), None);
    }

    #[test]
    fn a_record_reads_in_words_and_json() {
        let r = record(&[
            ("state", "deducted"),
            ("event", "e-1"),
            ("budget", "30"),
            ("budget0", "50"),
            ("stock", "1"),
            ("stock0", "1"),
            ("customer", "c-9"),
            ("counted", "1"),
            ("gen", "2"),
            ("refund:r-1", "applied 20 0"),
            ("refund:r-2", "rejected exceeds_deducted"),
        ]);
        let w = r.words();
        assert!(w.contains("flash: deducted by event e-1"), "{w}");
        assert!(w.contains("holds budget 30 of 50, stock 1 of 1"), "{w}");
        assert!(w.contains("customer c-9, counted towards"), "{w}");
        assert!(
            w.contains("refund r-1: applied, returned budget 20, stock 0"),
            "{w}"
        );
        assert!(w.contains("refund r-2: rejected exceeds_deducted"), "{w}");
        let j = r.to_json();
        assert_eq!(j["budget"], 30);
        assert_eq!(j["counted"], true);
        assert_eq!(j["refunds"][0]["result"], "applied");
        assert_eq!(j["refunds"][1]["reason"], "exceeds_deducted");
        assert_eq!(j["replaced_incarnation"], false);
        assert!(!w.contains("replaced incarnation"), "{w}");

        let old = Record {
            promotion: Some(Some("3".into())),
            ..r.clone()
        };
        assert!(old
            .words()
            .contains("replaced incarnation of the promotion (now gen 3)"));
        let gone = Record {
            promotion: None,
            ..r
        };
        assert!(
            gone.words().contains("no longer exists"),
            "{}",
            gone.words()
        );
        assert_eq!(gone.to_json()["promotion_exists"], false);
    }

    #[test]
    fn old_records_and_tombstones_are_read_tolerantly() {
        let old = record(&[("state", "deducted"), ("event", "e"), ("budget", "x")]);
        assert_eq!(old.to_json()["budget"], "x");
        assert_eq!(old.to_json()["customer_id"], serde_json::Value::Null);
        let t = record(&[
            ("state", "reverted"),
            ("budget", "0"),
            ("stock", "0"),
            ("budget0", "0"),
            ("stock0", "0"),
        ]);
        assert!(t.tombstone());
        assert!(t.words().contains("order_reverted"), "{}", t.words());
    }
}
