//! Redis against the model and the outcomes: each (order, promotion)
//! record, then each promotion's ledger and per-customer counters, and the
//! script cache's figures.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use deductor::domain::event::{Event, Id};
use deductor::domain::keys::Keys;
use fred::prelude::*;
use futures::stream::{self, StreamExt};
use serde_json::Value;

use super::orders::Replay;
use super::{Findings, LedgerRow};
use crate::model::LineState;
use crate::operator::Effects;
use crate::workload::Promo;

/// (budget, stock) per promotion.
type Amounts = HashMap<String, (i64, i64)>;

/// The records Redis holds, and what they and the model add up to.
pub struct Records {
    /// Every (order, promotion) record of a verifiable order, as Redis has it.
    fetched: Vec<((String, String), HashMap<String, String>)>,
    /// What the records in state `deducted` hold, per promotion.
    outstanding_redis: Amounts,
    /// What the model's held lines hold, per promotion.
    outstanding_model: Amounts,
    /// What the records in state `deducted` hold, per promotion and
    /// incarnation (`gen`).
    outstanding_by_gen: HashMap<(String, Option<String>), (i64, i64)>,
    /// Records in state `deducted` per (promotion, customer).
    held: HashMap<(String, String), i64>,
    /// What the accepted deductions took, per the outcomes, per promotion.
    accepted_by_outcomes: Amounts,
}

/// An order record's fields in either layout (docs/contract.md section 2):
/// the lean string decoded as lib.lua decodes it, or a hash of the previous
/// layout; empty when absent. A string that is no record comes back as its
/// raw value under `corrupt`, which no expected record has.
async fn record(pool: &Pool, key: &str) -> Result<HashMap<String, String>, fred::error::Error> {
    match pool.get::<Option<String>, _>(key).await {
        Ok(None) => Ok(HashMap::new()),
        Ok(Some(v)) => Ok(deductor::domain::stored::record_fields(&v)
            .unwrap_or_else(|| HashMap::from([("corrupt".to_owned(), v)]))),
        Err(e) if e.details().contains("WRONGTYPE") => pool.hgetall(key).await,
        Err(e) => Err(e),
    }
}

/// Compares the record of every (order, promotion) of a verifiable order
/// with the model's final state of that line.
pub async fn records(
    pool: &Pool,
    keys: &Keys,
    replay: &Replay<'_>,
    found: &mut Findings,
) -> anyhow::Result<Records> {
    let (z, ev) = (&mut found.zeros, &mut found.evidence);
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (o, order) in &replay.orders {
        if replay.unverifiable.contains(o) {
            continue;
        }
        for p in replay.events[o]
            .iter()
            .filter_map(|i| i.parsed.as_ref().ok())
            .flat_map(|e| match e {
                Event::Placed(x) => x
                    .lines
                    .iter()
                    .map(|l| l.promotion_id.to_string())
                    .collect::<Vec<_>>(),
                Event::Refunded(x) => x.lines.iter().map(|l| l.promotion_id.to_string()).collect(),
            })
            .collect::<BTreeSet<_>>()
        {
            let _ = order;
            pairs.push((o.clone(), p));
        }
    }
    let fetched: Vec<((String, String), HashMap<String, String>)> = stream::iter(pairs)
        .map(|(o, p)| {
            let pool = pool.clone();
            let key = keys.record(&Id::parse(&p).expect("id"), &Id::parse(&o).expect("id"));
            async move { record(&pool, &key).await.map(|h| ((o, p), h)) }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let mut outstanding_redis = Amounts::new();
    let mut outstanding_model = Amounts::new();
    let mut outstanding_by_gen: HashMap<(String, Option<String>), (i64, i64)> = HashMap::new();
    let mut held: HashMap<(String, String), i64> = HashMap::new(); // (promotion, customer)
    let mut accepted_by_outcomes = Amounts::new();
    for ((o, p), h) in &fetched {
        let st = replay.orders[o].lines.get(p).cloned().unwrap_or_default();
        let get = |k: &str| h.get(k).cloned();
        let num = |k: &str| get(k).and_then(|s| s.parse::<i64>().ok()).unwrap_or(0);
        let expect = expected_record(&st);
        let got: Option<BTreeMap<&str, String>> = (!h.is_empty()).then(|| {
            h.iter()
                .filter_map(|(k, v)| {
                    ["state", "event", "budget", "stock", "budget0", "stock0"]
                        .into_iter()
                        .find(|x| x == k)
                        .map(|x| (x, v.clone()))
                })
                .collect()
        });
        if got.is_none()
            && matches!(
                st,
                LineState::Held { .. } | LineState::Reverted { event: Some(_), .. }
            )
        {
            // An accepted deduction the outcome topic announced, gone from
            // Redis (what an ungated failover to a lagging replica does).
            z.lost_deductions += 1;
        }
        if expect != got {
            z.record_mismatch += 1;
            ev.add(
                "records that differ from the outcomes",
                format!("order {o} promotion {p}: outcomes say {expect:?}, Redis has {got:?}"),
            );
        }
        if get("state").as_deref() == Some("deducted") {
            let e = outstanding_redis.entry(p.clone()).or_default();
            e.0 += num("budget");
            e.1 += num("stock");
            // Per incarnation: a forced re-seed forgets what the records of
            // the old one hold.
            let e = outstanding_by_gen
                .entry((p.clone(), get("gen")))
                .or_default();
            e.0 += num("budget");
            e.1 += num("stock");
            *held
                .entry((p.clone(), replay.orders[o].customer.clone()))
                .or_default() += 1;
        }
        match &st {
            LineState::Held {
                budget,
                stock,
                budget0,
                stock0,
                ..
            } => {
                let e = outstanding_model.entry(p.clone()).or_default();
                e.0 += *budget as i64;
                e.1 += *stock as i64;
                let a = accepted_by_outcomes.entry(p.clone()).or_default();
                a.0 += *budget0 as i64;
                a.1 += *stock0 as i64;
            }
            LineState::Reverted {
                event: Some(_),
                budget0,
                stock0,
            } => {
                let a = accepted_by_outcomes.entry(p.clone()).or_default();
                a.0 += *budget0 as i64;
                a.1 += *stock0 as i64;
            }
            _ => {}
        }
    }
    Ok(Records {
        fetched,
        outstanding_redis,
        outstanding_model,
        outstanding_by_gen,
        held,
        accepted_by_outcomes,
    })
}

/// The fields of the record that a line in state `st` must have (None: no
/// record).
fn expected_record(st: &LineState) -> Option<BTreeMap<&'static str, String>> {
    match st {
        LineState::None => None,
        LineState::Held {
            event,
            budget0,
            stock0,
            budget,
            stock,
        } => Some(BTreeMap::from([
            ("state", "deducted".to_owned()),
            ("event", event.clone()),
            ("budget", budget.to_string()),
            ("stock", stock.to_string()),
            ("budget0", budget0.to_string()),
            ("stock0", stock0.to_string()),
        ])),
        LineState::Reverted {
            event,
            budget0,
            stock0,
        } => {
            let mut m = BTreeMap::from([
                ("state", "reverted".to_owned()),
                ("budget", "0".to_owned()),
                ("stock", "0".to_owned()),
                ("budget0", budget0.to_string()),
                ("stock0", stock0.to_string()),
            ]);
            if let Some(e) = event {
                m.insert("event", e.clone());
            }
            Some(m)
        }
    }
}

/// Refunds applied, per the outcomes (the first outcome of each refund
/// event), per promotion.
pub fn refunded_by_outcomes(outcomes: &[Value], first_outcome: &HashMap<String, usize>) -> Amounts {
    let mut refunded = Amounts::new();
    for &k in first_outcome.values() {
        let v = &outcomes[k];
        if v["type"] != "RollbackApplied" {
            continue;
        }
        for l in v["lines"].as_array().into_iter().flatten() {
            if l["status"] == "applied" {
                let e = refunded.entry(s(&l["promotion_id"])).or_default();
                e.0 += l["budget"].as_i64().unwrap_or(0);
                e.1 += l["stock"].as_i64().unwrap_or(0);
            }
        }
    }
    refunded
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or("?").to_owned()
}

/// What the promotions are checked against.
pub struct Expected<'a> {
    pub promos: &'a HashMap<String, Promo>,
    pub fx: &'a Effects,
    pub replay: &'a Replay<'a>,
    pub records: &'a Records,
    pub refunded: &'a Amounts,
}

/// Each promotion, in id order, as a ledger row: its remaining amounts
/// against its initial ones, the records, the model and the outcomes; its
/// per-customer counters against the held records; and no records of
/// orders the run never sent.
/// `cluster`: Redis is a Cluster, whose records are scanned on every primary.
pub async fn promotions(
    pool: &Pool,
    keys: &Keys,
    x: &Expected<'_>,
    cluster: bool,
    found: &mut Findings,
) -> anyhow::Result<()> {
    let customers: BTreeSet<String> = x
        .replay
        .orders
        .iter()
        .filter(|(o, _)| !x.replay.unverifiable.contains(*o))
        .map(|(_, o)| o.customer.clone())
        .collect();
    let mut ids: Vec<&Promo> = x.promos.values().collect();
    ids.sort_by(|a, b| a.id.cmp(&b.id));
    for promo in ids {
        if promo.buckets.is_some() {
            continue; // (check/buckets.rs)
        }
        let pid = Id::parse(&promo.id).map_err(|e| anyhow::anyhow!("{e}"))?;
        let h: HashMap<String, String> = pool.hgetall(keys.promotion(&pid)).await?;
        let int = |k: &str| h.get(k).and_then(|v| v.parse::<i64>().ok());
        let get = |m: &Amounts| m.get(&promo.id).copied().unwrap_or_default();
        let current = x
            .records
            .outstanding_by_gen
            .get(&(promo.id.clone(), h.get("gen").cloned()))
            .copied()
            .unwrap_or_default();
        let mut row = LedgerRow {
            promotion: promo.id.clone(),
            initial: x.fx.initial.get(&promo.id).copied().unwrap_or((None, None)),
            remaining: (int("budget"), int("stock")),
            records: get(&x.records.outstanding_redis),
            per_customer: promo.per_customer.map(|x| x as i64),
            ok: true,
            ..LedgerRow::default()
        };
        let m = get(&x.records.outstanding_model);
        let a = get(&x.records.accepted_by_outcomes);
        let r = get(x.refunded);
        row.by_outcomes = (a.0 - r.0, a.1 - r.1);
        let mut problems = Vec::new();
        if !promo.seeded {
            if !h.is_empty() {
                problems.push("an unseeded promotion exists".to_owned());
            }
        } else {
            problems.extend(amount_problems(&row, current, m, found));
        }
        customer_counters(pool, keys, promo, &pid, &customers, x, &mut row, found).await?;
        // Records of orders the run never sent.
        let pattern = keys.record_pattern(&pid);
        let known = x
            .records
            .fetched
            .iter()
            .filter(|((_, p), h)| p == &promo.id && !h.is_empty())
            .count();
        // Every primary of a cluster; the one server otherwise.
        let mut scan = if cluster {
            pool.next()
                .scan_cluster_buffered(pattern, Some(1000), None)
                .boxed()
        } else {
            pool.next().scan_buffered(pattern, Some(1000), None).boxed()
        };
        let mut total = 0usize;
        while let Some(k) = scan.next().await {
            k?;
            total += 1;
        }
        if total != known && x.replay.unverifiable.is_empty() {
            problems.push(format!("{total} records in Redis, {known} expected"));
        }
        if !problems.is_empty() {
            found.zeros.ledger_mismatch += 1;
            row.ok = false;
            found.evidence.add(
                "ledger mismatches",
                format!("{}: {}", promo.id, problems.join("; ")),
            );
        }
        found.figures.ledger.push(row);
    }
    Ok(())
}

/// A seeded promotion's budget and stock: never negative, never above the
/// initial amount, and initial - remaining equal to what the records of
/// this incarnation hold (`current`), with all records equal to the
/// model (`model`) and to the outcomes.
fn amount_problems(
    row: &LedgerRow,
    current: (i64, i64),
    model: (i64, i64),
    found: &mut Findings,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, init, rem, rec, cur, model, out) in [
        (
            "budget",
            row.initial.0,
            row.remaining.0,
            row.records.0,
            current.0,
            model.0,
            row.by_outcomes.0,
        ),
        (
            "stock",
            row.initial.1,
            row.remaining.1,
            row.records.1,
            current.1,
            model.1,
            row.by_outcomes.1,
        ),
    ] {
        if rem.is_some_and(|x| x < 0) {
            found.zeros.negative += 1;
            problems.push(format!("{name} remaining {rem:?} < 0"));
        }
        if let (Some(i), Some(x)) = (init, rem) {
            if x > i {
                problems.push(format!("{name} remaining {x} > initial {i}"));
            }
        }
        // All records (every incarnation) against the model and the
        // outcomes; the current incarnation's against the promotion.
        match (init, rem) {
            (Some(i), Some(x)) if i - x != cur || rec != model || rec != out => {
                problems.push(format!("{name}: initial {i} - remaining {x} = {}, records of this incarnation {cur} (all {rec}), model {model}, outcomes {out}", i - x))
            }
            (None, None) if rec != model || rec != out => {
                problems.push(format!("{name}: records {rec}, model {model}, outcomes {out}"))
            }
            (Some(_), None) | (None, Some(_)) => problems.push(format!("{name}: limit appeared or vanished")),
            _ => {}
        }
    }
    problems
}

/// The promotion's counter of each customer of a verifiable order against
/// the records the customer holds; adds the holds to `row`.
#[allow(clippy::too_many_arguments)]
async fn customer_counters(
    pool: &Pool,
    keys: &Keys,
    promo: &Promo,
    pid: &Id,
    customers: &BTreeSet<String>,
    x: &Expected<'_>,
    row: &mut LedgerRow,
    found: &mut Findings,
) -> anyhow::Result<()> {
    let used: Vec<(String, Option<String>)> = stream::iter(customers.iter().cloned())
        .map(|c| {
            let pool = pool.clone();
            let key = keys.used(pid, &Id::parse(&c).expect("id"));
            async move { pool.get::<Option<String>, _>(&key).await.map(|v| (c, v)) }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    for (c, v) in used {
        let n = x
            .records
            .held
            .get(&(promo.id.clone(), c.clone()))
            .copied()
            .unwrap_or(0);
        row.held += n;
        row.max_per_customer = row.max_per_customer.max(n);
        let counted = v.as_deref().map(|s| s.parse::<i64>().unwrap_or(-1));
        let want = if promo.per_customer.is_some() && n > 0 {
            Some(n)
        } else {
            None
        };
        let fine =
            counted == want || (promo.per_customer.is_some() && n == 0 && counted == Some(0));
        if !fine {
            found.zeros.counter_mismatch += 1;
            found.evidence.add(
                "customer counters that differ from held orders",
                format!("{}/{c}: counter {counted:?}, holds {n}", promo.id),
            );
        }
        if promo.per_customer.is_some_and(|l| n > l as i64) {
            found.zeros.above_limit += 1;
            found.evidence.add(
                "customers above per_customer",
                format!("{}/{c}: holds {n}", promo.id),
            );
        }
    }
    Ok(())
}

/// The NOSCRIPT path: a restarted Redis has an empty script cache.
/// (NOSCRIPT replies, EVAL calls) since the last start.
pub async fn script_cache(pool: &Pool) -> (i64, i64) {
    let info: String = pool
        .info(Some(fred::types::InfoKind::All))
        .await
        .unwrap_or_default();
    let stat = |prefix: &str| -> i64 {
        info.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|rest| rest.split([',', '\r']).next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (
        stat("errorstat_NOSCRIPT:count="),
        stat("cmdstat_eval:calls="),
    )
}
