//! deduct_batch.lua against deduct.lua: the same random placement lines
//! (fresh, redelivered, a second event of an order, a limit reached, stock
//! and budget running out, a missing and a paused promotion, corrupt data, a
//! malformed argument) run once line by line through deduct.lua and once in
//! random batches of 1 to 9 through deduct_batch.lua, each under its own key
//! prefix over the same seeded promotions. Every line's reply (or error) and
//! every key afterwards must be the same.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::redis::*;
use deductor::ledger::calls::{self, Call};
use deductor::ledger::scripts;
use fred::prelude::Value;

const T: i64 = 1_800_000_000;

async fn seed(r: &TestRedis) {
    r.seed(
        "scarce",
        &[("budget", "50"), ("stock", "6"), ("per_customer", "1")],
    )
    .await;
    r.seed(
        "roomy",
        &[("budget", "1000"), ("stock", "100"), ("per_customer", "3")],
    )
    .await;
    r.seed("paused", &[("stock", "10"), ("status", "paused")])
        .await;
    // Corrupt: a stock that is not a canonical integer.
    r.seed("broken", &[("stock", "1e3")]).await;
}

/// Line `i`'s call for `r`'s prefix: events may repeat (redeliveries) and
/// orders may get a second event.
fn line(r: &TestRedis, i: usize, rng: &mut StdRng) -> Call {
    let promos = ["scarce", "roomy", "roomy", "paused", "missing", "broken"];
    let p = promos[rng.random_range(0..promos.len())];
    let e = rng.random_range(0..(i + 1).min(40));
    let o = if rng.random_bool(0.2) { e + 1 } else { e };
    let c = e % 7;
    let k = r.keys().deduct_line(
        &id(p),
        &id(&format!("o{o}")),
        &id(&format!("c{c}")),
        &id(&format!("e{e}")),
    );
    // A business time before 1970 now and then (valid: signed).
    let t = if rng.random_bool(0.05) { -T } else { T };
    let mut args = [
        rng.random_range(0..20).to_string(),
        rng.random_range(0..3).to_string(),
        t.to_string(),
        format!("e{e}"),
        "1000".into(),
        "1000".into(),
        format!("c{c}"),
    ];
    // Now and then one argument replaced: malformed (a BADARG of deduct.lua:
    // an amount, a business time, an id, a TTL), or an id at the longest allowed.
    if rng.random_bool(0.08) {
        let longest = "x".repeat(64);
        let too_long = "x".repeat(65);
        let cases: [(usize, &str); 11] = [
            (0, "07"),
            (1, "-1"),
            (2, "-0"),
            (2, "1e3"),
            (3, "e\u{e9}"),
            (3, &too_long),
            (3, &longest),
            (6, "c:1"),
            (6, ""),
            (6, &longest),
            (4, "0"),
        ];
        let (i, v) = cases[rng.random_range(0..cases.len())];
        args[i] = v.to_owned();
    }
    Call {
        script: &scripts::DEDUCT,
        keys: k.as_vec(),
        args: args.to_vec(),
    }
}

/// A reply as comparable text: deduct.lua's array, or the error message.
fn show(v: Result<Value, String>) -> String {
    match v {
        Ok(Value::Array(parts)) if matches!(parts.first(), Some(Value::String(s)) if &**s == "ERR") =>
        {
            format!("error {}", parts[1].as_string().unwrap_or_default())
        }
        Ok(v) => format!("{v:?}"),
        Err(e) => format!("error {e}"),
    }
}

fn strip(dump: &Dump, prefix: &str) -> Vec<(String, Dumped)> {
    dump.iter()
        .map(|(k, v)| (k.replacen(prefix, "P", 1), v.clone()))
        .collect()
}

/// `singles` one call each on `one`, and `batched` in random batches of 1
/// to 9 (sizes from `batch_seed`) as `build` makes them on `many`: the
/// replies one by one, the batches' elements (each as [`show`] gives it,
/// the prefix replaced by "P") and the batch sizes.
async fn one_by_one_and_batched(
    one: &TestRedis,
    singles: Vec<Call>,
    many: &TestRedis,
    batched: &[Call],
    build: fn(Vec<Call>) -> Call,
    batch_seed: u64,
) -> (Vec<String>, Vec<String>, Vec<usize>) {
    let expected = one_by_one(one, singles).await;
    let (mut got, mut sizes) = (Vec::new(), Vec::new());
    let mut rest = batched;
    let mut rng = StdRng::seed_from_u64(batch_seed);
    while !rest.is_empty() {
        let k = rng.random_range(1..=9).min(rest.len());
        let (chunk, tail) = rest.split_at(k);
        rest = tail;
        sizes.push(k);
        got.extend(as_one_batch(many, build(chunk.to_vec()), k).await);
    }
    (expected, got, sizes)
}

/// Each of `singles` as its own call on `one`: the replies as [`show`]
/// gives them, the prefix replaced by "P".
async fn one_by_one(one: &TestRedis, singles: Vec<Call>) -> Vec<String> {
    let mut expected = Vec::new();
    for c in singles {
        let r = one.eval(c.script.body, c.keys, c.args).await;
        expected.push(show(r.map_err(|e| e.details().to_owned())).replace(&one.prefix, "P"));
    }
    expected
}

/// Batch call `call` of `k` lines on `many`: its elements as [`show`] gives
/// them, the prefix replaced by "P".
async fn as_one_batch(many: &TestRedis, call: Call, k: usize) -> Vec<String> {
    let reply = many
        .eval(call.script.body, call.keys, call.args)
        .await
        .unwrap_or_else(|e| panic!("the batch call itself fails: {e}"));
    let Value::Array(items) = reply else {
        panic!("batch reply {reply:?}")
    };
    assert_eq!(items.len(), k, "one element per call");
    items
        .into_iter()
        .map(|v| show(Ok(v)).replace(&many.prefix, "P"))
        .collect()
}

#[tokio::test]
async fn a_batch_decides_every_line_as_deduct_lua_one_by_one() {
    for seed_value in [1_u64, 2, 3] {
        let one = standalone().await;
        let many = standalone().await;
        seed(&one).await;
        seed(&many).await;
        let (mut ra, mut rb) = (
            StdRng::seed_from_u64(seed_value),
            StdRng::seed_from_u64(seed_value),
        );
        let n = 160;
        let singles: Vec<Call> = (0..n).map(|i| line(&one, i, &mut ra)).collect();
        let batched: Vec<Call> = (0..n).map(|i| line(&many, i, &mut rb)).collect();

        let (expected, got, sizes) = one_by_one_and_batched(
            &one,
            singles,
            &many,
            &batched,
            calls::deduct_batch,
            seed_value + 100,
        )
        .await;
        assert!(
            sizes.iter().any(|&k| k > 1),
            "some batches hold several lines"
        );
        for (i, (a, b)) in expected.iter().zip(&got).enumerate() {
            assert_eq!(
                a, b,
                "seed {seed_value}, line {i}: deduct.lua vs deduct_batch.lua"
            );
        }
        let errors = expected.iter().filter(|e| e.starts_with("error")).count();
        let accepted = expected.iter().filter(|e| e.contains("accepted")).count();
        assert!(
            errors > 0 && accepted > 0,
            "the lines meet errors and acceptances: {errors}, {accepted}"
        );
        assert_eq!(
            strip(&one.dump().await, &one.prefix),
            strip(&many.dump().await, &many.prefix),
            "seed {seed_value}: the same keys afterwards"
        );
    }
}

#[tokio::test]
async fn a_malformed_batch_is_refused_whole() {
    let r = standalone().await;
    let before = r.dump().await;
    let keys = vec![r.keys().promotion(&id("p")); 3];
    // A count of 1 and a line's arguments, but 3 keys.
    for (script, args) in [
        (&scripts::DEDUCT_BATCH, 8),
        (&scripts::ROLLBACK_BATCH, 7),
        (&scripts::RELEASE_BATCH, 4),
    ] {
        let err = r
            .eval(script.body, keys.clone(), vec!["1".into(); args])
            .await
            .expect_err("3 keys for a batch of 1");
        assert!(
            err.details().starts_with("BADARG"),
            "{}: {err}",
            script.name
        );
    }
    r.assert_unchanged(&before, "a refused batch").await;
}

/// memo_batch.lua against memo.lua: random runs of memo keys (missing, each
/// stored reason, an absorbed or released mark, a value no reason has, a
/// key of another type), the same key repeated, read once by memo.lua each
/// and once in batches of 1 to 9 by memo_batch.lua. Every element must be
/// memo.lua's reply or error, and neither may write.
#[tokio::test]
async fn a_memo_batch_reads_every_key_as_memo_lua() {
    use deductor::domain::decision::Reason;
    let r = standalone().await;
    let mut values: Vec<String> = Reason::ALL.iter().map(|x| x.as_str().to_owned()).collect();
    values.extend(["accepted", "released", "nonsense", "", "missing", "a hash"].map(String::from));
    let mut keys = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let k = r
            .keys()
            .rejected(&id(&format!("p{i}")), &id(&format!("e{i}")));
        match v.as_str() {
            "missing" => {}
            "a hash" => r.hset(&k, &[("reason", "budget_exceeded")]).await,
            v => r.set(&k, v).await,
        }
        keys.push(k);
    }
    let before = r.dump().await;
    let mut rng = StdRng::seed_from_u64(7);
    let reads: Vec<String> = (0..200)
        .map(|_| keys[rng.random_range(0..keys.len())].clone())
        .collect();
    let reads: Vec<Call> = reads
        .into_iter()
        .map(|key| Call {
            script: &scripts::MEMO,
            keys: vec![key],
            args: vec![],
        })
        .collect();
    let (expected, got, sizes) =
        one_by_one_and_batched(&r, reads.clone(), &r, &reads, calls::memo_batch, 8).await;
    assert!(
        sizes.iter().any(|&k| k > 1),
        "some batches hold several reads"
    );
    assert_eq!(expected, got, "memo.lua vs memo_batch.lua");
    for needle in [
        "value: nonsense",
        "type: hash",
        "\"budget_exceeded\"",
        "\"\"",
    ] {
        assert!(
            expected.iter().any(|e| e.contains(needle)),
            "the reads meet {needle}: {expected:?}"
        );
    }
    r.assert_unchanged(&before, "memo reads").await;
    // No key at all, or an argument: refused whole.
    for (keys, args) in [
        (vec![], vec![]),
        (reads[0].keys.clone(), vec!["x".to_owned()]),
    ] {
        let err = r
            .eval(scripts::MEMO_BATCH.body, keys, args)
            .await
            .expect_err("a malformed memo batch");
        assert!(err.details().starts_with("BADARG"), "{err}");
    }
}

/// `r` seeded, then 80 random placement lines (`line`) run through
/// deduct.lua; the generator, to go on with. "roomy" has no per-customer
/// limit for lines 30 to 54 and its limit of 3 before and after them (an
/// operator's `promo limit`): the records placed then took no slot
/// (counted 0) while the same customers' others did, so that releases and
/// refunds meet an uncounted record beside a used counter above 0, whose
/// slot is not theirs to give back.
async fn placed(r: &TestRedis, seed_value: u64) -> StdRng {
    seed(r).await;
    let limit = |n| calls::promo_limit(r.keys(), &id("roomy"), n);
    let mut rng = StdRng::seed_from_u64(seed_value);
    for i in 0..80 {
        if i == 30 || i == 55 {
            let c = limit((i == 55).then_some(3));
            r.eval(c.script.body, c.keys, c.args)
                .await
                .expect("promo_limit.lua");
        }
        let c = line(r, i, &mut rng);
        let _ = r.eval(scripts::DEDUCT.body, c.keys, c.args).await;
    }
    assert!(
        uncounted_beside_a_used_slot(r).await,
        "seed {seed_value}: some record of roomy took no slot while its customer holds one"
    );
    rng
}

/// Whether some order record of "roomy" took no per-customer slot (counted
/// 0) while its customer's used counter is above 0.
async fn uncounted_beside_a_used_slot(r: &TestRedis) -> bool {
    let roomy = id("roomy");
    for (promotion, _, rec) in records(r).await {
        let (Some(counted), Some(customer)) = (rec.get("counted"), rec.get("customer")) else {
            continue;
        };
        if promotion != "roomy" || counted != "0" {
            continue;
        }
        let used = r.get(&r.keys().used(&roomy, &id(customer))).await;
        if used.is_some_and(|u| u != "0") {
            return true;
        }
    }
    false
}

/// Every order record under `r`'s prefix, in key order: its promotion, its
/// order and its fields.
async fn records(r: &TestRedis) -> Vec<(String, String, BTreeMap<String, String>)> {
    let mut out = Vec::new();
    for key in r.dump().await.keys() {
        let Some((head, order)) = key.split_once("}:order:") else {
            continue;
        };
        let Some((_, promotion)) = head.rsplit_once('{') else {
            continue;
        };
        out.push((promotion.to_owned(), order.to_owned(), r.record(key).await));
    }
    out
}

/// A deduction in place: its promotion, order and customer.
struct Held {
    promotion: String,
    order: String,
    customer: String,
}

/// The deductions in place under `r`'s prefix (records in state deducted),
/// in key order.
async fn held(r: &TestRedis) -> Vec<Held> {
    let mut out = Vec::new();
    for (promotion, order, rec) in records(r).await {
        if let (Some("deducted"), Some(customer)) =
            (rec.get("state").map(String::as_str), rec.get("customer"))
        {
            out.push(Held {
                promotion,
                order,
                customer: customer.clone(),
            });
        }
    }
    out
}

/// Refund line `i` for `r`'s prefix, over the orders `line` placed: full
/// and partial refunds, refund events that repeat (redeliveries), a
/// customer other than the deduction's, orders with no deduction, a missing,
/// paused and corrupt promotion, a malformed amount; with the day index
/// (`indexed`) or without. Two lines in five refund one of `held` (the
/// deductions in place when the refunds began, [`held`]), so that applied
/// refunds, which give units back, are common among the others.
fn refund_line(r: &TestRedis, i: usize, rng: &mut StdRng, indexed: bool, held: &[Held]) -> Call {
    let promos = ["scarce", "roomy", "roomy", "paused", "missing", "broken"];
    let (p, o, c) = if !held.is_empty() && rng.random_bool(0.4) {
        let h = &held[rng.random_range(0..held.len())];
        let c = if rng.random_bool(0.9) {
            h.customer.clone()
        } else {
            format!("c{}", rng.random_range(0..7))
        };
        (h.promotion.clone(), h.order.clone(), c)
    } else {
        let o = rng.random_range(0..60);
        // An order's customer is its event's (o or o - 1) % 7: any other is a
        // mismatch, answered with the stored customer.
        let c = if rng.random_bool(0.7) {
            o % 7
        } else {
            rng.random_range(0..7)
        };
        let p = promos[rng.random_range(0..promos.len())];
        (p.to_owned(), format!("o{o}"), format!("c{c}"))
    };
    let e = format!("r{}", rng.random_range(0..(i + 1).min(30)));
    let mut amount = || match rng.random_range(0..10) {
        0 => "07".to_owned(), // not canonical: BADARG
        1..=3 => String::new(),
        _ => rng.random_range(0..6).to_string(),
    };
    let (budget, stock) = (amount(), amount());
    let mut keys = r
        .keys()
        .rollback_line(&id(&p), &id(&o), &id(&c), &id(&e))
        .as_vec();
    let mut args = vec![budget, stock, "1000".to_owned(), "1000".to_owned(), e, c];
    if indexed {
        keys.push(r.keys().index(&id(&p), 20_000));
        args.extend([o, "2000".to_owned()]);
    }
    Call {
        script: &scripts::ROLLBACK,
        keys,
        args,
    }
}

/// rollback_batch.lua against rollback.lua: the same deductions placed on
/// two key prefixes, then the same random refund lines (`refund_line`) run
/// once line by line through rollback.lua and once in random batches of 1
/// to 9 through rollback_batch.lua. Every line's reply (or error) and every
/// key afterwards must be the same.
#[tokio::test]
async fn a_rollback_batch_decides_every_line_as_rollback_lua_one_by_one() {
    for seed_value in [11_u64, 12, 13] {
        let indexed = seed_value != 12;
        let one = standalone().await;
        let many = standalone().await;
        let mut replies = Vec::new();
        for r in [&one, &many] {
            placed(r, seed_value).await;
            let held = held(r).await;
            let mut rng = StdRng::seed_from_u64(seed_value + 1);
            replies.push(
                (0..160)
                    .map(|i| refund_line(r, i, &mut rng, indexed, &held))
                    .collect::<Vec<Call>>(),
            );
        }
        let (singles, batched) = (replies.remove(0), replies.remove(0));
        let needles = [
            "\"applied\"",
            "\"customer\"",
            "no_deduction",
            "error BADARG",
            "error CORRUPT",
        ];
        let build = calls::rollback_batch;
        same_one_by_one_and_batched(&one, singles, &many, &batched, build, seed_value, &needles)
            .await;
    }
}

/// [`one_by_one_and_batched`] with batch sizes from `seed_value + 100`,
/// then: some batch holds several lines, every line's element is the same
/// as its own call's reply, the replies meet each of `needles`, and both
/// servers hold the same keys afterwards.
async fn same_one_by_one_and_batched(
    one: &TestRedis,
    singles: Vec<Call>,
    many: &TestRedis,
    batched: &[Call],
    build: fn(Vec<Call>) -> Call,
    seed_value: u64,
    needles: &[&str],
) {
    let single = singles.first().map_or("?", |c| c.script.name);
    let (expected, got, sizes) =
        one_by_one_and_batched(one, singles, many, batched, build, seed_value + 100).await;
    assert!(
        sizes.iter().any(|&k| k > 1),
        "some batches hold several lines"
    );
    for (i, (a, b)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(
            a, b,
            "seed {seed_value}, line {i}: {single} one by one vs batched"
        );
    }
    for needle in needles {
        assert!(
            expected.iter().any(|e| e.contains(needle)),
            "seed {seed_value}: the lines meet {needle}: {expected:?}"
        );
    }
    assert_eq!(
        strip(&one.dump().await, &one.prefix),
        strip(&many.dump().await, &many.prefix),
        "seed {seed_value}: the same keys afterwards"
    );
}

/// Release `i` for `r`'s prefix, over the orders `line` placed: the
/// deducting event, an event absorbed into another's record, an event that
/// holds nothing, a customer other than the record's (answered with the
/// stored one), a missing, paused and corrupt promotion, a malformed
/// argument; events repeat (a release run twice). Mostly few events, so that
/// one batch often holds two releases of one record, whose order matters.
fn release_line(r: &TestRedis, rng: &mut StdRng) -> Call {
    let promos = [
        "scarce", "roomy", "roomy", "roomy", "paused", "missing", "broken",
    ];
    let p = promos[rng.random_range(0..promos.len())];
    // Now and then any event `line` may have placed, so that the records
    // placed while "roomy" had no limit (`placed`) are released too.
    let e = if rng.random_bool(0.8) {
        rng.random_range(0..12)
    } else {
        rng.random_range(0..40)
    };
    let o = if rng.random_bool(0.2) { e + 1 } else { e };
    let c = if rng.random_bool(0.5) {
        e % 7
    } else {
        rng.random_range(0..7)
    };
    let ttl = if rng.random_bool(0.03) { "0" } else { "1000" }; // "0": BADARG
    Call {
        script: &scripts::RELEASE,
        keys: r
            .keys()
            .deduct_line(
                &id(p),
                &id(&format!("o{o}")),
                &id(&format!("c{c}")),
                &id(&format!("e{e}")),
            )
            .as_vec(),
        args: vec![format!("e{e}"), ttl.to_owned(), format!("c{c}")],
    }
}

/// release_batch.lua against release.lua: the same deductions (and some
/// refunds, whose records a release keeps as tombstones) on two key
/// prefixes, then the same random releases (`release_line`) run once line
/// by line through release.lua and once in random batches of 1 to 9
/// through release_batch.lua. Every line's reply (or error) and every key
/// afterwards must be the same.
#[tokio::test]
async fn a_release_batch_decides_every_line_as_release_lua_one_by_one() {
    for seed_value in [21_u64, 22, 23] {
        let one = standalone().await;
        let many = standalone().await;
        let mut calls = Vec::new();
        for r in [&one, &many] {
            let mut rng = placed(r, seed_value).await;
            let held = held(r).await;
            for i in 0..20 {
                let c = refund_line(r, i, &mut rng, false, &held);
                let _ = r.eval(scripts::ROLLBACK.body, c.keys, c.args).await;
            }
            calls.push(
                (0..160)
                    .map(|_| release_line(r, &mut rng))
                    .collect::<Vec<Call>>(),
            );
        }
        let (singles, batched) = (calls.remove(0), calls.remove(0));
        let needles = [
            "[Integer(1)]",
            "[Integer(0)]",
            "Integer(-1)",
            "error BADARG",
            "error CORRUPT",
        ];
        let build = calls::release_batch;
        same_one_by_one_and_batched(&one, singles, &many, &batched, build, seed_value, &needles)
            .await;
    }
}

/// A batch that decides a line by its own code keeps the promotion it read
/// only until a line it hands to the single script's body, which may give
/// units back: afterwards it reads the promotion again. Three lines of one
/// promotion, one by one and as one batch: a line decided in-line, one
/// handed over that gives units back, and one in-line again, whose reply (a
/// refund's remaining budget) or credit (a release's, capped at the initial
/// budget) shows what it read.
#[tokio::test]
async fn a_batch_reads_a_promotion_again_after_a_line_it_hands_over() {
    let fields = [
        ("budget", "100"),
        ("stock", "10"),
        ("initial_budget", "100"),
        ("initial_stock", "10"),
    ];
    let deduct = |r: &TestRedis, n: u32| Call {
        script: &scripts::DEDUCT,
        keys: r
            .keys()
            .deduct_line(
                &id("hot"),
                &id(&format!("o{n}")),
                &id(&format!("c{n}")),
                &id(&format!("e{n}")),
            )
            .as_vec(),
        args: [
            "10",
            "1",
            &T.to_string(),
            &format!("e{n}"),
            "1000",
            "1000",
            &format!("c{n}"),
        ]
        .map(str::to_owned)
        .to_vec(),
    };
    let refund = |r: &TestRedis, n: u32, event: &str, budget: &str| Call {
        script: &scripts::ROLLBACK,
        keys: r
            .keys()
            .rollback_line(
                &id("hot"),
                &id(&format!("o{n}")),
                &id(&format!("c{n}")),
                &id(event),
            )
            .as_vec(),
        args: [budget, "", "1000", "1000", event, &format!("c{n}")]
            .map(str::to_owned)
            .to_vec(),
    };
    let release = |r: &TestRedis, n: u32| Call {
        script: &scripts::RELEASE,
        keys: deduct(r, n).keys,
        args: vec![format!("e{n}"), "1000".to_owned(), format!("c{n}")],
    };

    // Refunds: orders 1 and 3 have no deduction (no_deduction, answered
    // with the promotion's budget), order 2's is refunded in full (+10).
    let (one, many) = (standalone().await, standalone().await);
    for r in [&one, &many] {
        r.seed("hot", &fields).await;
        run(r, deduct(r, 2)).await;
    }
    let lines = |r: &TestRedis| {
        vec![
            refund(r, 1, "r1", ""),
            refund(r, 2, "r2", ""),
            refund(r, 3, "r3", ""),
        ]
    };
    let budgets = same_as_one_by_one(&one, &many, lines, calls::rollback_batch).await;
    assert!(
        budgets[2].contains("Integer(100)"),
        "the last refund answers the budget after the second: {budgets:?}"
    );

    // Releases: orders 1 and 3 released plainly (in-line), order 2's
    // deduction partly refunded first (handed over; gives back the rest),
    // the budget topped up by an operator in between, so that the last
    // release's credit stops at the initial budget.
    let (one, many) = (standalone().await, standalone().await);
    for r in [&one, &many] {
        r.seed("hot", &fields).await;
        for n in 1..=3 {
            run(r, deduct(r, n)).await;
        }
        run(r, refund(r, 2, "r2", "4")).await;
        let key = r.keys().promotion(&id("hot"));
        r.hset(&key, &[("budget", "84")]).await;
    }
    let lines = |r: &TestRedis| vec![release(r, 1), release(r, 2), release(r, 3)];
    same_as_one_by_one(&one, &many, lines, calls::release_batch).await;
    assert_eq!(
        many.promo_field("hot", "budget").await.as_deref(),
        Some("100"),
        "84 + 10 + 6 + 10 given back, stopped at the initial 100"
    );
}

/// `lines(one)` one call each on `one` and `lines(many)` as one batch
/// (`build`) on `many`: the same replies and the same keys afterwards.
/// Returns the replies.
async fn same_as_one_by_one(
    one: &TestRedis,
    many: &TestRedis,
    lines: impl Fn(&TestRedis) -> Vec<Call>,
    build: fn(Vec<Call>) -> Call,
) -> Vec<String> {
    let expected = one_by_one(one, lines(one)).await;
    let batched = lines(many);
    let k = batched.len();
    let got = as_one_batch(many, build(batched), k).await;
    assert_eq!(expected, got, "one by one vs batched");
    assert_eq!(
        strip(&one.dump().await, &one.prefix),
        strip(&many.dump().await, &many.prefix),
        "the same keys afterwards"
    );
    expected
}

/// Runs a line's call, which must not fail.
async fn run(r: &TestRedis, c: Call) {
    r.eval(c.script.body, c.keys, c.args)
        .await
        .expect("a line run alone");
}
