//! Model-based test of the ledger: random sequences of placements (1 to 3
//! lines), refunds (full, partial, some before their placement, some naming
//! another customer), replays of earlier events, zombie deliveries that die
//! half way and are delivered whole later, and operator changes (pause,
//! per-customer limit added or removed, a forced re-seed, a delete and
//! re-create, corrupt promotion data and corrupt records (issue 23: met by
//! redeliveries of multi-line orders, refunds and releases) and their
//! repair), run against the real scripts on Redis AND
//! against a small pure model of CONTRACT.md section 3 written here
//! (`reference`). After
//! every step the decisions, every key under the test's prefix, and the
//! ledger invariant must agree.
//!
//! Cases: `PROPTEST_CASES` (default 64).
//!
//! - `actions`: the random steps a case is made of;
//! - `reference`: the pure model, and the keys it expects;
//! - here: the harness that runs both and compares them.

mod actions;
mod reference;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::redis::*;
use deductor::admin::{self, PromoSpec};
use deductor::domain::decision::{PlaceDecision, RefundDecision};
use deductor::domain::event::{OrderPlaced, OrderRefunded};
use deductor::domain::keys::Keys;
use deductor::ledger::scripts;
use fred::prelude::HashesInterface;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use actions::{action, Action};
use reference::{Model, CORRUPT_COUNTED, CORRUPT_FIELD};

const PROMOS: [&str; 4] = ["scarce", "budget", "pausable", "missing"];
const CUSTOMERS: usize = 3;
const ORDERS: usize = 6;
const WINDOW: (i64, i64) = (1_000, 5_000);

/// The promotions every case starts with; index 3 never exists.
fn specs() -> Vec<PromoSpec> {
    vec![
        // Scarce stock, a per-customer limit and a window.
        PromoSpec {
            budget: Some(100),
            stock: Some(4),
            per_customer: Some(1),
            starts_at: Some(WINDOW.0),
            ends_at: Some(WINDOW.1),
            paused: false,
        },
        // Scarce budget, unlimited stock, two orders per customer.
        PromoSpec {
            budget: Some(60),
            per_customer: Some(2),
            ..PromoSpec::default()
        },
        // Starts paused; the Pause action toggles it.
        PromoSpec {
            budget: Some(1_000),
            stock: Some(100),
            paused: true,
            ..PromoSpec::default()
        },
    ]
}

#[derive(Debug, Clone)]
enum Event {
    Placed(OrderPlaced),
    Refunded(OrderRefunded),
}

#[derive(Debug, Clone, PartialEq)]
enum Decision {
    Place(PlaceDecision),
    Refund(RefundDecision),
}

/// What must not change between deliveries of one event: type, reason,
/// failing promotion, line amounts (not `duplicate` or `remaining`).
/// Whether a decision met corrupt data: a placement rejected
/// corrupt_promotion, or a refund with a line rejected so. (The refund's
/// essence spells its statuses as `Err(CorruptPromotion)`, so a text match
/// on `corrupt_promotion` missed refunds: a replay whose corrupt record was
/// remembered, then repaired, was taken for a second decision.)
fn met_corrupt(d: &Decision) -> bool {
    let corrupt = deductor::domain::decision::Reason::CorruptPromotion;
    match d {
        Decision::Place(PlaceDecision::Rejected { reason, .. }) => *reason == corrupt,
        Decision::Place(_) => false,
        Decision::Refund(r) => r.lines.iter().any(|l| l.status == Err(corrupt)),
    }
}

fn essence(d: &Decision) -> String {
    match d {
        Decision::Place(PlaceDecision::Accepted { lines, .. }) => format!(
            "accepted {:?}",
            lines
                .iter()
                .map(|l| (l.promotion_id.to_string(), l.budget, l.stock))
                .collect::<Vec<_>>()
        ),
        Decision::Place(PlaceDecision::Rejected {
            reason,
            promotion_id,
            ..
        }) => {
            format!("rejected {reason} {promotion_id}")
        }
        Decision::Refund(r) => format!(
            "refund {:?}",
            r.lines
                .iter()
                .map(|l| (l.promotion_id.to_string(), l.status, l.budget, l.stock))
                .collect::<Vec<_>>()
        ),
    }
}

static CASES: AtomicUsize = AtomicUsize::new(0);
static STEPS: AtomicUsize = AtomicUsize::new(0);
static REPLAYS: AtomicUsize = AtomicUsize::new(0);
static ACCEPTED: AtomicUsize = AtomicUsize::new(0);
static BLOCKED: AtomicUsize = AtomicUsize::new(0);
static CORRUPT_RECORDS: AtomicUsize = AtomicUsize::new(0);
static RELAXED: AtomicUsize = AtomicUsize::new(0);

async fn run_case(actions: Vec<Action>, batch_max_lines: usize) -> Result<(), TestCaseError> {
    let r = standalone().await;
    let r = if batch_max_lines > 1 {
        // The same keys through a ledger that batches its placement lines,
        // refund lines, memo reads and releases (deduct_batch.lua,
        // rollback_batch.lua, memo_batch.lua, release_batch.lua; one line a
        // batch here: the steps run in turn).
        let mut s = settings(&r.url, &r.prefix);
        s.batch_max_lines = batch_max_lines;
        let batched = deductor::ledger::Ledger::connect(&s).await.unwrap();
        r.with_ledger(batched).await
    } else {
        r
    };
    let keys = r.keys().clone();
    let mut model = Model::default();
    for i in 0..specs().len() {
        seed(&r, &mut model, i, false).await;
    }
    // The ledger marker the first `promo set` wrote: never touched again.
    model.marker = r.get(&keys.ledger_marker()).await;
    assert!(model.marker.is_some(), "promo set writes the ledger marker");
    // event id -> (event, first decision)
    let mut history: Vec<(Event, Decision)> = Vec::new();
    // Placements a zombie delivery left half done.
    let mut pending: Vec<OrderPlaced> = Vec::new();
    for (step, action) in actions.iter().enumerate() {
        let event = match action {
            Action::Place { order, t, lines } => {
                let lines: Vec<(&str, u64, u64)> =
                    lines.iter().map(|&(p, b, s)| (PROMOS[p], b, s)).collect();
                let e = placed(
                    &format!("e{step}"),
                    &format!("o{order}"),
                    &format!("c{}", order % CUSTOMERS),
                    *t,
                    &lines,
                );
                Some(Event::Placed(e))
            }
            Action::Refund {
                order,
                lines,
                other_customer,
            } => {
                let lines: Vec<(&str, Option<u64>, Option<u64>)> =
                    lines.iter().map(|&(p, b, s)| (PROMOS[p], b, s)).collect();
                let customer = (order + usize::from(*other_customer)) % CUSTOMERS;
                Some(Event::Refunded(refunded(
                    &format!("e{step}"),
                    &format!("o{order}"),
                    &format!("c{customer}"),
                    &lines,
                )))
            }
            Action::Limit(p, limit) => {
                let key = keys.promotion(&id(PROMOS[*p]));
                let fields = &mut model.promos.get_mut(p).unwrap().fields;
                match limit {
                    Some(n) => {
                        r.hset(&key, &[("per_customer", &n.to_string())]).await;
                        fields.insert("per_customer".into(), n.to_string());
                        let m = model.max_limit.entry(*p).or_insert(0);
                        *m = (*m).max(*n);
                    }
                    None => {
                        let _: () = r.pool().hdel(&key, "per_customer").await.unwrap();
                        fields.remove("per_customer");
                    }
                }
                None
            }
            Action::Reseed(p, recreate) => {
                seed(&r, &mut model, *p, !*recreate).await;
                None
            }
            Action::Corrupt(on) => {
                let key = keys.promotion(&id(PROMOS[1]));
                let fields = &mut model.promos.get_mut(&1).unwrap().fields;
                if *on {
                    r.hset(&key, &[CORRUPT_FIELD]).await;
                    fields.insert(CORRUPT_FIELD.0.into(), CORRUPT_FIELD.1.into());
                } else {
                    let _: () = r.pool().hdel(&key, CORRUPT_FIELD.0).await.unwrap();
                    fields.remove(CORRUPT_FIELD.0);
                }
                None
            }
            Action::CorruptRecord(o, on) => {
                let key = keys.record(&id(PROMOS[0]), &id(&format!("o{o}")));
                if let Some(rec) = model.records.get_mut(&(0, *o)) {
                    if *on && !rec.corrupt {
                        r.hset(&key, &[("counted", CORRUPT_COUNTED)]).await;
                        rec.corrupt = true;
                        CORRUPT_RECORDS.fetch_add(1, Ordering::Relaxed);
                    } else if !*on && rec.corrupt {
                        // The operator's repair: the field as it was.
                        match rec.counted {
                            Some(c) => {
                                r.hset(&key, &[("counted", if c { "1" } else { "0" })])
                                    .await
                            }
                            None => {
                                r.hdel(&key, "counted").await;
                            }
                        }
                        rec.corrupt = false;
                    }
                }
                None
            }
            Action::Zombie {
                order,
                t,
                lines,
                upto,
            } => {
                let lines: Vec<(&str, u64, u64)> =
                    lines.iter().map(|&(p, b, s)| (PROMOS[p], b, s)).collect();
                let e = placed(
                    &format!("e{step}"),
                    &format!("o{order}"),
                    &format!("c{}", order % CUSTOMERS),
                    *t,
                    &lines,
                );
                zombie(&r, &e, *upto).await;
                model.zombie(&e, *upto);
                pending.push(e);
                None
            }
            Action::Finish(ix) if !pending.is_empty() => {
                let i = ix.index(pending.len());
                Some(Event::Placed(pending.remove(i)))
            }
            Action::Finish(_) => None,
            Action::Replay(ix) if !history.is_empty() => {
                Some(history[ix.index(history.len())].0.clone())
            }
            Action::Replay(_) => None,
            Action::Pause(paused) => {
                let status = if *paused { "paused" } else { "active" };
                r.hset(&keys.promotion(&id(PROMOS[2])), &[("status", status)])
                    .await;
                model
                    .promos
                    .get_mut(&2)
                    .unwrap()
                    .fields
                    .insert("status".into(), status.into());
                None
            }
        };
        let mut compared = None;
        if let Some(event) = event {
            match &event {
                Event::Placed(e) => {
                    let want = model.place(e);
                    match (r.ledger.place(e).await, want) {
                        (Ok(got), Some(want)) => {
                            compared = Some((event, Decision::Place(got), Decision::Place(want)));
                        }
                        // A release met corrupt data: the lines that could be
                        // were released, the event waits to be delivered
                        // again (the pipeline retries it) after the repair.
                        (Err(err), None) if err.is_release_blocked() => {
                            BLOCKED.fetch_add(1, Ordering::Relaxed);
                            pending.push(e.clone());
                        }
                        (got, want) => {
                            return Err(TestCaseError::fail(format!(
                                "step {step}: {event:?}: ledger {got:?}, model {want:?}"
                            )));
                        }
                    }
                }
                Event::Refunded(e) => {
                    let got = r
                        .ledger
                        .refund(e)
                        .await
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let want = model.refund(e);
                    compared = Some((event, Decision::Refund(got), Decision::Refund(want)));
                }
            }
        }
        if let Some((event, got, want)) = compared {
            prop_assert_eq!(&got, &want, "step {}: {:?}", step, event);
            if matches!(got, Decision::Place(PlaceDecision::Accepted { .. })) {
                ACCEPTED.fetch_add(1, Ordering::Relaxed);
            }
            let event_id = match &event {
                Event::Placed(e) => e.header.event_id.to_string(),
                Event::Refunded(e) => e.header.event_id.to_string(),
            };
            match history.iter().find(|(e, _)| event_key(e) == event_id) {
                // A corrupt record cannot say what it held: a delivery that
                // meets one is rejected corrupt_promotion (and an absorbed
                // event's amounts read 0), even after an acceptance. Only
                // there may a replay differ (contract section 2: corrupt
                // data is a decision of its own); ledger and model still
                // agree step by step.
                Some((_, first)) if model.order_corrupt(order_of(&event)) || met_corrupt(&got) => {
                    REPLAYS.fetch_add(1, Ordering::Relaxed);
                    if essence(first) != essence(&got) {
                        RELAXED.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Some((_, first)) => {
                    REPLAYS.fetch_add(1, Ordering::Relaxed);
                    // One decision per event, also for a second placement
                    // event of one order (absorbed into the first's record).
                    prop_assert_eq!(
                        essence(first),
                        essence(&got),
                        "step {}: replay of {}",
                        step,
                        event_id
                    );
                }
                None => history.push((event, got)),
            }
        }
        let actual = r.dump().await;
        let expected = model.dump(&keys);
        prop_assert_eq!(
            diff(&expected, &actual),
            Vec::<String>::new(),
            "step {}: {:?}",
            step,
            action
        );
        check_invariant(&keys, &actual, &model)?;
        for p in PROMOS {
            if let Err(e) = index_reads_as_the_keyspace(&r.ledger, &id(p)).await {
                return Err(TestCaseError::fail(format!("step {step}: {action:?}: {e}")));
            }
        }
        STEPS.fetch_add(1, Ordering::Relaxed);
    }
    CASES.fetch_add(1, Ordering::Relaxed);
    r.ledger.quit().await;
    Ok(())
}

/// `promo set` of promotion `i`'s spec: created (after a delete when
/// `force` is false and it exists) or force-replaced; a new incarnation.
async fn seed(r: &TestRedis, model: &mut Model, i: usize, force: bool) {
    let p = id(PROMOS[i]);
    if !force {
        r.del(&r.keys().promotion(&p)).await;
    }
    admin::promo_set(&r.ledger, &p, specs()[i].clone(), force)
        .await
        .unwrap();
    // The spec's fields as stored; `gen` is the model's own expectation
    // (the dump comparison checks it).
    let mut fields = r.hgetall(&r.keys().promotion(&p)).await;
    let gen = model.gens.get(&i).copied().unwrap_or(0) + 1;
    fields.insert("gen".into(), gen.to_string());
    model.seeded(i, fields);
}

/// A delivery that runs deduct.lua for the first `upto` lines, then dies.
async fn zombie(r: &TestRedis, e: &OrderPlaced, upto: usize) {
    let h = &e.header;
    for l in e.lines.iter().take(upto) {
        // The service's call (with the day index: a standalone server).
        let ttl = deductor::ledger::calls::Ttls::new(2_592_000, 604_800).indexed(2_592_000);
        let today = deductor::ledger::calls::today();
        let c = deductor::ledger::calls::deduct(r.keys(), &ttl, h, l, today);
        // A corrupt line's error reply is what the zombie saw before dying.
        let _ = r.eval(scripts::DEDUCT.body, c.keys, c.args).await;
    }
}

fn order_of(e: &Event) -> usize {
    let o = match e {
        Event::Placed(e) => e.header.order_id.as_str(),
        Event::Refunded(e) => e.header.order_id.as_str(),
    };
    reference::oidx(o)
}

fn event_key(e: &Event) -> String {
    match e {
        Event::Placed(e) => e.header.event_id.to_string(),
        Event::Refunded(e) => e.header.event_id.to_string(),
    }
}

/// CONTRACT.md section 5, read from Redis alone: initial - remaining ==
/// outstanding of the current incarnation's records, 0 <= remaining <=
/// initial; no customer holds more counted orders than their counter, and
/// no counter is above the highest limit the promotion ever had.
fn check_invariant(keys: &Keys, dump: &Dump, model: &Model) -> Result<(), TestCaseError> {
    let hash = |k: &str| match dump.get(k).map(|d| &d.value) {
        Some(DumpedValue::Hash(h)) => Some(h.clone()),
        _ => None,
    };
    for (i, p) in PROMOS[..3].iter().enumerate() {
        let promo = hash(&keys.promotion(&id(p))).expect("promotion exists");
        let records = keys.record_pattern(&id(p));
        let prefix = records.trim_end_matches('*');
        let recs: Vec<&BTreeMap<String, String>> = dump
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, d)| match &d.value {
                DumpedValue::Hash(h) => h,
                other => panic!("record {other:?}"),
            })
            .collect();
        for dim in ["budget", "stock"] {
            let Some(left) = promo.get(dim) else { continue };
            let left: u64 = left
                .parse()
                .map_err(|_| TestCaseError::fail(format!("{p} {dim} = {left}")))?;
            let initial: u64 = promo[&format!("initial_{dim}")].parse().unwrap();
            prop_assert!(
                left <= initial,
                "{} {} {} > initial {}",
                p,
                dim,
                left,
                initial
            );
            let outstanding: u64 = recs
                .iter()
                .filter(|h| h.get("gen") == promo.get("gen"))
                .map(|h| h[dim].parse::<u64>().unwrap())
                .sum();
            prop_assert_eq!(initial - left, outstanding, "{} {}", p, dim);
        }
        let ceiling = model.max_limit.get(&i).copied();
        for c in 0..CUSTOMERS {
            let cust = format!("c{c}");
            let used = match dump.get(&keys.used(&id(p), &id(&cust))) {
                Some(Dumped {
                    value: DumpedValue::String(n),
                    ..
                }) => n.parse::<u64>().unwrap(),
                _ => 0,
            };
            let held = recs
                .iter()
                .filter(|h| {
                    h.get("state").map(String::as_str) == Some("deducted")
                        && h.get("customer") == Some(&cust)
                        && h.get("counted").map(String::as_str) == Some("1")
                })
                .count() as u64;
            prop_assert!(
                held <= used,
                "{} {} holds {} counted, used {}",
                p,
                cust,
                held,
                used
            );
            if let Some(max) = ceiling {
                prop_assert!(used <= max, "{} {} used {} > {}", p, cust, used, max);
            }
        }
    }
    Ok(())
}

#[test]
fn ledger_agrees_with_the_model() {
    run_model(1, 1);
}

/// The same, through the batch path (`redis.batch_max_lines` 32), with half
/// the cases.
#[test]
fn ledger_agrees_with_the_model_batched() {
    run_model(32, 2);
}

fn run_model(batch_max_lines: usize, fewer: u32) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(64)
        .div_ceil(fewer);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(action(), 40..=80), |actions| {
        rt.block_on(run_case(actions, batch_max_lines))
    });
    println!(
        "ledger model: {} cases passed, {} steps, {} replays, {} accepted placements, {} releases blocked by corrupt data, {} records corrupted, {} replays decided otherwise on a corrupt record (configured cases: {cases})",
        CASES.load(Ordering::Relaxed),
        STEPS.load(Ordering::Relaxed),
        REPLAYS.load(Ordering::Relaxed),
        ACCEPTED.load(Ordering::Relaxed),
        BLOCKED.load(Ordering::Relaxed),
        CORRUPT_RECORDS.load(Ordering::Relaxed),
        RELAXED.load(Ordering::Relaxed),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
