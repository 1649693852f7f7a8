//! Script-level fuzzing against the real Redis: the four ledger scripts are
//! called with random (often malformed) arguments on keys holding random
//! (often corrupt) values: `nan`, `inf`, `0x10`, `1e3`, ` 5 `, `-0`,
//! `9007199254740993`, huge strings, keys of the wrong type. Lua's
//! `tonumber` accepts most of those and `nan` passes every comparison, so
//! each call is held to a reference model of CONTRACT.md sections 2 and 3:
//!
//! - when an argument is malformed the reply is `BADARG`, when a value read
//!   is not what section 2 allows it is `CORRUPT`, and either way the keys
//!   are exactly as before (a dump of every key under the test's prefix);
//! - otherwise the reply is the model's decision (including the project's
//!   changes to deduct steps 0-2 and to the release of a rejected event's
//!   lines in docs/contract.md) and the keys afterwards
//!   are exactly the model's (values and whether a TTL is set).
//!
//! Any other error (a Lua runtime error) is a crash of the script: a failure.
//! `SCRIPT_FUZZ_CASES` sets the number of calls (default 2000); the seed is
//! printed and `SCRIPT_FUZZ_SEED` replays a run.
//!
//! - `stored`: the keys as the scripts read them, and the writes the model
//!   expects;
//! - `reference`: the model of each script's reply and writes;
//! - `fuzzer`: the random keys, values and arguments of each call;
//! - here: the values they are drawn from, and the test.

mod fuzzer;
mod reference;
mod stored;

use std::collections::BTreeMap;

use crate::common::redis::{self, Dumped};
use deductor::domain::event::Id;
use deductor::ledger::scripts::{DEDUCT, DEDUCT_BATCH, MEMO, RELEASE, ROLLBACK};
use fred::prelude::Value;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use fuzzer::Fuzz;
use reference::{deduct, memo, release, rollback, Expect, Reply};

type Dump = BTreeMap<String, Dumped>;

/// Values that look numeric to Lua (or to a human) but are not canonical.
const WEIRD: &[&str] = &[
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "0x10",
    "1e3",
    "1E3",
    " 5 ",
    "5 ",
    " 5",
    "-0",
    "-3",
    "+1",
    "007",
    "1.5",
    "1.0",
    "9007199254740993",
    "1000000000000000",
    "",
    "abc",
    "\0",
    "5\n",
    "１",
    "deducted ",
    "DEDUCTED",
    "applied",
    "applied 1",
    "applied -1 2",
    "applied 1 2 3",
    "rejected",
    "rejected nope",
    "budget_exceeded ",
    "active ",
];

/// Canonical values, including the 15-digit edge.
const GOOD: &[&str] = &["0", "1", "2", "5", "10", "100", "4000", "999999999999999"];

const REASONS: &[&str] = &[
    "budget_exceeded",
    "stock_insufficient",
    "user_limit_reached",
    "promotion_not_found",
    "promotion_inactive",
    "order_reverted",
    "corrupt_promotion",
];

const REFUND_REASONS: &[&str] = &[
    "no_deduction",
    "already_reverted",
    "exceeds_deducted",
    "corrupt_promotion",
];

fn canonical(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'))
}

fn signed(s: &str) -> bool {
    match s.strip_prefix('-') {
        Some(m) => m != "0" && canonical(m),
        None => canonical(s),
    }
}

fn valid_event(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

fn num(s: &str) -> i64 {
    s.parse().expect("canonical")
}

fn reply_of(v: &Value) -> Option<Vec<Reply>> {
    let Value::Array(items) = v else { return None };
    items
        .iter()
        .map(|i| match i {
            Value::Integer(n) => Some(Reply::I(*n)),
            Value::String(s) => Some(Reply::S(s.to_string())),
            Value::Bytes(b) => Some(Reply::S(String::from_utf8_lossy(b).into_owned())),
            _ => None,
        })
        .collect()
}

fn short(s: &str) -> String {
    if s.len() > 80 {
        format!(
            "{}...({} bytes)",
            &s[..s.char_indices().nth(60).map_or(s.len(), |(i, _)| i)],
            s.len()
        )
    } else {
        format!("{s:?}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_decide_correctly_or_refuse_without_writing() {
    let cases: usize = std::env::var("SCRIPT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let seed: u64 = std::env::var("SCRIPT_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    println!("script fuzz: {cases} calls, SCRIPT_FUZZ_SEED={seed}");
    let mut f = Fuzz {
        rng: StdRng::seed_from_u64(seed),
        r: redis::standalone().await,
    };
    let id = |s: &str| Id::parse(s).unwrap();
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for n in 0..cases {
        let p = id(f.pick(&["p1", "p2"]));
        let o = id(f.pick(&["o1", "o2"]));
        let c = id(f.pick(&["c1", "c2"]));
        let e = f.pick(&["e1", "e2", "e3"]).to_owned();
        let keys = f.r.keys().clone();
        let line = keys.deduct_line(&p, &o, &c, &id(&e));
        let refund_memo = keys.refund(&p, &id(&e));
        let which = f.rng.random_range(0..10);
        let (script, mut k, mut a): (&str, Vec<String>, Vec<String>) = match which {
            0..=3 => {
                let t = f.pick(&["1500", "0", "1800000000", "-5"]).to_owned();
                let (b, st) = (
                    GOOD[f.rng.random_range(0..5)],
                    GOOD[f.rng.random_range(0..4)],
                );
                let valid = [b, st, &t, &e, "2592000", "604800", c.as_str()]
                    .map(str::to_owned)
                    .to_vec();
                let args = f.args(valid);
                ("deduct", line.as_vec(), args)
            }
            4..=6 => {
                let amounts = ["", "", "0", "1", "5", "100"];
                let (b, st) = (
                    amounts[f.rng.random_range(0..amounts.len())],
                    amounts[f.rng.random_range(0..amounts.len())],
                );
                let args = f.args(
                    [b, st, "2592000", "604800", &e, c.as_str()]
                        .map(str::to_owned)
                        .to_vec(),
                );
                let k = vec![
                    line.promotion.clone(),
                    line.used.clone(),
                    line.record.clone(),
                    refund_memo.clone(),
                ];
                ("rollback", k, args)
            }
            7..=8 => {
                let valid = vec![e.clone(), "604800".to_owned(), c.to_string()];
                ("release", line.as_vec(), f.args(valid))
            }
            _ => ("memo", vec![line.memo.clone()], vec![]),
        };
        // Sometimes the wrong number of keys or arguments.
        if f.rng.random_ratio(1, 40) {
            if f.rng.random_bool(0.5) {
                k.pop();
            } else {
                a.push("1".into());
            }
        }
        let memo_key = if script == "rollback" {
            &refund_memo
        } else {
            &line.memo
        };
        f.disturb(
            &line.promotion,
            &line.used,
            &line.record,
            memo_key,
            script == "rollback",
        )
        .await;

        if script == "release" && f.rng.random_bool(0.5) {
            // Often the record this event deducted, so that releases happen.
            f.r.del(&line.record).await;
            f.r.del(&line.memo).await;
            let counted = f.pick(&["0", "1"]);
            f.hset(
                &line.record,
                &[
                    ("state", "deducted"),
                    ("event", e.as_str()),
                    ("budget", "5"),
                    ("stock", "1"),
                    ("budget0", "5"),
                    ("stock0", "1"),
                    ("customer", c.as_str()),
                    ("counted", counted),
                ],
            )
            .await;
        }
        let before = f.r.dump().await;
        let expect = match script {
            "deduct" => deduct(&before, &k, &a),
            "rollback" => rollback(&before, &k, &a),
            "release" => release(&before, &k, &a),
            _ => memo(&before, &k, &a),
        };
        let body = match script {
            "deduct" => DEDUCT.body,
            "rollback" => ROLLBACK.body,
            "release" => RELEASE.body,
            _ => MEMO.body,
        };
        // Half of the deduct calls go through deduct_batch.lua, as a batch
        // of one line (what the ledger sends on a single Redis at low
        // load): held to the same model.
        let batched = script == "deduct" && f.pick(&["single", "batch"]) == "batch";
        let got = if batched {
            batch_of_one(&f.r, k.clone(), a.clone()).await
        } else {
            f.r.eval(body, k.clone(), a.clone()).await
        };
        let after = f.r.dump().await;
        let context = || {
            format!(
                "call {n} (SCRIPT_FUZZ_SEED={seed}): {script}{} keys {k:?} args {:?}\nbefore: {}",
                if batched { " (in a batch)" } else { "" },
                a.iter().map(|x| short(x)).collect::<Vec<_>>(),
                short(&format!("{before:?}"))
            )
        };
        let outcome = match (&expect, &got) {
            (Expect::Error(code), Err(e)) => {
                let first = e.details().split_whitespace().next().unwrap_or("");
                assert_eq!(first, *code, "{}\nerror: {e}", context());
                redis::assert_same(
                    &before,
                    &after,
                    &format!("{}\nan error reply wrote", context()),
                );
                format!("{script} {code}")
            }
            (Expect::ErrorWrote(code, want_after), Err(e)) => {
                let first = e.details().split_whitespace().next().unwrap_or("");
                assert_eq!(first, *code, "{}\nerror: {e}", context());
                assert_eq!(
                    &after,
                    want_after,
                    "{}\nkeys differ: {:?}",
                    context(),
                    redis::diff(want_after, &after)
                );
                format!("{script} {code} remembered")
            }
            (Expect::Reply(want, want_after), Ok(v)) => {
                assert_eq!(
                    reply_of(v).as_ref(),
                    Some(want),
                    "{}\nreply {v:?}",
                    context()
                );
                assert_eq!(
                    &after,
                    want_after,
                    "{}\nkeys differ: {:?}",
                    context(),
                    redis::diff(want_after, &after)
                );
                let tag = match want.first() {
                    Some(Reply::S(st)) => format!(
                        "{st} {}",
                        match want.get(1) {
                            Some(Reply::S(r)) => r.as_str(),
                            _ => "",
                        }
                    ),
                    _ => format!("{want:?}"),
                };
                format!("{script} {}", tag.trim())
            }
            (Expect::Text(want), Ok(v)) => {
                assert_eq!(
                    v.as_string().as_deref(),
                    Some(want.as_str()),
                    "{}\nreply {v:?}",
                    context()
                );
                assert_eq!(before, after, "{}\nmemo.lua wrote", context());
                format!("memo {}", if want.is_empty() { "none" } else { "found" })
            }
            (want, got) => panic!("{}\nexpected {want:?}\ngot {got:?}", context()),
        };
        *tally.entry(outcome).or_default() += 1;
    }
    for (k, v) in &tally {
        println!("  {k:<40} {v}");
    }
    // The run must have reached the interesting places, not only errors.
    for needed in [
        "deduct accepted",
        "deduct BADARG",
        "deduct CORRUPT",
        "deduct CORRUPT remembered",
        "rollback CORRUPT remembered",
        "rollback applied",
        "rollback customer",
        "rollback CORRUPT",
        "release [I(1)]",
        "release [I(0)]",
    ] {
        assert!(
            tally.keys().any(|k| k.starts_with(needed)),
            "no call ended in {needed:?}: {tally:?}"
        );
    }
}

/// deduct.lua's call run as the one line of a deduct_batch.lua call; its
/// element unwrapped into the reply or error deduct.lua would give.
async fn batch_of_one(
    r: &redis::TestRedis,
    keys: Vec<String>,
    args: Vec<String>,
) -> Result<Value, fred::error::Error> {
    let mut all = vec!["1".to_owned()];
    all.extend(args);
    match r.eval(DEDUCT_BATCH.body, keys, all).await? {
        Value::Array(mut items) if items.len() == 1 => match items.remove(0) {
            Value::Array(parts) if matches!(parts.first(), Some(Value::String(s)) if &**s == "ERR") =>
            {
                let message = parts.get(1).and_then(Value::as_string).unwrap_or_default();
                Err(fred::error::Error::new(
                    fred::error::ErrorKind::Unknown,
                    message,
                ))
            }
            item => Ok(item),
        },
        other => panic!("a batch of one line replied {other:?}"),
    }
}
