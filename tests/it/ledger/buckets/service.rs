//! A bucketed promotion through the service's own entry points, on a real
//! Redis and on the 3-node Cluster: `promo set --buckets` (the admin
//! function the CLI calls), then `Ledger::place` / `Ledger::refund`, which
//! learn that the promotion is bucketed from the plain scripts' refusal
//! (`BUCKETED`) and walk its buckets. Many events at once, their
//! redeliveries, refunds (one naming another customer), the per-customer
//! limit, orders mixing a bucketed and a plain line, pause and resume, and
//! the operator commands refused on a bucketed promotion.

use std::collections::BTreeMap;

use deductor::admin::bucketed;
use deductor::admin::{promo_set, promo_show, AdminError, PromoSpec};
use deductor::domain::decision::{PlaceDecision, Reason};
use deductor::domain::event::{OrderPlaced, OrderRefunded};
use deductor::ledger::Ledger;
use futures::stream::{self, StreamExt};

use crate::common::redis::{cluster, placed, refunded, standalone, TestRedis};

const AT: i64 = 1_800_000_000;

fn spec(budget: u64, stock: u64, per_customer: Option<u64>) -> PromoSpec {
    PromoSpec {
        budget: Some(budget),
        stock: Some(stock),
        per_customer,
        ..PromoSpec::default()
    }
}

/// Places `events`, `width` at a time.
async fn place_all(ledger: &Ledger, events: &[OrderPlaced], width: usize) -> Vec<PlaceDecision> {
    stream::iter(events)
        .map(|e| async move { ledger.place(e).await.expect("place") })
        .buffered(width)
        .collect()
        .await
}

fn reason(d: &PlaceDecision) -> Option<Reason> {
    match d {
        PlaceDecision::Accepted { .. } => None,
        PlaceDecision::Rejected { reason, .. } => Some(*reason),
    }
}

fn duplicate(d: &PlaceDecision) -> bool {
    match d {
        PlaceDecision::Accepted { duplicate, .. } | PlaceDecision::Rejected { duplicate, .. } => {
            *duplicate
        }
    }
}

fn tally(ds: &[PlaceDecision]) -> BTreeMap<String, usize> {
    let mut t = BTreeMap::new();
    for d in ds {
        let k = reason(d).map_or("accepted".to_owned(), |r| r.as_str().to_owned());
        *t.entry(k).or_default() += 1;
    }
    t
}

/// `promo show`'s remaining (budget, stock) and whether every bucket has
/// nothing in transit or set aside.
async fn remaining(r: &TestRedis, p: &str) -> (u64, u64, bool) {
    let v = promo_show(&r.ledger, &crate::common::redis::id(p))
        .await
        .expect("promo show")
        .expect("the promotion");
    let b = v
        .buckets
        .as_ref()
        .expect("a bucketed promotion shows its buckets");
    let idle = b
        .iter()
        .all(|x| x.held_budget == 0 && x.held_stock == 0 && x.set_budget == 0 && x.set_stock == 0);
    (v.budget.unwrap_or(0), v.stock.unwrap_or(0), idle)
}

async fn a_sale(r: TestRedis) {
    let which = if r.cluster { "Cluster" } else { "standalone" };
    let p = crate::common::redis::id("hot");
    // Created after the ledger connected: it learns on the first line.
    bucketed::create(&r.ledger, &p, spec(3_000, 30, Some(1)), 3)
        .await
        .expect("promo set --buckets 3");
    let shown = promo_show(&r.ledger, &p).await.unwrap().unwrap();
    assert_eq!(shown.buckets.as_ref().map(Vec::len), Some(3), "{shown}");
    assert_eq!((shown.budget, shown.stock), (Some(3_000), Some(30)));

    // 90 orders of 90 customers for 30 units, 16 at a time.
    let events: Vec<OrderPlaced> = (0..90)
        .map(|n| {
            placed(
                &format!("e{n:03}"),
                &format!("o{n:03}"),
                &format!("c{n:03}"),
                AT,
                &[("hot", 100, 1)],
            )
        })
        .collect();
    let first = place_all(&r.ledger, &events, 16).await;
    let t = tally(&first);
    println!("{which}: {t:?}");
    assert_eq!(t.get("accepted"), Some(&30), "{t:?}");
    for d in &first {
        assert!(
            matches!(
                reason(d),
                None | Some(Reason::StockInsufficient | Reason::BudgetExceeded)
            ),
            "{d:?}"
        );
        assert!(!duplicate(d), "a first delivery: {d:?}");
    }
    assert_eq!(
        remaining(&r, "hot").await,
        (0, 0, true),
        "sold out, nothing stranded"
    );

    // Every event again: the same decisions, each a duplicate.
    let again = place_all(&r.ledger, &events, 16).await;
    for (a, b) in first.iter().zip(&again) {
        assert_eq!(reason(a), reason(b), "one decision per event");
        assert!(duplicate(b), "{b:?}");
    }

    // Ten accepted orders refunded, one of them naming another customer.
    let sold: Vec<usize> = (0..90).filter(|n| reason(&first[*n]).is_none()).collect();
    for (i, n) in sold.iter().take(10).enumerate() {
        let customer = if i == 0 {
            "someone-else".to_owned()
        } else {
            format!("c{n:03}")
        };
        let e: OrderRefunded = refunded(
            &format!("r{n:03}"),
            &format!("o{n:03}"),
            &customer,
            &[("hot", None, None)],
        );
        let d = r.ledger.refund(&e).await.expect("refund");
        assert_eq!(d.lines[0].status, Ok(()), "{d:?}");
        assert_eq!((d.lines[0].budget, d.lines[0].stock), (100, 1));
        // Delivered again: the same answer, nothing more given back.
        let d2 = r.ledger.refund(&e).await.expect("refund again");
        assert_eq!(d2.lines[0].status, Ok(()), "{d2:?}");
    }
    assert_eq!(remaining(&r, "hot").await, (1_000, 10, true));
    // A refund of an order never placed: no_deduction, and the order, placed
    // late, is rejected order_reverted.
    let ghost = refunded("r-ghost", "o-ghost", "c-ghost", &[("hot", None, None)]);
    let d = r.ledger.refund(&ghost).await.unwrap();
    assert_eq!(d.lines[0].status, Err(Reason::NoDeduction));
    let late = placed("e-ghost", "o-ghost", "c-ghost", AT, &[("hot", 100, 1)]);
    assert_eq!(
        reason(&r.ledger.place(&late).await.unwrap()),
        Some(Reason::OrderReverted)
    );

    // The per-customer limit across buckets: the first refunded customer
    // got their slot back (the refund acted on the stored customer), the
    // others of the sold orders still hold theirs.
    let held = sold[12];
    let over = placed(
        "e-over",
        "o-over",
        &format!("c{held:03}"),
        AT,
        &[("hot", 100, 1)],
    );
    assert_eq!(
        reason(&r.ledger.place(&over).await.unwrap()),
        Some(Reason::UserLimitReached)
    );
    let back = placed(
        "e-back",
        "o-back",
        &format!("c{:03}", sold[0]),
        AT,
        &[("hot", 100, 1)],
    );
    assert_eq!(reason(&r.ledger.place(&back).await.unwrap()), None);

    // `order show`: a refunded order and a held one, with or without
    // naming the promotion.
    for named in [None, Some(&p)] {
        let v = deductor::admin::lookup::order_show(
            &r.ledger,
            &crate::common::redis::id(&format!("o{:03}", sold[1])),
            named,
        )
        .await
        .unwrap();
        let w = v.words();
        assert!(
            w.contains("hot: reverted") && w.contains("at bucket {hot~"),
            "{w}"
        );
        let v = deductor::admin::lookup::order_show(
            &r.ledger,
            &crate::common::redis::id(&format!("o{:03}", sold[12])),
            named,
        )
        .await
        .unwrap();
        assert_eq!(v.records.len(), 1, "{v:?}");
        let j = v.to_json();
        assert_eq!(j["records"][0]["state"], "deducted", "{j}");
        assert_eq!(j["records"][0]["stock"], 1, "{j}");
        assert_eq!(
            j["records"][0]["customer_id"],
            format!("c{:03}", sold[12]),
            "{j}"
        );
    }

    // Twenty more orders buy exactly the nine units left.
    let more: Vec<OrderPlaced> = (0..20)
        .map(|n| {
            placed(
                &format!("m{n:03}"),
                &format!("om{n:03}"),
                &format!("cm{n:03}"),
                AT,
                &[("hot", 100, 1)],
            )
        })
        .collect();
    let t = tally(&place_all(&r.ledger, &more, 8).await);
    assert_eq!(t.get("accepted"), Some(&9), "{t:?}");
    assert_eq!(remaining(&r, "hot").await, (0, 0, true));

    // Paused: rejected promotion_inactive, remembered after the resume.
    assert_eq!(
        bucketed::set_paused(&r.ledger, &p, true).await.unwrap(),
        Some(true)
    );
    let paused = placed("e-paused", "o-paused", "c-paused", AT, &[("hot", 100, 1)]);
    let d = r.ledger.place(&paused).await.unwrap();
    assert_eq!(reason(&d), Some(Reason::PromotionInactive));
    assert_eq!(
        bucketed::set_paused(&r.ledger, &p, false).await.unwrap(),
        Some(true)
    );
    let d = r.ledger.place(&paused).await.unwrap();
    assert_eq!(
        reason(&d),
        Some(Reason::PromotionInactive),
        "one decision per event"
    );
    assert!(duplicate(&d));

    // `audit`: the units add up, nobody over the limit; a unit slipped
    // into a bucket is a breach.
    let a = bucketed::audit(&r.ledger, &p)
        .await
        .unwrap()
        .expect("bucketed");
    assert!(a.breaches.is_empty() && a.unsettled.is_empty(), "{a:?}");
    assert_eq!((a.orders_held, a.max_per_customer), (30, 1), "{a:?}");
    let dir = [("buckets".to_owned(), "3".to_owned())].into();
    let key = bucketed::buckets_of(&r.ledger, &p, &dir)
        .await
        .unwrap()
        .unwrap()[1]
        .key
        .clone();
    let _: i64 = fred::prelude::HashesInterface::hincrby(r.pool(), &key, "stock", 1)
        .await
        .unwrap();
    let a = bucketed::audit(&r.ledger, &p).await.unwrap().unwrap();
    assert_eq!(a.breaches.len(), 1, "{a:?}");
}

#[tokio::test]
async fn a_bucketed_sale_through_the_ledger() {
    a_sale(standalone().await).await;
}

#[tokio::test]
async fn a_bucketed_sale_through_the_ledger_on_the_cluster() {
    a_sale(cluster().await).await;
}

/// Orders of a bucketed and a plain promotion: all or nothing, either way
/// round; a refund of an accepted one gives both back.
async fn mixed(r: TestRedis) {
    let p = crate::common::redis::id("mixhot");
    bucketed::create(&r.ledger, &p, spec(1_000, 2, None), 3)
        .await
        .unwrap();
    promo_set(
        &r.ledger,
        &crate::common::redis::id("plain"),
        spec(1_000, 3, None),
        false,
    )
    .await
    .unwrap();
    // Accepted: one unit of each.
    let a = placed(
        "x1",
        "ox1",
        "c1",
        AT,
        &[("plain", 10, 1), ("mixhot", 10, 1)],
    );
    assert_eq!(reason(&r.ledger.place(&a).await.unwrap()), None);
    let b = placed(
        "x2",
        "ox2",
        "c2",
        AT,
        &[("mixhot", 10, 1), ("plain", 10, 1)],
    );
    assert_eq!(reason(&r.ledger.place(&b).await.unwrap()), None);
    // The bucketed promotion sold out: the plain line before it goes back.
    let c = placed(
        "x3",
        "ox3",
        "c3",
        AT,
        &[("plain", 10, 1), ("mixhot", 10, 1)],
    );
    let d = r.ledger.place(&c).await.unwrap();
    assert!(
        matches!(
            reason(&d),
            Some(Reason::StockInsufficient | Reason::BudgetExceeded)
        ),
        "{d:?}"
    );
    assert_eq!(r.promo_field("plain", "stock").await.as_deref(), Some("1"));
    // Redelivered: the same rejection, read back.
    let d2 = r.ledger.place(&c).await.unwrap();
    assert_eq!(reason(&d2), reason(&d));
    assert!(duplicate(&d2), "{d2:?}");
    // A refund of an accepted mixed order gives both lines back.
    let refund = refunded(
        "rx1",
        "ox1",
        "c1",
        &[("plain", None, None), ("mixhot", None, None)],
    );
    let rd = r.ledger.refund(&refund).await.unwrap();
    assert!(rd.lines.iter().all(|l| l.status.is_ok()), "{rd:?}");
    assert_eq!(r.promo_field("plain", "stock").await.as_deref(), Some("2"));
    assert_eq!(remaining(&r, "mixhot").await, (990, 1, true));
    // The plain promotion short after the bucketed line: the bucketed
    // deduction is released, and nothing is stranded.
    promo_set(
        &r.ledger,
        &crate::common::redis::id("plain2"),
        spec(1_000, 0, None),
        false,
    )
    .await
    .unwrap();
    let e = placed(
        "x4",
        "ox4",
        "c4",
        AT,
        &[("mixhot", 10, 1), ("plain2", 10, 1)],
    );
    let d = r.ledger.place(&e).await.unwrap();
    assert_eq!(reason(&d), Some(Reason::StockInsufficient), "{d:?}");
    assert_eq!(remaining(&r, "mixhot").await, (990, 1, true), "released");
    let d2 = r.ledger.place(&e).await.unwrap();
    assert_eq!(reason(&d2), Some(Reason::StockInsufficient));
    assert_eq!(
        remaining(&r, "mixhot").await,
        (990, 1, true),
        "and not taken again"
    );
}

#[tokio::test]
async fn orders_mixing_bucketed_and_plain_lines_are_all_or_nothing() {
    mixed(standalone().await).await;
}

#[tokio::test]
async fn orders_mixing_bucketed_and_plain_lines_are_all_or_nothing_on_the_cluster() {
    mixed(cluster().await).await;
}

/// Converting either way is refused, with a message; so are the changes
/// not supported on a bucketed promotion yet.
#[tokio::test]
async fn converting_a_promotion_is_refused() {
    let r = standalone().await;
    let plain = crate::common::redis::id("was-plain");
    promo_set(&r.ledger, &plain, spec(10, 10, None), false)
        .await
        .unwrap();
    let err = bucketed::create(&r.ledger, &plain, spec(10, 10, None), 3)
        .await
        .expect_err("a live plain promotion is not converted");
    assert!(
        matches!(&err, AdminError::Refused(m) if m.contains("not bucketed")),
        "{err}"
    );
    let hot = crate::common::redis::id("is-hot");
    bucketed::create(&r.ledger, &hot, spec(10, 10, None), 2)
        .await
        .unwrap();
    let err = bucketed::create(&r.ledger, &hot, spec(10, 10, None), 2)
        .await
        .expect_err("exists");
    assert!(matches!(err, AdminError::Exists(_)), "{err}");
    for what in ["promo set --force"] {
        let err = bucketed::refuse_if_bucketed(&r.ledger, &hot, what)
            .await
            .expect_err("refused");
        assert!(err.to_string().contains(what), "{err}");
    }
    bucketed::refuse_if_bucketed(&r.ledger, &plain, "promo delete")
        .await
        .expect("a plain promotion is not refused");
    let err = bucketed::create(
        &r.ledger,
        &crate::common::redis::id("half"),
        PromoSpec {
            stock: Some(5),
            ..PromoSpec::default()
        },
        2,
    )
    .await
    .expect_err("both amounts are needed");
    assert!(matches!(err, AdminError::Invalid(_)), "{err}");
}

/// Order ids whose order's bucket is `j` of `k`.
fn orders_at(j: usize, k: usize, n: usize, tag: &str) -> Vec<String> {
    use deductor::domain::buckets::BucketId;
    (0..)
        .map(|i| format!("{tag}{i}"))
        .filter(|o| crate::common::redis::id(o).bucket(k) == j)
        .take(n)
        .collect()
}

/// `promo adjust` spreads a change over the buckets and moves the initial
/// amounts by what it did; `promo rebalance` evens the buckets out, also
/// while orders are being placed; `audit` stays clean throughout; a change
/// stopped half way is finished by the next command.
async fn operator_changes(r: TestRedis) {
    let p = crate::common::redis::id("ops");
    bucketed::create(&r.ledger, &p, spec(90, 9, None), 3)
        .await
        .unwrap();
    // Three orders at bucket 0 take its three units: buckets 0 / 3 / 3.
    let at0: Vec<OrderPlaced> = orders_at(0, 3, 3, "a")
        .iter()
        .map(|o| {
            placed(
                &format!("e-{o}"),
                o,
                &format!("c-{o}"),
                AT,
                &[("ops", 10, 1)],
            )
        })
        .collect();
    let t = tally(&place_all(&r.ledger, &at0, 1).await);
    assert_eq!(t.get("accepted"), Some(&3), "{t:?}");
    let dir = [("buckets".to_owned(), "3".to_owned())].into();
    let stocks = |v: &[bucketed::BucketView]| v.iter().map(|b| b.stock).collect::<Vec<_>>();
    let before = bucketed::buckets_of(&r.ledger, &p, &dir)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stocks(&before), vec![0, 3, 3]);

    // Rebalance: 2 / 2 / 2 (budget likewise), audit clean.
    let moves = bucketed::rebalance(&r.ledger, &p).await.unwrap();
    assert!(!moves.is_empty());
    let after = bucketed::buckets_of(&r.ledger, &p, &dir)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stocks(&after), vec![2, 2, 2], "{moves:?}");
    let a = bucketed::audit(&r.ledger, &p).await.unwrap().unwrap();
    assert!(a.breaches.is_empty() && a.unsettled.is_empty(), "{a:?}");

    // Adjust: +4 stock +40 budget, then -5 stock (of 10 free: taken).
    let done = bucketed::adjust(&r.ledger, &p, Some(40), Some(4))
        .await
        .unwrap()
        .expect("bucketed");
    assert_eq!((done.budget, done.stock), (40, 4));
    assert_eq!(remaining(&r, "ops").await, (100, 10, true));
    let done = bucketed::adjust(&r.ledger, &p, None, Some(-5))
        .await
        .unwrap()
        .unwrap();
    assert!(done.stock < 0 && done.stock >= -5, "{done:?}");
    let (_, left, _) = remaining(&r, "ops").await;
    assert_eq!(left as i64, 10 + done.stock);
    let shown = promo_show(&r.ledger, &p).await.unwrap().unwrap();
    assert_eq!(
        shown.initial_stock,
        Some((13 + done.stock) as u64),
        "{shown}"
    );
    let a = bucketed::audit(&r.ledger, &p).await.unwrap().unwrap();
    assert!(a.breaches.is_empty() && a.unsettled.is_empty(), "{a:?}");

    // A change listed but never walked (the command died): audit says so,
    // and the next command finishes it first.
    let id = crate::common::redis::id("adj-crashed");
    let op = deductor::ledger::bucketed::BucketOp::Add(deductor::domain::buckets::Units::new(0, 3));
    r.ledger.begin_bucket_op(&p, &id, op).await.unwrap();
    let a = bucketed::audit(&r.ledger, &p).await.unwrap().unwrap();
    assert!(a.breaches.is_empty() && !a.unsettled.is_empty(), "{a:?}");
    bucketed::rebalance(&r.ledger, &p).await.unwrap();
    assert!(r.ledger.pending_bucket_ops(&p).await.unwrap().is_empty());
    let (_, left2, _) = remaining(&r, "ops").await;
    assert_eq!(left2, left + 3);

    // Rebalances while 40 orders come in: the units add up, audit clean.
    let orders: Vec<OrderPlaced> = (0..40)
        .map(|n| {
            placed(
                &format!("f{n}"),
                &format!("of{n}"),
                &format!("cf{n}"),
                AT,
                &[("ops", 10, 1)],
            )
        })
        .collect();
    let rebalances = async {
        for _ in 0..5 {
            bucketed::rebalance(&r.ledger, &p).await.unwrap();
        }
    };
    let (decisions, ()) = tokio::join!(place_all(&r.ledger, &orders, 4), rebalances);
    let t = tally(&decisions);
    assert_eq!(
        t.get("accepted").copied().unwrap_or(0) as u64,
        left2,
        "{t:?}"
    );
    r.ledger.sweep(&layout_of(&r, &p).await).await.unwrap();
    assert_eq!(
        remaining(&r, "ops").await,
        (remaining(&r, "ops").await.0, 0, true)
    );
    let a = bucketed::audit(&r.ledger, &p).await.unwrap().unwrap();
    assert!(a.breaches.is_empty() && a.unsettled.is_empty(), "{a:?}");
}

async fn layout_of(
    r: &TestRedis,
    p: &deductor::domain::event::Id,
) -> deductor::ledger::bucketed::Layout {
    (*r.ledger.learn_layout(p).await.unwrap().unwrap()).clone()
}

#[tokio::test]
async fn adjust_and_rebalance_a_bucketed_promotion() {
    operator_changes(standalone().await).await;
}

#[tokio::test]
async fn adjust_and_rebalance_a_bucketed_promotion_on_the_cluster() {
    operator_changes(cluster().await).await;
}

/// `promo delete`: refused while an order holds a deduction, then with
/// `--force` the promotion is gone, also for a ledger that walked its
/// buckets before (it meets a missing bucket and reads the directory
/// again); its id is not reused for a bucketed promotion.
async fn delete(r: TestRedis) {
    let p = crate::common::redis::id("gone");
    bucketed::create(&r.ledger, &p, spec(30, 3, None), 3)
        .await
        .unwrap();
    let e = placed("g1", "og1", "cg1", AT, &[("gone", 10, 1)]);
    assert_eq!(reason(&r.ledger.place(&e).await.unwrap()), None);
    let err = bucketed::delete(&r.ledger, &p, false)
        .await
        .expect_err("an order holds a deduction");
    assert!(
        matches!(&err, AdminError::Refused(m) if m.contains("outstanding")),
        "{err}"
    );
    assert_eq!(
        bucketed::delete(&r.ledger, &p, true).await.unwrap(),
        Some(())
    );
    assert!(promo_show(&r.ledger, &p).await.unwrap().is_none());
    // The ledger still had the layout: the next line reads it again.
    let e2 = placed("g2", "og2", "cg2", AT, &[("gone", 10, 1)]);
    assert_eq!(
        reason(&r.ledger.place(&e2).await.unwrap()),
        Some(Reason::PromotionNotFound)
    );
    let err = bucketed::create(&r.ledger, &p, spec(30, 3, None), 3)
        .await
        .expect_err("the id was used");
    assert!(
        matches!(&err, AdminError::Refused(m) if m.contains("used before")),
        "{err}"
    );
}

#[tokio::test]
async fn deleting_a_bucketed_promotion() {
    delete(standalone().await).await;
}

#[tokio::test]
async fn deleting_a_bucketed_promotion_on_the_cluster() {
    delete(cluster().await).await;
}
