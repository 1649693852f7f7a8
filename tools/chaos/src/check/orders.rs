//! The per-order model (`model.rs`) replayed over each order's events and
//! the first outcome of each.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use deductor::domain::event::Event;

use super::delivery::Sources;
use super::{Findings, Input};
use crate::model::{self, Order};
use crate::operator::Effects;
use crate::workload::Promo;

/// The model's final state of every order, with what could not be
/// verified.
pub struct Replay<'a> {
    pub orders: BTreeMap<String, Order>,
    /// The events of each order, in topic order.
    pub events: BTreeMap<String, Vec<&'a Input>>,
    /// Orders with an event without an outcome, or that broke the model:
    /// their Redis records are not compared.
    pub unverifiable: BTreeSet<String>,
}

/// Replays every order's events, in order, against their first outcomes;
/// counts the orders whose events are spread over partitions and those
/// that break the model (with the order's history as evidence).
pub fn replay<'a>(
    inputs: &'a [Input],
    sources: &Sources<'_>,
    first_outcome: &HashMap<String, usize>,
    promos: &HashMap<String, Promo>,
    fx: &Effects,
    found: &mut Findings,
) -> Replay<'a> {
    let (z, ev) = (&mut found.zeros, &mut found.evidence);
    let mut orders: BTreeMap<String, Order> = BTreeMap::new();
    let mut order_partition: HashMap<String, i32> = HashMap::new();
    let mut seen_events: BTreeSet<String> = BTreeSet::new();
    let mut unverifiable: BTreeSet<String> = BTreeSet::new();
    let mut by_order: BTreeMap<String, Vec<&Input>> = BTreeMap::new();
    for i in inputs {
        if let Ok(e) = &i.parsed {
            by_order
                .entry(e.header().order_id.to_string())
                .or_default()
                .push(i);
        }
    }
    // Orders of a bucketed promotion are decided per order, by other rules:
    // `buckets.rs` checks them.
    let bucketed = super::buckets::orders_of(inputs, promos);
    for (o, evs) in &by_order {
        if bucketed.contains(o) {
            continue;
        }
        let order = orders.entry(o.clone()).or_default();
        for i in evs {
            let Ok(e) = &i.parsed else { continue };
            if *order_partition.entry(o.clone()).or_insert(i.partition) != i.partition {
                z.wrong_partition += 1;
            }
            order.customer = e.header().customer_id.to_string();
            let id = e.header().event_id.to_string();
            if !seen_events.insert(id.clone()) {
                continue; // a repeat: one decision per event covers it
            }
            let Some(&k) = first_outcome.get(&id) else {
                unverifiable.insert(o.clone());
                break;
            };
            let v = &sources.outcomes[k];
            let problem = match e {
                Event::Placed(p) => order.place(p, v, promos, fx).err(),
                Event::Refunded(r) => {
                    let want = order.refund(r, v, fx);
                    let got = model::signature(v);
                    (want != got).then(|| format!("refund expected {want}, got {got}"))
                }
            };
            if let Some(why) = problem {
                z.model_violations += 1;
                ev.add(
                    "order model violations",
                    format!(
                        "order {o}, event {id}: {why}\n{}",
                        history(evs, sources).join("\n")
                    ),
                );
                unverifiable.insert(o.clone());
                break;
            }
        }
    }
    z.unverifiable = unverifiable.len() - z.model_violations.min(unverifiable.len());
    Replay {
        orders,
        events: by_order,
        unverifiable,
    }
}

/// An order's events with the decisions of their outcomes, one a line.
fn history(evs: &[&Input], sources: &Sources<'_>) -> Vec<String> {
    evs.iter()
        .map(|x| {
            let id = x
                .parsed
                .as_ref()
                .map(|e| e.header().event_id.to_string())
                .unwrap_or_default();
            let outs: Vec<String> = sources
                .outcomes_at((x.partition, x.offset))
                .iter()
                .map(|&k| model::signature(&sources.outcomes[k]))
                .collect();
            format!(
                "    p{} o{} {id} {} -> {outs:?}",
                x.partition,
                x.offset,
                String::from_utf8_lossy(&x.payload)
            )
        })
        .collect()
}
