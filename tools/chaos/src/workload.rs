//! The workload of a chaos run: promotions with scarce stock, budgets and
//! per-customer limits, and a shuffled stream of order events (placements,
//! re-sent duplicates, retries under a new event id, full, partial, multi-line,
//! double, over-sized and early refunds) with a share of invalid events.
//!
//! Pure and seeded. The events describe themselves: every invalid event
//! carries the marker `x_expect=<kind>;x_outcome=<0|1>` (the dead-letter kind
//! the contract requires, and whether an `invalid_event` outcome must be
//! published too), so the checker needs only the topics and `promotions.json`.

use std::collections::BTreeMap;

use deductor_testkit::rng::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// 2026-11-29T00:00:00Z: the business day every event falls in.
pub const BASE_TIME: i64 = 1_795_910_400;
const DAY: i64 = 86_400;

/// One promotion as seeded (or, `seeded = false`, deliberately absent).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Promo {
    pub id: String,
    pub budget: Option<u64>,
    pub stock: Option<u64>,
    pub per_customer: Option<u64>,
    pub starts_at: Option<i64>,
    pub ends_at: Option<i64>,
    pub paused: bool,
    pub seeded: bool,
    /// Bucketed over this many buckets (issue 28, docs/contract.md section
    /// 2b): its orders are single-line, checked by `check/buckets.rs`.
    #[serde(default)]
    pub buckets: Option<usize>,
}

impl Promo {
    pub(crate) fn new(id: &str) -> Promo {
        Promo {
            id: id.to_owned(),
            budget: None,
            stock: None,
            per_customer: None,
            starts_at: None,
            ends_at: None,
            paused: false,
            seeded: true,
            buckets: None,
        }
    }

    /// True when a fresh line at business time `t` is rejected whatever the
    /// counters say: `promotion_not_found` or `promotion_inactive`.
    pub fn fixed_rejection(&self, t: i64) -> Option<&'static str> {
        if !self.seeded {
            return Some("promotion_not_found");
        }
        let outside = self.starts_at.is_some_and(|s| t < s) || self.ends_at.is_some_and(|e| t >= e);
        if self.paused || outside {
            return Some("promotion_inactive");
        }
        None
    }
}

/// One record to produce: Kafka key and value.
#[derive(Debug, Clone)]
pub struct Record {
    pub key: Option<String>,
    pub payload: Vec<u8>,
    /// A header at the input topic's size limit (issue 23: records at the
    /// size limit), made when the record is produced: its name and the
    /// length of its value.
    pub big_header: Option<(&'static str, usize)>,
}

/// The value length of a [`Record::big_header`] for `payload`: the whole
/// record just under the broker's default `max.message.bytes` (1 MiB + 12).
fn big_header_len(payload: &[u8]) -> usize {
    1_047_000 - payload.len()
}

/// Counts of what was generated, for the report.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Stats {
    pub records: usize,
    /// Records with a header of about 1 MB (see [`Record::big_header`]).
    #[serde(default)]
    pub huge_header_records: usize,
    pub orders: usize,
    pub placements: usize,
    pub multi_line_placements: usize,
    pub resent_placements: usize,
    pub retried_placements: usize,
    pub refunds: usize,
    pub partial_refunds: usize,
    pub multi_line_refunds: usize,
    pub over_refunds: usize,
    pub double_refunds: usize,
    pub early_refunds: usize,
    pub resent_refunds: usize,
    pub invalid: usize,
    pub invalid_by_kind: BTreeMap<String, usize>,
}

pub struct Workload {
    pub promos: Vec<Promo>,
    pub records: Vec<Record>,
    pub stats: Stats,
}

/// The bucketed hot promotion (issue 28): its own single-line orders, a
/// share of all orders, over three buckets (on a Cluster, one per primary).
pub const HOT: &str = "hot";
const HOT_SHARE: f64 = 0.15;
const HOT_BUCKETS: usize = 3;

/// Promotion templates and how often a line picks each.
const PROMOS: [(&str, u32); 8] = [
    ("flash", 20),  // scarce stock, 1 per customer
    ("budget", 20), // scarce budget
    ("combo", 15),  // budget, stock and 2 per customer
    ("open", 15),   // unlimited: pure bookkeeping
    ("window", 10), // active for half of the business day
    ("member", 12), // 1 per customer, nothing else
    ("paused", 3),  // always promotion_inactive
    ("ghost", 3),   // never seeded: promotion_not_found
];

struct Gen {
    rng: Rng,
    next_event: u64,
    next_order: u64,
    customers: u64,
    stats: Stats,
}

type Line = (String, Option<u64>, Option<u64>);

fn time(t: i64) -> String {
    chrono::DateTime::from_timestamp(t, 0)
        .expect("time in range")
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn event(kind: &str, e: &str, o: &str, c: &str, at: i64, lines: &[Line]) -> Map<String, Value> {
    let lines: Vec<Value> = lines
        .iter()
        .map(|(p, b, s)| {
            let mut l = Map::new();
            l.insert("promotion_id".into(), p.as_str().into());
            if let Some(b) = b {
                l.insert("budget".into(), (*b).into());
            }
            if let Some(s) = s {
                l.insert("stock".into(), (*s).into());
            }
            Value::Object(l)
        })
        .collect();
    let v = json!({"type": kind, "event_id": e, "order_id": o, "customer_id": c,
                   "occurred_at": time(at), "lines": lines});
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

fn bytes(m: &Map<String, Value>) -> Vec<u8> {
    serde_json::to_vec(m).expect("a map serializes")
}

impl Gen {
    fn event_id(&mut self) -> String {
        self.next_event += 1;
        format!("e{}", self.next_event)
    }

    fn order_id(&mut self) -> String {
        self.next_order += 1;
        format!("o{}", self.next_order)
    }

    fn placement_lines(&mut self) -> Vec<Line> {
        let n = [1, 1, 1, 1, 1, 1, 2, 2, 2, 3][self.rng.below(10)];
        let mut weights: Vec<u32> = PROMOS.iter().map(|p| p.1).collect();
        let mut lines = Vec::new();
        for _ in 0..n {
            let i = self.rng.weighted(&weights);
            weights[i] = 0;
            let budget = match self.rng.below(10) {
                0 => None,
                1 | 2 => Some(0),
                _ => Some(self.rng.range(1, 5000)),
            };
            let stock = match self.rng.below(10) {
                0 | 1 => None,
                2 | 3 => Some(0),
                _ => Some(self.rng.range(1, 3)),
            };
            lines.push((PROMOS[i].0.to_owned(), budget, stock));
        }
        lines
    }

    /// The events of one order, in the order they are produced.
    fn order(&mut self) -> Vec<Record> {
        let o = self.order_id();
        let c = format!("c{}", self.rng.below(self.customers as usize));
        let at = BASE_TIME + self.rng.range(0, DAY as u64 - 1) as i64;
        let lines = self.placement_lines();
        let e = self.event_id();
        let placed = bytes(&event("OrderPlaced", &e, &o, &c, at, &lines));
        self.stats.orders += 1;
        self.stats.placements += 1;
        if lines.len() > 1 {
            self.stats.multi_line_placements += 1;
        }
        let rec = |payload: Vec<u8>| Record {
            key: Some(o.clone()),
            payload,
            big_header: None,
        };
        let mut seq = vec![rec(placed.clone())];
        if self.rng.chance(0.002) {
            // A valid event with a ~1 MB tracestate: it gets its outcome
            // (with the tracestate left out) like any other.
            seq[0].big_header = Some(("tracestate", big_header_len(&placed)));
            self.stats.huge_header_records += 1;
        }
        let later = at + 3_600;

        if self.rng.chance(0.04) {
            // An early refund: it arrives before its placement.
            let all: Vec<Line> = lines
                .iter()
                .map(|(p, _, _)| (p.clone(), None, None))
                .collect();
            let r = self.event_id();
            seq.insert(
                0,
                rec(bytes(&event("OrderRefunded", &r, &o, &c, later, &all))),
            );
            self.stats.refunds += 1;
            self.stats.early_refunds += 1;
        } else if self.rng.chance(0.32) {
            let refunds = self.refunds(&o, &c, later, &lines);
            seq.extend(refunds.into_iter().map(rec));
        }
        if self.rng.chance(0.03) {
            // The order service retried under a new event id.
            let e2 = self.event_id();
            let pos = 1 + self.rng.below(seq.len());
            let retry = bytes(&event("OrderPlaced", &e2, &o, &c, at, &lines));
            seq.insert(pos, rec(retry));
            self.stats.retried_placements += 1;
        }
        if self.rng.chance(0.08) {
            // The very same record sent again (a producer retry, a replay).
            let first = seq.iter().position(|r| r.payload == placed).unwrap_or(0);
            let pos = first + 1 + self.rng.below(seq.len() - first);
            seq.insert(pos, rec(placed.clone()));
            self.stats.resent_placements += 1;
        }
        let refund_positions: Vec<usize> = seq
            .iter()
            .enumerate()
            .filter(|(_, r)| r.payload.starts_with(b"{") && contains(&r.payload, b"OrderRefunded"))
            .map(|(i, _)| i)
            .collect();
        if !refund_positions.is_empty() && self.rng.chance(0.10) {
            let i = refund_positions[self.rng.below(refund_positions.len())];
            let copy = seq[i].payload.clone();
            let pos = i + 1 + self.rng.below(seq.len() - i);
            seq.insert(pos, rec(copy));
            self.stats.resent_refunds += 1;
        }
        seq
    }

    /// An order of the bucketed hot promotion (`HOT`): one line of one
    /// unit, placed by a customer of the pool (the limit is 1), sometimes
    /// refunded (whole: a bucketed line has no partial refunds), twice,
    /// early (before its placement), retried under a new event id, or
    /// sent again.
    fn hot_order(&mut self) -> Vec<Record> {
        let o = self.order_id();
        let c = format!("c{}", self.rng.below(self.customers as usize));
        let at = BASE_TIME + self.rng.range(0, DAY as u64 - 1) as i64;
        let lines: Vec<Line> = vec![(HOT.to_owned(), Some(self.rng.range(1, 20)), Some(1))];
        let all: Vec<Line> = vec![(HOT.to_owned(), None, None)];
        let e = self.event_id();
        let placed = bytes(&event("OrderPlaced", &e, &o, &c, at, &lines));
        self.stats.orders += 1;
        self.stats.placements += 1;
        let rec = |payload: Vec<u8>| Record {
            key: Some(o.clone()),
            payload,
            big_header: None,
        };
        let mut seq = vec![rec(placed.clone())];
        let later = at + 3_600;
        let refund = |g: &mut Gen| {
            let r = g.event_id();
            g.stats.refunds += 1;
            rec(bytes(&event("OrderRefunded", &r, &o, &c, later, &all)))
        };
        if self.rng.chance(0.04) {
            let r = refund(self);
            seq.insert(0, r);
            self.stats.early_refunds += 1;
        } else if self.rng.chance(0.25) {
            let r = refund(self);
            seq.push(r);
            if self.rng.chance(0.2) {
                let r = refund(self);
                seq.push(r);
                self.stats.double_refunds += 1;
            }
        }
        if self.rng.chance(0.03) {
            let e2 = self.event_id();
            let pos = 1 + self.rng.below(seq.len());
            seq.insert(
                pos,
                rec(bytes(&event("OrderPlaced", &e2, &o, &c, at, &lines))),
            );
            self.stats.retried_placements += 1;
        }
        if self.rng.chance(0.08) {
            let first = seq.iter().position(|r| r.payload == placed).unwrap_or(0);
            let pos = first + 1 + self.rng.below(seq.len() - first);
            seq.insert(pos, rec(placed.clone()));
            self.stats.resent_placements += 1;
        }
        seq
    }

    /// One to three refunds of a placement.
    fn refunds(&mut self, o: &str, c: &str, at: i64, lines: &[Line]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut refund = |g: &mut Gen, ls: &[Line]| {
            let r = g.event_id();
            g.stats.refunds += 1;
            if ls.len() > 1 {
                g.stats.multi_line_refunds += 1;
            }
            out.push(bytes(&event("OrderRefunded", &r, o, c, at, ls)));
        };
        let all: Vec<Line> = lines
            .iter()
            .map(|(p, _, _)| (p.clone(), None, None))
            .collect();
        match self.rng.below(10) {
            // Everything.
            0..=3 => refund(self, &all),
            // Some lines only.
            4 | 5 => {
                let keep = 1 + self.rng.below(all.len());
                let mut some = all.clone();
                some.truncate(keep);
                refund(self, &some);
            }
            // Part of the budget now, maybe the rest later.
            6 | 7 => {
                let part: Vec<Line> = lines
                    .iter()
                    .map(|(p, b, _)| (p.clone(), Some(b.unwrap_or(0) / 2), Some(0)))
                    .collect();
                self.stats.partial_refunds += 1;
                refund(self, &part);
                if self.rng.chance(0.6) {
                    refund(self, &all);
                }
            }
            // More than was deducted: exceeds_deducted.
            8 => {
                let over: Vec<Line> = lines
                    .iter()
                    .map(|(p, b, _)| (p.clone(), Some(b.unwrap_or(0) + 1), None))
                    .collect();
                self.stats.over_refunds += 1;
                refund(self, &over);
            }
            // Twice: the second finds nothing left (already_reverted).
            _ => {
                self.stats.double_refunds += 1;
                refund(self, &all);
                refund(self, &all);
            }
        }
        out
    }

    /// One invalid event, with its marker. Most use a fresh order id so that
    /// they never touch a real order.
    fn invalid(&mut self) -> Record {
        let o = self.order_id();
        let e = self.event_id();
        let c = format!("c{}", self.rng.below(self.customers as usize));
        let lines = vec![("open".to_owned(), Some(10), Some(1))];
        let mut m = event("OrderPlaced", &e, &o, &c, BASE_TIME + 100, &lines);
        let mut key = Some(o.clone());
        let mark = |m: &mut Map<String, Value>, kind: &str, outcome: bool| {
            m.insert("chaos".into(), marker(kind, outcome).into());
        };
        let (kind, payload): (&str, Vec<u8>) = match self.rng.below(17) {
            0 => {
                let text = format!(
                    "{{\"chaos\":\"{}\",\"type\":\"OrderPlaced\",\"order_id\":\"{o}\",\"lines\":[",
                    marker("not_json", false)
                );
                ("not_json", text.into_bytes())
            }
            1 => {
                mark(&mut m, "not_utf8", false);
                let mut b = bytes(&m);
                let at = b.len() - 1;
                b.splice(at..at, *b",\"junk\":\"\xff\xfe\"");
                ("not_utf8", b)
            }
            2 => {
                mark(&mut m, "too_large", true);
                m.insert("pad".into(), "x".repeat(70_000).into());
                ("too_large", bytes(&m))
            }
            3 => {
                key = None;
                (
                    "wrong_shape",
                    format!("[\"{}\", 1, 2]", marker("wrong_shape", false)).into_bytes(),
                )
            }
            4 => {
                // The same key twice: a Value map would keep the last silently.
                mark(&mut m, "wrong_shape", true);
                let b = bytes(&m);
                let mut text = String::from_utf8(b).expect("utf8");
                text.insert_str(1, "\"type\":\"OrderRefunded\",");
                ("wrong_shape", text.into_bytes())
            }
            5 => {
                mark(&mut m, "missing_field", true);
                m.remove("customer_id");
                ("missing_field", bytes(&m))
            }
            6 => {
                mark(&mut m, "missing_field", false);
                m.remove("type");
                ("missing_field", bytes(&m))
            }
            7 => {
                mark(&mut m, "unknown_type", false);
                m.insert("type".into(), "OrderCancelled".into());
                ("unknown_type", bytes(&m))
            }
            8 => {
                // An order id that tries to forge another key and hash slot.
                mark(&mut m, "invalid_id", false);
                let forged = format!("{o}:{{flash}}:used:c1");
                m.insert("order_id".into(), forged.clone().into());
                key = Some(forged);
                ("invalid_id", bytes(&m))
            }
            9 => {
                mark(&mut m, "invalid_id", true);
                m["lines"][0]["promotion_id"] = "flash}{x".into();
                ("invalid_id", bytes(&m))
            }
            10 => {
                mark(&mut m, "invalid_id", true);
                m.insert("customer_id".into(), "c 1".into());
                ("invalid_id", bytes(&m))
            }
            11 => {
                mark(&mut m, "invalid_timestamp", true);
                m.insert("occurred_at".into(), "yesterday".into());
                ("invalid_timestamp", bytes(&m))
            }
            12 => {
                mark(&mut m, "invalid_lines", true);
                m.insert("lines".into(), json!([]));
                ("invalid_lines", bytes(&m))
            }
            13 => {
                mark(&mut m, "duplicate_promotion", true);
                m.insert(
                    "lines".into(),
                    json!([{"promotion_id": "open"}, {"promotion_id": "open"}]),
                );
                ("duplicate_promotion", bytes(&m))
            }
            14 => {
                mark(&mut m, "invalid_amount", true);
                let bad = [
                    json!(1.5),
                    json!(-1),
                    json!("100"),
                    json!(1_000_000_000_001u64),
                ];
                m["lines"][0]["budget"] = bad[self.rng.below(bad.len())].clone();
                ("invalid_amount", bytes(&m))
            }
            15 => {
                // 1e3 is a float to JSON: no exponents.
                mark(&mut m, "invalid_amount", true);
                let text = String::from_utf8(bytes(&m))
                    .expect("utf8")
                    .replace("\"stock\":1", "\"stock\":1e0");
                ("invalid_amount", text.into_bytes())
            }
            _ => {
                // Lines nested deeper than the parser's recursion limit.
                mark(&mut m, "not_json", false);
                let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
                let text = String::from_utf8(bytes(&m)).expect("utf8");
                let at = text.find("\"lines\":").expect("lines") + 8;
                let end = at + text[at..].find("]").expect("]") + 1;
                (
                    "not_json",
                    format!("{}{deep}{}", &text[..at], &text[end..]).into_bytes(),
                )
            }
        };
        self.stats.invalid += 1;
        *self
            .stats
            .invalid_by_kind
            .entry(kind.to_owned())
            .or_default() += 1;
        let big_header = self.rng.chance(0.02).then(|| {
            // An invalid event with a ~1 MB header: dead-lettered with its
            // original headers cut to fit.
            self.stats.huge_header_records += 1;
            ("x-big", big_header_len(&payload))
        });
        Record {
            key,
            payload,
            big_header,
        }
    }
}

pub fn marker(kind: &str, outcome: bool) -> String {
    format!("x_expect={kind};x_outcome={}", u8::from(outcome))
}

/// Reads the marker of an invalid event: (expected kind, outcome expected).
pub fn read_marker(payload: &[u8]) -> Option<(String, bool)> {
    let at = find(payload, b"x_expect=")?;
    let rest = &payload[at + 9..];
    let end = rest.iter().position(|&b| b == b';')?;
    let kind = std::str::from_utf8(&rest[..end]).ok()?.to_owned();
    let rest = &rest[end + 1..];
    let outcome = rest.strip_prefix(b"x_outcome=")?.first()? == &b'1';
    Some((kind, outcome))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    find(hay, needle).is_some()
}

/// Generates about `n` records (whole orders, so a few more), `invalid_share`
/// of them invalid, then sizes the promotions from the demand so that stock,
/// budgets and per-customer limits run out.
pub fn generate(n: usize, invalid_share: f64, seed: u64) -> Workload {
    let mut g = Gen {
        rng: Rng::new(seed),
        next_event: 0,
        next_order: 0,
        customers: (n as u64 / 8).max(20),
        stats: Stats::default(),
    };
    let spread = (n as u64 * 4).max(100);
    let max_gap = (n as u64 / 10).max(4);
    let mut slotted: Vec<(u64, usize, Record)> = Vec::with_capacity(n + 8);
    let mut k = 0usize;
    while slotted.len() < n {
        let recs = if g.rng.chance(invalid_share) {
            vec![g.invalid()]
        } else if g.rng.chance(HOT_SHARE) {
            g.hot_order()
        } else {
            g.order()
        };
        let mut slot = g.rng.range(0, spread);
        for r in recs {
            slotted.push((slot, k, r));
            k += 1;
            slot += g.rng.range(1, max_gap);
        }
    }
    slotted.sort_by_key(|(slot, k, _)| (*slot, *k));
    let records: Vec<Record> = slotted.into_iter().map(|(_, _, r)| r).collect();
    g.stats.records = records.len();
    let promos = size_promotions(&records);
    Workload {
        promos,
        records,
        stats: g.stats,
    }
}

/// Limits from demand (the sum over distinct placement events): a quarter of
/// the stock asked for, a third of the budget.
fn size_promotions(records: &[Record]) -> Vec<Promo> {
    let mut budget: BTreeMap<String, u64> = BTreeMap::new();
    let mut stock: BTreeMap<String, u64> = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    for r in records {
        let Ok(v) = serde_json::from_slice::<Value>(&r.payload) else {
            continue;
        };
        if v["type"] != "OrderPlaced" || v.get("chaos").is_some() {
            continue;
        }
        if !seen.insert(v["event_id"].as_str().unwrap_or_default().to_owned()) {
            continue;
        }
        for l in v["lines"].as_array().into_iter().flatten() {
            let p = l["promotion_id"].as_str().unwrap_or_default().to_owned();
            *budget.entry(p.clone()).or_default() += l["budget"].as_u64().unwrap_or(0);
            *stock.entry(p).or_default() += l["stock"].as_u64().unwrap_or(0);
        }
    }
    let b = |p: &str, frac: u64| Some((budget.get(p).copied().unwrap_or(0) / frac).max(1));
    let s = |p: &str, frac: u64| Some((stock.get(p).copied().unwrap_or(0) / frac).max(1));
    // The hot promotion: a quarter of the stock asked for, budget to spare,
    // one order per customer; both amounts given (a bucketed promotion
    // counts both).
    let mut hot = Promo::new(HOT);
    hot.stock = s(HOT, 4);
    hot.budget = Some(budget.get(HOT).copied().unwrap_or(0).max(1));
    hot.per_customer = Some(1);
    hot.buckets = Some(HOT_BUCKETS);
    PROMOS
        .iter()
        .map(|(id, _)| {
            let mut p = Promo::new(id);
            match *id {
                "flash" => {
                    p.stock = s(id, 4);
                    p.per_customer = Some(1);
                }
                "budget" => p.budget = b(id, 3),
                "combo" => {
                    p.budget = b(id, 3);
                    p.stock = s(id, 3);
                    p.per_customer = Some(2);
                }
                "window" => {
                    p.starts_at = Some(BASE_TIME + DAY / 4);
                    p.ends_at = Some(BASE_TIME + 3 * DAY / 4);
                }
                "member" => p.per_customer = Some(1),
                "paused" => {
                    p.paused = true;
                    p.stock = Some(1_000);
                }
                "ghost" => p.seeded = false,
                _ => {}
            }
            p
        })
        .chain(std::iter::once(hot))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_round_trip_and_events_parse() {
        let w = generate(3_000, 0.05, 7);
        assert!(w.records.len() >= 3_000);
        let mut invalid = 0;
        for r in &w.records {
            match deductor::domain::event::parse(&r.payload) {
                Ok(_) => assert!(read_marker(&r.payload).is_none()),
                Err(e) => {
                    let (kind, _) = read_marker(&r.payload).unwrap_or_else(|| {
                        panic!(
                            "unmarked invalid event: {}",
                            String::from_utf8_lossy(&r.payload)
                        )
                    });
                    assert_eq!(
                        kind,
                        e.kind.as_str(),
                        "{}",
                        String::from_utf8_lossy(&r.payload)
                    );
                    invalid += 1;
                }
            }
        }
        assert_eq!(invalid, w.stats.invalid);
        assert!(w.stats.early_refunds > 0 && w.stats.resent_placements > 0);
    }
}
