//! deduct_batch.lua against deduct.lua: the same random placement lines
//! (fresh, redelivered, a second event of an order, a limit reached, stock
//! and budget running out, a missing and a paused promotion, corrupt data, a
//! malformed argument) run once line by line through deduct.lua and once in
//! random batches of 1 to 9 through deduct_batch.lua, each under its own key
//! prefix over the same seeded promotions. Every line's reply (or error) and
//! every key afterwards must be the same.

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
    let budget = if rng.random_bool(0.03) {
        "07".to_owned() // not canonical: BADARG
    } else {
        rng.random_range(0..20).to_string()
    };
    let args = [
        budget,
        rng.random_range(0..3).to_string(),
        T.to_string(),
        format!("e{e}"),
        "1000".into(),
        "1000".into(),
        format!("c{c}"),
    ];
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

        let mut expected = Vec::new();
        for c in singles {
            let r = one.eval(scripts::DEDUCT.body, c.keys, c.args).await;
            expected.push(show(r.map_err(|e| e.details().to_owned())).replace(&one.prefix, "P"));
        }
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        let mut rest = &batched[..];
        let mut rng = StdRng::seed_from_u64(seed_value + 100);
        while !rest.is_empty() {
            let k = rng.random_range(1..=9).min(rest.len());
            let (chunk, tail) = rest.split_at(k);
            rest = tail;
            sizes.push(k);
            let call = calls::deduct_batch(chunk.to_vec());
            let reply = many
                .eval(scripts::DEDUCT_BATCH.body, call.keys, call.args)
                .await
                .unwrap_or_else(|e| panic!("the batch call itself fails: {e}"));
            let Value::Array(items) = reply else {
                panic!("batch reply {reply:?}")
            };
            assert_eq!(items.len(), k, "one element per line");
            got.extend(
                items
                    .into_iter()
                    .map(|v| show(Ok(v)).replace(&many.prefix, "P")),
            );
        }
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
    let err = r
        .eval(scripts::DEDUCT_BATCH.body, keys, vec!["1".into(); 8])
        .await
        .expect_err("3 keys for a batch of 1");
    assert!(err.details().starts_with("BADARG"), "{err}");
    r.assert_unchanged(&before, "a refused batch").await;
}
