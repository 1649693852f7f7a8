//! The bucketed promotions of the run (issue 28, docs/contract.md section
//! 2b): their orders are single-line and decided per order, so the order
//! model (`model.rs`) leaves them to this check, which holds them to the
//! bucket rules on the first outcome of each event and on Redis:
//!
//! - one decision per order: every placement event of an order states the
//!   same decision (a retry under a new event id included);
//! - a refund is applied at most once per order, and only to an order that
//!   was accepted; an order a refund found nothing of (`no_deduction`) is
//!   never accepted;
//! - the ledger (after a sweep, as `promo rebalance` does first): free, in
//!   transit and deducted units add up to the initial amounts, nothing in
//!   transit, no customer over the limit, and the orders Redis holds are
//!   exactly those accepted and not refunded per the outcomes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use deductor::domain::event::{Event, Id};
use deductor::ledger::Ledger;
use serde_json::Value;

use super::{Findings, Input};
use crate::workload::Promo;

/// The order ids whose events name a bucketed promotion.
pub fn orders_of(inputs: &[Input], promos: &HashMap<String, Promo>) -> BTreeSet<String> {
    let bucketed = |p: &str| promos.get(p).is_some_and(|x| x.buckets.is_some());
    inputs
        .iter()
        .filter_map(|i| i.parsed.as_ref().ok())
        .filter(|e| match e {
            Event::Placed(p) => p.lines.iter().any(|l| bucketed(l.promotion_id.as_str())),
            Event::Refunded(r) => r.lines.iter().any(|l| bucketed(l.promotion_id.as_str())),
        })
        .map(|e| e.header().order_id.to_string())
        .collect()
}

fn decision(v: &Value) -> String {
    format!(
        "{} {}",
        v["type"].as_str().unwrap_or("?"),
        v["reason"].as_str().unwrap_or("")
    )
}

/// Checks every bucketed promotion; the counts go to the findings' rows.
pub async fn check(
    ledger: &Ledger,
    inputs: &[Input],
    outcomes: &[Value],
    first_outcome: &HashMap<String, usize>,
    promos: &HashMap<String, Promo>,
    found: &mut Findings,
) -> anyhow::Result<()> {
    let orders = orders_of(inputs, promos);
    let (mut split, mut refunds_wrong, mut ledger_wrong) = (0usize, 0usize, 0usize);
    let ev = &mut found.evidence;
    // Per order: the placements' decisions, the refunds' results.
    let mut placed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut applied: BTreeMap<String, usize> = BTreeMap::new();
    let mut nothing: BTreeSet<String> = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for i in inputs {
        let Ok(e) = &i.parsed else { continue };
        let o = e.header().order_id.to_string();
        if !orders.contains(&o) {
            continue;
        }
        let id = e.header().event_id.to_string();
        if !seen.insert(id.clone()) {
            continue;
        }
        let Some(&k) = first_outcome.get(&id) else {
            continue; // (counted by the delivery checks)
        };
        let v = &outcomes[k];
        match e {
            Event::Placed(_) => {
                placed.entry(o).or_default().insert(decision(v));
            }
            Event::Refunded(_) => match v["type"].as_str() {
                Some("RollbackApplied") => *applied.entry(o).or_default() += 1,
                _ if v["reason"] == "no_deduction" => {
                    nothing.insert(o);
                }
                _ => {}
            },
        }
    }
    let mut accepted: BTreeSet<String> = BTreeSet::new();
    for (o, ds) in &placed {
        if ds.len() > 1 {
            split += 1;
            ev.add(
                "bucketed: an order decided two ways",
                format!("{o}: {ds:?}"),
            );
        }
        if ds.iter().any(|d| d.starts_with("DeductAccepted")) {
            accepted.insert(o.clone());
        }
    }
    for (o, n) in &applied {
        if *n > 1 || !accepted.contains(o) {
            refunds_wrong += 1;
            ev.add(
                "bucketed: a refund applied twice or to an order not accepted",
                format!("{o}: applied {n} times, accepted {}", accepted.contains(o)),
            );
        }
    }
    for o in &nothing {
        if accepted.contains(o) {
            refunds_wrong += 1;
            ev.add(
                "bucketed: an order accepted although a refund found nothing of it",
                o.clone(),
            );
        }
    }
    let held = accepted
        .iter()
        .filter(|o| !applied.contains_key(*o))
        .count();
    let mut hot: Vec<&Promo> = promos.values().filter(|p| p.buckets.is_some()).collect();
    hot.sort_by(|a, b| a.id.cmp(&b.id));
    for p in hot {
        let id = Id::parse(&p.id).map_err(|e| anyhow::anyhow!("{e}"))?;
        // Gifts a delivery that crashed after its order was decided by
        // another one left: the service's sweeper (stopped now) or `promo
        // rebalance` finishes them.
        if let Some(layout) = ledger.learn_layout(&id).await? {
            ledger.finish_pending_bucket_ops(&id, &layout).await?;
            ledger.sweep(&layout).await?;
        }
        let Some(a) = deductor::admin::bucketed::audit(ledger, &id).await? else {
            ledger_wrong += 1;
            ev.add("bucketed: the promotion is gone", p.id.clone());
            continue;
        };
        let mut problems: Vec<String> = a.breaches.clone();
        problems.extend(a.unsettled.iter().cloned());
        if a.in_transit.any_pos() {
            problems.push(format!(
                "units in transit after the sweep: {:?}",
                a.in_transit
            ));
        }
        if a.orders_held != held {
            problems.push(format!(
                "Redis holds {} orders, the outcomes {held} (accepted, not refunded)",
                a.orders_held
            ));
        }
        if !problems.is_empty() {
            ledger_wrong += problems.len();
            ev.add(
                "bucketed: ledger",
                format!("{}: {}", p.id, problems.join("; ")),
            );
        }
        found.figures.row(
            &format!("bucketed {}: orders held", p.id),
            a.orders_held,
            false,
        );
    }
    let f = &mut found.figures;
    f.row("bucketed orders", placed.len(), false);
    f.row("bucketed orders decided two ways", split, true);
    f.row("bucketed refunds applied wrongly", refunds_wrong, true);
    f.row("bucketed ledger mismatches", ledger_wrong, true);
    Ok(())
}
