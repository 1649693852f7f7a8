//! A generated event stream for the fault tests (redelivery, crash loop,
//! rebalance, outages) and the checks they share: every event has an
//! outcome (or dead letter), every event has one decision, and Redis holds
//! exactly what the decisions add up to.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use deductor::admin::audit;
use deductor::admin::{self, PromoSpec};
use deductor::domain::event::Id;
use deductor::ledger::Ledger;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::kafka::{self, Raw, Record};
use super::service::Fixture;

pub const PLACED_AT: &str = "2026-11-29T10:00:00Z";
pub const REFUNDED_AT: &str = "2026-11-30T08:00:00Z";

/// What to generate.
#[derive(Debug, Clone)]
pub struct Shape {
    pub orders: usize,
    pub customers: usize,
    pub promotions: usize,
    /// Stock of each promotion (scarce: fewer than the orders wanting it).
    pub stock: u64,
    pub budget: u64,
    pub per_customer: Option<u64>,
    /// Share of placements (and refunds) sent twice.
    pub duplicate_rate: f64,
    /// Share of orders refunded later (half fully, half partly).
    pub refund_rate: f64,
    /// One invalid event per this many orders (0: none).
    pub invalid_every: usize,
    pub seed: u64,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape {
            orders: 1000,
            customers: 300,
            promotions: 4,
            stock: 150,
            budget: 10_000_000,
            per_customer: Some(1),
            duplicate_rate: 0.1,
            refund_rate: 0.15,
            invalid_every: 100,
            seed: 7,
        }
    }
}

/// What one input record should produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// An outcome for this event id.
    Outcome(String),
    /// An invalid event with a readable id: dead letter and `invalid_event` outcome.
    Invalid(String),
    /// Unreadable: a dead letter only (identified by its payload).
    DeadLetter,
}

#[derive(Debug, Clone)]
pub struct Item {
    pub raw: Raw,
    pub expect: Expect,
}

/// The generated stream, in produce order.
#[derive(Debug, Clone)]
pub struct Workload {
    pub promotions: Vec<(String, PromoSpec)>,
    pub items: Vec<Item>,
}

fn event_item(v: Value) -> Item {
    let id = v["event_id"].as_str().unwrap().to_owned();
    Item {
        raw: Raw {
            key: Some(v["order_id"].as_str().unwrap().as_bytes().to_vec()),
            payload: Some(serde_json::to_vec(&v).unwrap()),
            ..Raw::default()
        },
        expect: Expect::Outcome(id),
    }
}

/// Generates a stream: placements of 1 or 2 lines on scarce promotions,
/// duplicates, full and partial refunds (always after their placement, so
/// G2 decides them in order), and a few invalid events.
pub fn generate(tag: &str, shape: &Shape) -> Workload {
    let mut rng = rand::rngs::StdRng::seed_from_u64(shape.seed);
    let promos: Vec<String> = (0..shape.promotions).map(|i| format!("p{i}")).collect();
    let promotions = promos
        .iter()
        .map(|p| {
            (
                p.clone(),
                PromoSpec {
                    budget: Some(shape.budget),
                    stock: Some(shape.stock),
                    per_customer: shape.per_customer,
                    ..PromoSpec::default()
                },
            )
        })
        .collect();
    // (position, sequence, item): sorting by position keeps every follow-up
    // after the event it follows.
    let mut slots: Vec<(f64, usize, Item)> = Vec::new();
    let mut seq = 0usize;
    let mut push = |slots: &mut Vec<(f64, usize, Item)>, pos: f64, item: Item| {
        seq += 1;
        slots.push((pos, seq, item));
    };
    for i in 0..shape.orders {
        let order = format!("{tag}-o{i}");
        let customer = format!("c{}", rng.random_range(0..shape.customers));
        let n = if rng.random_bool(0.3) { 2 } else { 1 };
        let chosen: Vec<&String> = promos.choose_multiple(&mut rng, n).collect();
        let lines: Vec<Value> = chosen
            .iter()
            .map(|p| json!({"promotion_id": p, "budget": rng.random_range(1..=500u64), "stock": 1}))
            .collect();
        let placed = json!({"type": "OrderPlaced", "event_id": format!("{tag}-e{i}"),
            "order_id": order, "customer_id": customer, "occurred_at": PLACED_AT, "lines": lines});
        let pos = i as f64;
        push(&mut slots, pos, event_item(placed.clone()));
        if rng.random_bool(shape.duplicate_rate) {
            push(
                &mut slots,
                pos + rng.random_range(1.0..40.0),
                event_item(placed.clone()),
            );
        }
        if rng.random_bool(shape.refund_rate) {
            let partial = rng.random_bool(0.5);
            let rlines: Vec<Value> = lines
                .iter()
                .map(|l| {
                    if partial {
                        json!({"promotion_id": l["promotion_id"], "budget": l["budget"].as_u64().unwrap() / 2})
                    } else {
                        json!({"promotion_id": l["promotion_id"]})
                    }
                })
                .collect();
            let refund = json!({"type": "OrderRefunded", "event_id": format!("{tag}-r{i}"),
                "order_id": order, "customer_id": customer, "occurred_at": REFUNDED_AT, "lines": rlines});
            let rpos = pos + rng.random_range(1.0..80.0);
            push(&mut slots, rpos, event_item(refund.clone()));
            if rng.random_bool(shape.duplicate_rate) {
                push(
                    &mut slots,
                    rpos + rng.random_range(1.0..20.0),
                    event_item(refund),
                );
            }
        }
        if shape.invalid_every > 0 && i % shape.invalid_every == shape.invalid_every / 2 {
            let item = if (i / shape.invalid_every) % 2 == 0 {
                let id = format!("{tag}-x{i}");
                let bad = json!({"type": "OrderPlaced", "event_id": id, "order_id": format!("{tag}-xo{i}"),
                    "customer_id": "c0", "occurred_at": PLACED_AT,
                    "lines": [{"promotion_id": "p0", "budget": 1.5}]});
                Item {
                    raw: Raw {
                        key: Some(format!("{tag}-xo{i}").into_bytes()),
                        payload: Some(serde_json::to_vec(&bad).unwrap()),
                        ..Raw::default()
                    },
                    expect: Expect::Invalid(id),
                }
            } else {
                Item {
                    raw: Raw {
                        key: Some(format!("{tag}-g{i}").into_bytes()),
                        payload: Some(format!("garbage {tag} {i}").into_bytes()),
                        ..Raw::default()
                    },
                    expect: Expect::DeadLetter,
                }
            };
            push(&mut slots, pos + 0.5, item);
        }
    }
    slots.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    Workload {
        promotions,
        items: slots.into_iter().map(|(_, _, it)| it).collect(),
    }
}

impl Workload {
    /// Creates the promotions under the fixture's prefix.
    pub async fn seed(&self, f: &Fixture, ledger: &Ledger) {
        for (p, spec) in &self.promotions {
            f.promo(ledger, p, spec.clone()).await;
        }
    }

    /// Event ids that must get an outcome.
    pub fn event_ids(&self) -> BTreeSet<String> {
        self.items
            .iter()
            .filter_map(|i| match &i.expect {
                Expect::Outcome(id) | Expect::Invalid(id) => Some(id.clone()),
                Expect::DeadLetter => None,
            })
            .collect()
    }

    /// Input records that must produce an outcome (each delivery one).
    pub fn expected_outcomes(&self) -> usize {
        self.items
            .iter()
            .filter(|i| i.expect != Expect::DeadLetter)
            .count()
    }

    /// Payloads that must reach the dead-letter topic.
    pub fn dead_letters(&self) -> BTreeSet<Vec<u8>> {
        self.items
            .iter()
            .filter(|i| matches!(i.expect, Expect::DeadLetter | Expect::Invalid(_)))
            .map(|i| i.raw.payload.clone().unwrap())
            .collect()
    }

    /// Produces items `range` of the stream.
    pub async fn produce(&self, topic: &str, range: std::ops::Range<usize>) {
        let raws: Vec<Raw> = self.items[range].iter().map(|i| i.raw.clone()).collect();
        kafka::produce_raw(topic, &raws).await;
    }

    /// Produces the whole stream in chunks of `chunk`, pausing `pause`
    /// between chunks (so the service works while faults are injected).
    pub async fn produce_paced(&self, topic: String, chunk: usize, pause: Duration) {
        let mut at = 0;
        while at < self.items.len() {
            let end = (at + chunk).min(self.items.len());
            self.produce(&topic, at..end).await;
            at = end;
            tokio::time::sleep(pause).await;
        }
    }

    /// Reads the outcome and dead-letter topics until every event has an
    /// outcome and every dead letter is there.
    pub async fn wait_done(&self, f: &Fixture, timeout: Duration) -> (Vec<Record>, Vec<Record>) {
        // The conditions look at each record once: they run after every
        // record read.
        let mut missing = self.event_ids();
        let mut looked = 0;
        let outcomes = kafka::read_until(&f.topics.outcome, timeout, |rs| {
            for r in &rs[looked..] {
                let v: Value = serde_json::from_slice(r.payload.as_deref().unwrap_or_default())
                    .unwrap_or_default();
                if let Some(id) = v["event_id"].as_str() {
                    missing.remove(id);
                }
            }
            looked = rs.len();
            missing.is_empty()
        })
        .await;
        let mut letters = self.dead_letters();
        let mut looked = 0;
        let dlq = kafka::read_until(&f.topics.dlq, timeout, |rs| {
            for r in &rs[looked..] {
                letters.remove(r.payload.as_deref().unwrap_or_default());
            }
            looked = rs.len();
            letters.is_empty()
        })
        .await;
        (outcomes, dlq)
    }
}

/// The figures of one run, for the issue note.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// Input records produced.
    pub records: usize,
    /// Distinct events that must get an outcome.
    pub events: usize,
    pub outcomes: usize,
    pub dead_letters: usize,
    /// Events without an outcome plus unreadable records without a dead letter.
    pub lost: usize,
    /// Events whose outcomes disagree (type, reason, promotion, lines, outcome_id).
    pub split_decisions: usize,
    /// Outcomes beyond one per input record: redeliveries.
    pub duplicate_outcomes: i64,
    /// Events with more than one outcome not marked `duplicate` (applied twice).
    pub applied_twice: usize,
    /// Placements rejected `order_reverted`: a refund overtook its placement (G2).
    pub overtaken: usize,
    pub accepted: usize,
    pub rejected: BTreeMap<String, usize>,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "records {}, events {}, outcomes {}, dead letters {}, lost {}, split decisions {}, duplicate outcomes {}, applied twice {}, overtaken {}, accepted {}, rejected {:?}",
            self.records,
            self.events,
            self.outcomes,
            self.dead_letters,
            self.lost,
            self.split_decisions,
            self.duplicate_outcomes,
            self.applied_twice,
            self.overtaken,
            self.accepted,
            self.rejected
        )
    }
}

/// What must agree between every outcome of one event.
fn decision(v: &Value) -> Value {
    let lines: Vec<Value> = v["lines"]
        .as_array()
        .map(|ls| {
            ls.iter()
                .map(|l| json!([l["promotion_id"], l["budget"], l["stock"], l["status"]]))
                .collect()
        })
        .unwrap_or_default();
    json!([
        v["type"],
        v["outcome_id"],
        v["reason"],
        v["promotion_id"],
        lines
    ])
}

/// Checks the run and returns its figures; panics (after printing the
/// figures) on any breach: a lost event, a split decision, an event applied
/// twice, a refund overtaking its placement, Redis counters that differ from
/// the decisions, or a ledger invariant breach.
pub async fn verify(
    label: &str,
    w: &Workload,
    outcomes: &[Record],
    dlq: &[Record],
    ledger: &Ledger,
) -> Figures {
    let mut fig = Figures {
        records: w.items.len(),
        outcomes: outcomes.len(),
        dead_letters: dlq.len(),
        ..Figures::default()
    };
    let want = w.event_ids();
    fig.events = want.len();
    let mut by_event: HashMap<String, Vec<Value>> = HashMap::new();
    for r in outcomes {
        let v = r.json();
        assert_eq!(
            r.key_str().as_deref(),
            v["order_id"].as_str(),
            "outcome keyed by order_id"
        );
        let id = v["event_id"].as_str().unwrap_or("<none>").to_owned();
        by_event.entry(id).or_default().push(v);
    }
    let lost_events: Vec<&String> = want
        .iter()
        .filter(|id| !by_event.contains_key(*id))
        .collect();
    let seen_dl: BTreeSet<&[u8]> = dlq.iter().filter_map(|r| r.payload.as_deref()).collect();
    let lost_letters = w
        .dead_letters()
        .iter()
        .filter(|p| !seen_dl.contains(p.as_slice()))
        .count();
    fig.lost = lost_events.len() + lost_letters;
    fig.duplicate_outcomes = outcomes.len() as i64 - w.expected_outcomes() as i64;

    let mut split = Vec::new();
    let mut twice = Vec::new();
    // promotion -> (budget, stock) deducted minus returned, from the decisions
    let mut model: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for (id, vs) in &by_event {
        let first = decision(&vs[0]);
        if vs.iter().any(|v| decision(v) != first) {
            split.push(id.clone());
        }
        let v = &vs[0];
        let fresh = vs.iter().filter(|v| v["duplicate"] == json!(false)).count();
        if fresh > 1 && v["reason"] != json!("invalid_event") {
            twice.push(id.clone());
        }
        match v["type"].as_str().unwrap_or_default() {
            "DeductAccepted" => {
                fig.accepted += 1;
                for l in v["lines"].as_array().unwrap() {
                    let e = model
                        .entry(l["promotion_id"].as_str().unwrap().to_owned())
                        .or_default();
                    e.0 += l["budget"].as_i64().unwrap();
                    e.1 += l["stock"].as_i64().unwrap();
                }
            }
            "RollbackApplied" => {
                for l in v["lines"].as_array().unwrap() {
                    if l["status"] == json!("applied") {
                        let e = model
                            .entry(l["promotion_id"].as_str().unwrap().to_owned())
                            .or_default();
                        e.0 -= l["budget"].as_i64().unwrap();
                        e.1 -= l["stock"].as_i64().unwrap();
                    }
                }
            }
            _ => {}
        }
        if let Some(reason) = v["reason"].as_str() {
            *fig.rejected.entry(reason.to_owned()).or_default() += 1;
            if reason == "order_reverted" {
                fig.overtaken += 1;
            }
        }
    }
    fig.split_decisions = split.len();
    fig.applied_twice = twice.len();
    println!("{label}: {fig}");

    assert!(
        lost_events.is_empty(),
        "{label}: events without an outcome: {lost_events:?}"
    );
    assert_eq!(
        lost_letters, 0,
        "{label}: unreadable records without a dead letter"
    );
    if let Some(id) = split.first() {
        panic!(
            "{label}: event {id} has different decisions: {:#?}",
            by_event[id]
        );
    }
    assert!(
        twice.is_empty(),
        "{label}: events applied twice (several non-duplicate outcomes): {twice:?}"
    );
    assert_eq!(
        fig.overtaken, 0,
        "{label}: a refund was decided before its placement (G2)"
    );
    assert!(
        fig.duplicate_outcomes >= 0,
        "{label}: fewer outcomes than input records"
    );

    // Redis: what the decisions add up to, and the ledger invariant.
    for (p, spec) in &w.promotions {
        let id = Id::parse(p).unwrap();
        let view = admin::promo_show(ledger, &id)
            .await
            .unwrap()
            .expect("promotion exists");
        let (db, ds) = model.get(p).copied().unwrap_or_default();
        let used_budget = spec.budget.unwrap() as i64 - view.budget.unwrap() as i64;
        let used_stock = spec.stock.unwrap() as i64 - view.stock.unwrap() as i64;
        assert_eq!(
            (used_budget, used_stock),
            (db, ds),
            "{label}: promotion {p}: Redis counters (initial - remaining) differ from the decisions (accepted - refunded)"
        );
        let report = audit::audit_one(ledger, &id).await.unwrap();
        if let Err(e) = super::redis::index_reads_as_the_keyspace(ledger, &id).await {
            panic!("{label}: {e}");
        }
        assert!(
            report.breaches.is_empty(),
            "{label}: ledger invariant of {p}: {:?}",
            report.breaches
        );
        assert!(
            report.stock.unwrap() >= 0,
            "{label}: stock of {p} below zero"
        );
    }
    fig
}
