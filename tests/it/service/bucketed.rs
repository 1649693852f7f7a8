//! A bucketed hot promotion through `deductor run` (a child process) on
//! the real Kafka and Redis, killed (SIGKILL) in the middle of the sale
//! with nothing committed and started again: every event gets one
//! decision, the units add up (sold minus refunded is what left the
//! buckets, nothing in transit or set aside), sold to the last unit, and
//! the per-customer limit holds across the buckets.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::common::kafka;
use crate::common::service::{self, Fixture};
use deductor::admin::bucketed;
use deductor::admin::{promo_show, PromoSpec};
use deductor::domain::event::Id;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(90);
const STOCK: u64 = 200;
/// Orders, and customers (ORDERS - CUSTOMERS of them order twice).
const ORDERS: u32 = 1_600;
const CUSTOMERS: u32 = 1_400;

fn placed(e: &str, o: &str, c: &str) -> Value {
    json!({"type": "OrderPlaced", "event_id": e, "order_id": o, "customer_id": c,
           "occurred_at": "2026-11-29T10:00:00Z",
           "lines": [{"promotion_id": "flash", "budget": 100, "stock": 1}]})
}

fn refunded(e: &str, o: &str, c: &str) -> Value {
    json!({"type": "OrderRefunded", "event_id": e, "order_id": o, "customer_id": c,
           "occurred_at": "2026-11-30T08:00:00Z",
           "lines": [{"promotion_id": "flash"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucketed_sale_survives_a_kill_and_decides_each_event_once() {
    let f = Fixture::new("bucketed", 3).await;
    let ledger = f.ledger().await;
    let p = Id::parse("flash").unwrap();
    bucketed::create(
        &ledger,
        &p,
        PromoSpec {
            budget: Some(100 * STOCK),
            stock: Some(STOCK),
            per_customer: Some(1),
            ..PromoSpec::default()
        },
        3,
    )
    .await
    .expect("promo set --buckets 3");

    // 1,600 orders for 200 units (customers c0..c1399: two hundred of
    // them order twice), and a refund after every eighth order of an order
    // eight back (accepted or not), one in three naming another customer.
    let mut events = Vec::new();
    for n in 0..ORDERS {
        events.push(placed(
            &format!("p{n}"),
            &format!("o{n}"),
            &format!("c{}", n % CUSTOMERS),
        ));
        if n % 8 == 7 {
            let o = n - 7;
            let c = if n % 3 == 0 {
                "stranger".to_owned()
            } else {
                format!("c{}", o % CUSTOMERS)
            };
            events.push(refunded(&format!("r{o}"), &format!("o{o}"), &c));
        }
    }
    kafka::produce_events(&f.topics.input, &events).await;

    // The first process never commits; killed mid-sale.
    let env = f.env(&[("pipeline.commit_interval_ms", "3600000")]);
    let mut child = service::spawn(&env, &["run"]);
    kafka::read_until(&f.topics.outcome, WAIT, |rs| rs.len() >= 300).await;
    child.assert_running();
    child.kill();
    let _first = child;
    let child = service::spawn(&f.env(&[]), &["run"]);
    let (outcomes, dlq) = service::finish_child(&f, child, WAIT).await;
    assert!(dlq.is_empty(), "no dead letters: {}", dlq.len());

    // One decision per event (redelivered ones repeat it).
    let mut decision: BTreeMap<String, (String, String)> = BTreeMap::new();
    for r in &outcomes {
        let v = r.json();
        let e = v["event_id"].as_str().unwrap().to_owned();
        let d = (
            v["type"].as_str().unwrap().to_owned(),
            v["reason"].as_str().unwrap_or("").to_owned(),
        );
        if let Some(before) = decision.insert(e.clone(), d.clone()) {
            assert_eq!(before, d, "event {e} decided twice differently");
        }
    }
    assert_eq!(decision.len(), events.len(), "every event has an outcome");
    let redelivered = outcomes.len() - decision.len();

    // The units add up.
    let accepted: BTreeSet<String> = (0..ORDERS)
        .filter(|n| decision[&format!("p{n}")].0 == "DeductAccepted")
        .map(|n| format!("o{n}"))
        .collect();
    let refunded: BTreeSet<String> = decision
        .iter()
        .filter(|(e, d)| e.starts_with('r') && d.0 == "RollbackApplied")
        .map(|(e, _)| format!("o{}", &e[1..]))
        .collect();
    assert!(
        refunded.is_subset(&accepted),
        "only deductions are refunded"
    );
    let held = accepted.len() - refunded.len();
    let shown = promo_show(&ledger, &p).await.unwrap().unwrap();
    let buckets = shown.buckets.clone().unwrap();
    assert!(
        buckets
            .iter()
            .all(|b| b.held_stock == 0 && b.set_stock == 0),
        "nothing in transit or set aside: {shown}"
    );
    assert_eq!(
        shown.stock,
        Some(STOCK - held as u64),
        "sold {} refunded {}: {shown}",
        accepted.len(),
        refunded.len()
    );
    // Demand was eight times the stock: sold to the last unit, but for the
    // units refunds gave back after the last order that could take them.
    assert!(accepted.len() >= STOCK as usize, "{} sold", accepted.len());
    // The limit across buckets: no customer holds two deductions.
    let mut holds: BTreeMap<u32, usize> = BTreeMap::new();
    for o in accepted.difference(&refunded) {
        let n: u32 = o[1..].parse().unwrap();
        *holds.entry(n % CUSTOMERS).or_default() += 1;
    }
    assert!(holds.values().all(|h| *h <= 1), "{holds:?}");
    println!(
        "bucketed sale: {} events, {redelivered} redelivered outcomes, {} sold, {} refunded, \
         stock left {:?}",
        events.len(),
        accepted.len(),
        refunded.len(),
        shown.stock
    );
    f.cleanup().await;
}
