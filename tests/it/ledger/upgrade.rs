//! Issue 27 item 3: a rolling upgrade. A sale started by the previous release
//! (its scripts, vendored in tests/fixtures/previous-release/lua, writing
//! records in the previous layout: one hash per order line) goes on under
//! this build, whose scripts write the lean layout (docs/contract.md
//! section 2). Nothing is lost or doubled, refunds of old-layout orders return
//! exactly what was taken, and `audit`, `order show` and `promo` read both.

use crate::common::redis::*;
use deductor::admin::{self, audit, lookup, PromoSpec};
use deductor::domain::decision::{PlaceDecision, Reason};
use deductor::ledger::reply::Stored;
use fred::prelude::*;

const T: i64 = 1_800_000_000;
const RECORD_TTL: &str = "2592000";
const REFUND_TTL: &str = "604800";

/// The previous release's script `name`, with its lib.lua in front, as it
/// loaded them.
fn previous(name: &str) -> String {
    let lib = include_str!("../../fixtures/previous-release/lua/lib.lua");
    let body = match name {
        "deduct" => include_str!("../../fixtures/previous-release/lua/deduct.lua"),
        "rollback" => include_str!("../../fixtures/previous-release/lua/rollback.lua"),
        "release" => include_str!("../../fixtures/previous-release/lua/release.lua"),
        other => panic!("no previous script {other}"),
    };
    format!("{lib}{body}")
}

/// One line of a placement, decided by the previous release's deduct.lua.
pub(crate) async fn old_deduct(
    r: &TestRedis,
    p: &str,
    o: &str,
    c: &str,
    e: &str,
    b: u64,
    s: u64,
) -> Value {
    let k = r.keys().deduct_line(&id(p), &id(o), &id(c), &id(e));
    r.eval(
        &previous("deduct"),
        vec![k.promotion, k.used, k.record, k.memo],
        vec![
            b.to_string(),
            s.to_string(),
            T.to_string(),
            e.to_owned(),
            RECORD_TTL.to_owned(),
            REFUND_TTL.to_owned(),
            c.to_owned(),
        ],
    )
    .await
    .expect("previous deduct.lua")
}

/// One line of a refund (`None`: everything outstanding), decided by the
/// previous release's rollback.lua.
pub(crate) async fn old_rollback(
    r: &TestRedis,
    p: &str,
    o: &str,
    c: &str,
    e: &str,
    b: Option<u64>,
) -> Value {
    let k = r.keys().rollback_line(&id(p), &id(o), &id(c), &id(e));
    r.eval(
        &previous("rollback"),
        vec![k.promotion, k.used, k.record, k.memo],
        vec![
            b.map(|b| b.to_string()).unwrap_or_default(),
            b.map(|_| "0".to_owned()).unwrap_or_default(),
            RECORD_TTL.to_owned(),
            REFUND_TTL.to_owned(),
            e.to_owned(),
            c.to_owned(),
        ],
    )
    .await
    .expect("previous rollback.lua")
}

pub(crate) fn status(v: &Value) -> String {
    match v {
        Value::Array(items) => items[0].as_string().unwrap_or_default(),
        other => panic!("reply {other:?}"),
    }
}

pub(crate) async fn kind(r: &TestRedis, key: &str) -> String {
    r.pool().r#type(key).await.unwrap()
}

fn accepted_lines(d: &PlaceDecision) -> (bool, Vec<(u64, u64)>) {
    match d {
        PlaceDecision::Accepted { duplicate, lines } => (
            *duplicate,
            lines.iter().map(|l| (l.budget, l.stock)).collect(),
        ),
        other => panic!("expected accepted, got {other:?}"),
    }
}

async fn clean(r: &TestRedis, p: &str) -> audit::Report {
    let report = audit::audit_one(&r.ledger, &id(p)).await.unwrap();
    assert!(report.breaches.is_empty(), "{p}: {:?}", report.breaches);
    assert!(report.corrupt.is_empty(), "{p}: {:?}", report.corrupt);
    report
}

#[tokio::test]
async fn a_sale_started_by_the_previous_release_goes_on_under_this_one() {
    let r = standalone().await;
    let spec = |budget, stock| PromoSpec {
        budget: Some(budget),
        stock: Some(stock),
        per_customer: Some(2),
        ..PromoSpec::default()
    };
    admin::promo_set(&r.ledger, &id("p"), spec(1000, 50), false)
        .await
        .unwrap();
    admin::promo_set(&r.ledger, &id("q"), spec(1000, 1), false)
        .await
        .unwrap();

    // The previous release: o1 (30, 1) for c1, then a partial refund r1 of
    // 10 of its budget; o2 (20, 2) for c2, with a second placement event of
    // the same order absorbed into it; o3 (25, 1) for c1, untouched; and e4,
    // an order of two promotions whose first line (p) was deducted when the
    // pod went away, before its second line (q) was decided.
    for (o, c, e, b, s) in [
        ("o1", "c1", "e1", 30, 1),
        ("o2", "c2", "e2", 20, 2),
        ("o2", "c2", "e2b", 20, 2),
        ("o3", "c1", "e3", 25, 1),
        ("o4", "c3", "e4", 40, 1),
    ] {
        assert_eq!(
            status(&old_deduct(&r, "p", o, c, e, b, s).await),
            "accepted",
            "{e}"
        );
    }
    assert_eq!(
        status(&old_rollback(&r, "p", "o1", "c1", "r1", Some(10)).await),
        "applied"
    );
    // q is sold out by another order meanwhile.
    assert_eq!(
        status(&old_deduct(&r, "q", "o9", "c9", "e9", 1, 1).await),
        "accepted"
    );
    for o in ["o1", "o2", "o3", "o4"] {
        let key = r.keys().record(&id("p"), &id(o));
        assert_eq!(kind(&r, &key).await, "hash", "{o}: the previous layout");
    }
    // p: 1000 - (30 - 10) - 20 - 25 - 40 = 895; stock 50 - 1 - 2 - 1 - 1 = 45.
    assert_eq!(r.promo_field("p", "budget").await.as_deref(), Some("895"));
    assert_eq!(r.promo_field("p", "stock").await.as_deref(), Some("45"));
    let before = clean(&r, "p").await;
    assert_eq!(before.held, 4);

    // This build. Every old placement redelivered is a duplicate with its
    // amounts, and deducts nothing.
    for (o, c, e, b, s) in [
        ("o1", "c1", "e1", 30, 1),
        ("o2", "c2", "e2", 20, 2),
        ("o2", "c2", "e2b", 20, 2),
        ("o3", "c1", "e3", 25, 1),
    ] {
        let d = r
            .ledger
            .place(&placed(e, o, c, T, &[("p", b, s)]))
            .await
            .unwrap();
        assert_eq!(accepted_lines(&d), (true, vec![(b, s)]), "{e}");
    }
    assert_eq!(r.promo_field("p", "budget").await.as_deref(), Some("895"));

    // e4 redelivered: its second line is rejected (q sold out), so its first
    // line, deducted by the previous release, is released: all 40 / 1 back.
    let d = r
        .ledger
        .place(&placed("e4", "o4", "c3", T, &[("p", 40, 1), ("q", 1, 1)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d), (false, Reason::StockInsufficient, "q".into()));
    assert_eq!(r.promo_field("p", "budget").await.as_deref(), Some("935"));
    assert_eq!(r.promo_field("p", "stock").await.as_deref(), Some("46"));

    // The previous release's refund r1, redelivered: the same result, once.
    let d = r
        .ledger
        .refund(&refunded("r1", "o1", "c1", &[("p", Some(10), Some(0))]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Ok(()), true, 10, 0));
    // Refunds of old-layout orders return exactly what is still taken: o1's
    // 20 and 1 left after r1, o2's 20 and 2.
    let d = r
        .ledger
        .refund(&refunded("r2", "o1", "c1", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Ok(()), false, 20, 1));
    let d = r
        .ledger
        .refund(&refunded("r3", "o2", "c2", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Ok(()), false, 20, 2));
    // 935 + 20 + 20 = 975; 46 + 1 + 2 = 49.
    assert_eq!(r.promo_field("p", "budget").await.as_deref(), Some("975"));
    assert_eq!(r.promo_field("p", "stock").await.as_deref(), Some("49"));
    // A second refund of a fully refunded old order gives nothing.
    let d = r
        .ledger
        .refund(&refunded("r4", "o2", "c2", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0), (Err(Reason::AlreadyReverted), false, 0, 0));

    // New orders go into the lean layout; c1 holds o3 (old) and o5 (new),
    // so the limit of 2 refuses a third.
    let d = r
        .ledger
        .place(&placed("e5", "o5", "c1", T, &[("p", 15, 1)]))
        .await
        .unwrap();
    assert_eq!(accepted_lines(&d), (false, vec![(15, 1)]));
    let d = r
        .ledger
        .place(&placed("e6", "o6", "c1", T, &[("p", 15, 1)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d), (false, Reason::UserLimitReached, "p".into()));

    // Records written or changed by this build are lean and keep their TTL;
    // o3, untouched, is still the previous layout's hash.
    for o in ["o1", "o2", "o5"] {
        let key = r.keys().record(&id("p"), &id(o));
        assert_eq!(kind(&r, &key).await, "string", "{o}: the lean layout");
        let ttl: i64 = r.pool().ttl(&key).await.unwrap();
        assert!(ttl > 0, "{o} keeps a TTL");
    }
    let o3 = r.keys().record(&id("p"), &id("o3"));
    assert_eq!(kind(&r, &o3).await, "hash");

    // audit reads both layouts: held o3 (25, 1) and o5 (15, 1) = 1000 - 960.
    let after = clean(&r, "p").await;
    assert_eq!(after.held, 2);
    assert_eq!((after.outstanding_budget, after.outstanding_stock), (40, 2));
    assert_eq!(r.promo_field("p", "budget").await.as_deref(), Some("960"));

    // order show reads both layouts.
    for (o, state) in [("o1", "reverted"), ("o3", "deducted"), ("o5", "deducted")] {
        let view = lookup::order_show(&r.ledger, &id(o), Some(&id("p")))
            .await
            .unwrap();
        assert_eq!(view.records.len(), 1, "{o}");
        assert_eq!(
            view.records[0].fields.get("state").map(String::as_str),
            Some(state),
            "{o}"
        );
    }
    let view = lookup::order_show(&r.ledger, &id("o1"), Some(&id("p")))
        .await
        .unwrap();
    assert_eq!(
        view.records[0].fields.get("refund:r1").map(String::as_str),
        Some("applied 10 0"),
        "the previous release's refund result is kept across the rewrite"
    );
    // promo: what is outstanding counts both layouts.
    assert_eq!(
        admin::promo::count_deducted(&r.ledger, &id("p"))
            .await
            .unwrap(),
        2
    );
    match r.ledger.record(&o3).await.unwrap() {
        Stored::Hash(h) => assert_eq!(h.get("event").map(String::as_str), Some("e3")),
        other => panic!("o3: {other:?}"),
    }
}

/// lib.lua's `decode_record`, run by Redis, as `{encode_record(fields), name,
/// value, ...}` sorted by name, or `false` when the value is no record.
const DECODE_LUA: &str = "local h = decode_record(ARGV[1]) if not h then return false end \
    local names = {} for k in pairs(h) do names[#names + 1] = k end table.sort(names) \
    local out = { encode_record(h) } \
    for _, k in ipairs(names) do out[#out + 1] = k out[#out + 1] = h[k] end \
    return out";

/// `audit`, `order show` and the chaos checker decode a lean record in Rust
/// (`record_fields`); the scripts in Lua. Over generated values, well formed
/// and not, both agree field for field, and on what is no record at all.
#[tokio::test]
async fn the_lean_layout_reads_alike_in_the_scripts_and_the_operator_tools() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;
    let r = standalone().await;
    let body = format!("{}{DECODE_LUA}", include_str!("../../../lua/lib.lua"));
    let seed: u64 = std::env::var("DEDUCTOR_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let tokens = [
        "d",
        "r",
        "x",
        "",
        "e1",
        "0",
        "5",
        "100",
        "007",
        "c1",
        "1",
        "2",
        "=",
        "|",
        "absorbed:e2=1",
        "refund:e3=applied 1 0",
        "refund:e3=rejected no_deduction",
        "other=1",
        "absorbed:",
        "refund:e3",
        "deducted",
    ];
    let (mut records, mut cases) = (0, 0);
    for _ in 0..2000 {
        let n = rng.random_range(0..14);
        let v: Vec<&str> = (0..n)
            .map(|_| tokens[rng.random_range(0..tokens.len())])
            .collect();
        let v = v.join(if rng.random_bool(0.8) { "|" } else { "" });
        let lua: Value = r
            .eval(&body, vec![], vec![v.clone()])
            .await
            .expect("decode");
        let (lua, encoded): (Option<BTreeMap<String, String>>, String) = match lua {
            Value::Null => (None, String::new()),
            Value::Array(items) => (
                Some(
                    items[1..]
                        .chunks(2)
                        .map(|c| (c[0].as_string().unwrap(), c[1].as_string().unwrap()))
                        .collect(),
                ),
                items[0].as_string().unwrap(),
            ),
            other => panic!("{v:?}: {other:?}"),
        };
        let rust = deductor::domain::stored::record_fields(&v).map(|h| h.into_iter().collect());
        assert_eq!(rust, lua, "seed {seed}: {v:?}");
        cases += 1;
        if let Some(fields) = &lua {
            records += 1;
            // What decodes, lib.lua's encode_record writes back as a value
            // that decodes the same (and so does the tests' encoder).
            for (who, e) in [
                ("lib.lua", encoded.clone()),
                ("tests", encode_record(fields)),
            ] {
                let again = deductor::domain::stored::record_fields(&e)
                    .map(|h| h.into_iter().collect::<BTreeMap<_, _>>());
                assert_eq!(
                    again, lua,
                    "seed {seed}: {v:?} re-encoded by {who} as {e:?}"
                );
            }
        }
    }
    assert!(
        records > 50 && records < cases,
        "seed {seed}: {records} of {cases} decode"
    );
}
