//! Coalesced batches (issue 27 item 1) against deduct.lua one line at a
//! time: a differential property test. Each case is a random run of steps
//! played twice, each under its own key prefix over the same promotions:
//! once with every placement line a deduct.lua call of its own, once with
//! each step's lines in one deduct_batch.lua call (which reads each
//! promotion once, decides against a running balance and writes the
//! counters once). Every line's reply (or error), every other step's
//! result, and after every step every key under the prefix (value and
//! whether it has a TTL) must be the same.
//!
//! The steps: batches of placements of 1 to 3 lines (most on one hot
//! promotion, so a batch runs its budget and stock out part way; events
//! and orders repeat, so a batch holds duplicates, second events of an
//! order and both lines of one order; the last placement of a batch is
//! sometimes split, its last line going in the next batch); between
//! batches, refunds (rollback.lua) and releases (release.lua), operator
//! changes (pause/resume, adjust, per-customer limit, a delete and
//! re-create: another `gen`), and corrupt data put in and repaired (a
//! promotion field, a record, a used counter, a memo) that the next batch
//! meets among good lines.
//!
//! Cases: `PROPTEST_CASES` (default 64).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::redis::*;
use deductor::admin::promo::{self as promo_admin, Adjustment};
use deductor::admin::{self, PromoSpec};
use deductor::domain::event::Id;
use deductor::domain::keys::LineKeys;
use deductor::ledger::calls::{self, Call};
use deductor::ledger::scripts;
use fred::prelude::Value;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Index 0 is the hot one; index 3 never exists.
const PROMOS: [&str; 5] = ["hot", "roomy", "limited", "missing", "free"];
const EVENTS: usize = 12;
const ORDERS: usize = 5;
const CUSTOMERS: usize = 3;
const TIMES: [i64; 5] = [500, 1_000, 3_000, 4_999, 5_000];

fn spec(p: usize) -> PromoSpec {
    match p {
        // Scarce budget and stock, two counted orders a customer.
        0 => PromoSpec {
            budget: Some(60),
            stock: Some(8),
            per_customer: Some(2),
            ..PromoSpec::default()
        },
        // Budget only (unlimited stock).
        1 => PromoSpec {
            budget: Some(1_000),
            ..PromoSpec::default()
        },
        // Stock only, one order a customer, a window [1000, 5000).
        2 => PromoSpec {
            stock: Some(5),
            per_customer: Some(1),
            starts_at: Some(1_000),
            ends_at: Some(5_000),
            ..PromoSpec::default()
        },
        // Unlimited in every way.
        _ => PromoSpec::default(),
    }
}

#[derive(Debug, Clone)]
struct Line {
    promo: usize,
    event: usize,
    other_customer: bool,
    budget: u64,
    stock: u64,
    t: i64,
}

#[derive(Debug, Clone)]
enum Step {
    /// Placements (each 1 to 3 lines of one event); `split`: the last
    /// placement's last line waits for the next batch.
    Batch {
        placements: Vec<Vec<Line>>,
        split: bool,
    },
    Refund {
        promo: usize,
        event: usize,
        refund: usize,
        budget: Option<u64>,
        stock: Option<u64>,
        other_customer: bool,
    },
    Release {
        promo: usize,
        event: usize,
    },
    Pause(usize, bool),
    Adjust(usize, i64, i64),
    Limit(usize, Option<u64>),
    /// Delete (forced) and re-create: a new incarnation.
    Recreate(usize),
    /// Corrupt data put in (true) or repaired (false): 0 a promotion field,
    /// 1 a record, 2 a used counter, 3 a memo.
    Corrupt {
        what: usize,
        promo: usize,
        event: usize,
        on: bool,
    },
}

fn promo() -> impl Strategy<Value = usize> {
    prop_oneof![8 => Just(0usize), 2 => Just(1usize), 2 => Just(2usize), 1 => Just(3usize), 1 => Just(4usize)]
}

fn placement() -> impl Strategy<Value = Vec<Line>> {
    (
        0..EVENTS,
        prop::bool::weighted(0.15),
        prop::sample::select(TIMES.to_vec()),
        prop::collection::vec((promo(), 0..=25u64, 0..=3u64), 1..=3),
    )
        .prop_map(|(event, other_customer, t, lines)| {
            let mut seen = Vec::new();
            lines
                .into_iter()
                .filter(|l| {
                    let new = !seen.contains(&l.0);
                    seen.push(l.0);
                    new
                })
                .map(|(promo, budget, stock)| Line {
                    promo,
                    event,
                    other_customer,
                    budget,
                    stock,
                    t,
                })
                .collect()
        })
}

fn step() -> impl Strategy<Value = Step> {
    let batch = (
        prop::collection::vec(placement(), 1..=8),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(placements, split)| Step::Batch { placements, split });
    let amount = |max: u64| prop_oneof![Just(None), (0..=max).prop_map(Some)];
    let refund = (
        promo(),
        0..EVENTS,
        0..6usize,
        amount(25),
        amount(3),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(promo, event, refund, budget, stock, other_customer)| Step::Refund {
                promo,
                event,
                refund,
                budget,
                stock,
                other_customer,
            },
        );
    prop_oneof![
        10 => batch,
        3 => refund,
        2 => (promo(), 0..EVENTS).prop_map(|(promo, event)| Step::Release { promo, event }),
        1 => (0..3usize, any::<bool>()).prop_map(|(p, on)| Step::Pause(p, on)),
        1 => (0..3usize, -20..=30i64, -3..=4i64).prop_map(|(p, b, s)| Step::Adjust(p, b, s)),
        1 => (0..3usize, prop_oneof![Just(None), (1..=3u64).prop_map(Some)])
            .prop_map(|(p, n)| Step::Limit(p, n)),
        1 => (0..3usize).prop_map(Step::Recreate),
        2 => (0..4usize, promo(), 0..EVENTS, prop::bool::weighted(0.6))
            .prop_map(|(what, promo, event, on)| Step::Corrupt { what, promo, event, on }),
    ]
}

fn order_of(event: usize) -> usize {
    event % ORDERS
}

fn customer_of(event: usize, other: bool) -> usize {
    (order_of(event) + usize::from(other)) % CUSTOMERS
}

/// The keys of `event`'s order line of `promo` under `r`'s prefix, for
/// `customer` and the event id `event_id` (a placement's, a refund's).
fn line_keys(r: &TestRedis, promo: &Id, event: usize, customer: &str, event_id: &str) -> LineKeys {
    r.keys().deduct_line(
        promo,
        &id(&format!("o{}", order_of(event))),
        &id(customer),
        &id(event_id),
    )
}

/// Line `l`'s deduct.lua call under `r`'s prefix.
fn call(r: &TestRedis, l: &Line) -> Call {
    let c = format!("c{}", customer_of(l.event, l.other_customer));
    let k = line_keys(
        r,
        &id(PROMOS[l.promo]),
        l.event,
        &c,
        &format!("e{}", l.event),
    );
    Call {
        script: &scripts::DEDUCT,
        keys: k.as_vec(),
        args: vec![
            l.budget.to_string(),
            l.stock.to_string(),
            l.t.to_string(),
            format!("e{}", l.event),
            "2592000".into(),
            "604800".into(),
            c,
        ],
    }
}

/// A reply (or error) as text, the prefix made neutral.
fn show(r: &TestRedis, v: Result<Value, String>) -> String {
    let text = match v {
        Ok(Value::Array(parts)) if matches!(parts.first(), Some(Value::String(s)) if &**s == "ERR") =>
        {
            format!("error {}", parts[1].as_string().unwrap_or_default())
        }
        Ok(v) => format!("{v:?}"),
        Err(e) => format!("error {e}"),
    };
    text.replace(&r.prefix, "P")
}

/// Every key but the ledger marker (`promo set` writes each keyspace its
/// own random one, never touched again), the prefix made neutral.
fn strip(r: &TestRedis, dump: &Dump) -> Vec<(String, Dumped)> {
    let marker = r.keys().ledger_marker();
    assert!(dump.contains_key(&marker), "the ledger marker is kept");
    dump.iter()
        .filter(|(k, _)| **k != marker)
        .map(|(k, v)| (k.replacen(&r.prefix, "P", 1), v.clone()))
        .collect()
}

/// Sets a string key keeping its TTL (a corrupt counter or memo).
const SET_KEEPTTL: &str = "redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')";
/// The repair of SET_KEEPTTL's counter: the value without its trailing 'x'
/// (the key deleted when nothing is left); a memo "bogus" is deleted.
const REPAIR_STRING: &str = "local v = redis.call('GET', KEYS[1]) \
    if v == 'bogus' or v == 'x' then redis.call('DEL', KEYS[1]) \
    elseif v and string.sub(v, -1) == 'x' then redis.call('SET', KEYS[1], string.sub(v, 1, -2), 'KEEPTTL') end";

/// Runs an operator step or a refund/release on `r`; its result as text.
async fn other_step(r: &TestRedis, step: &Step) -> String {
    let p = |i: usize| id(PROMOS[i]);
    let text = match step {
        Step::Batch { .. } => unreachable!(),
        Step::Refund {
            promo,
            event,
            refund,
            budget,
            stock,
            other_customer,
        } => {
            let c = format!("c{}", customer_of(*event, *other_customer));
            let e = format!("r{refund}");
            let k = line_keys(r, &p(*promo), *event, &c, &e);
            let keys = vec![
                k.promotion,
                k.used,
                k.record,
                r.keys().refund(&p(*promo), &id(&e)),
            ];
            let amount = |a: &Option<u64>| a.map_or(String::new(), |v| v.to_string());
            let args = vec![
                amount(budget),
                amount(stock),
                "2592000".into(),
                "604800".into(),
                e,
                c,
            ];
            let got = r.eval(scripts::ROLLBACK.body, keys, args).await;
            format!("{:?}", got.map_err(|e| e.details().to_owned()))
        }
        Step::Release { promo, event } => {
            let c = format!("c{}", customer_of(*event, false));
            let e = format!("e{event}");
            let k = line_keys(r, &p(*promo), *event, &c, &e);
            let got = r
                .eval(
                    scripts::RELEASE.body,
                    k.as_vec(),
                    vec![e, "604800".into(), c],
                )
                .await;
            format!("{:?}", got.map_err(|e| e.details().to_owned()))
        }
        Step::Pause(i, on) => format!(
            "{:?}",
            promo_admin::set_paused(&r.ledger, &p(*i), *on).await
        ),
        Step::Adjust(i, b, s) => {
            let a = Adjustment {
                budget: (*b != 0).then_some(*b),
                stock: (*s != 0).then_some(*s),
            };
            format!("{:?}", promo_admin::adjust(&r.ledger, &p(*i), a).await)
        }
        Step::Limit(i, n) => format!("{:?}", promo_admin::limit(&r.ledger, &p(*i), *n).await),
        Step::Recreate(i) => {
            let deleted = promo_admin::delete(&r.ledger, &p(*i), true).await;
            let set = admin::promo_set(&r.ledger, &p(*i), spec(*i), false).await;
            format!("{deleted:?} {set:?}")
        }
        Step::Corrupt {
            what,
            promo,
            event,
            on,
        } => {
            let c = format!("c{}", customer_of(*event, false));
            let e = format!("e{event}");
            let k = line_keys(r, &p(*promo), *event, &c, &e);
            let (key, set, repair): (String, Vec<&str>, Vec<&str>) = match what {
                // A field the scripts validate (never stored otherwise).
                0 => (
                    k.promotion,
                    vec!["redis.call('HSET', KEYS[1], 'starts_at', 'soon')"],
                    vec!["redis.call('HDEL', KEYS[1], 'starts_at')"],
                ),
                1 => (
                    k.record,
                    vec!["redis.call('HSET', KEYS[1], 'absorbed:bad!', '1')"],
                    vec!["redis.call('HDEL', KEYS[1], 'absorbed:bad!')"],
                ),
                2 => (k.used, vec![], vec![REPAIR_STRING]),
                _ => (k.memo, vec![], vec![REPAIR_STRING]),
            };
            let script = if !*on {
                repair[0].to_owned()
            } else if set.is_empty() {
                // The counter (or memo) as it was with an 'x' appended.
                let value = if *what == 2 {
                    format!(
                        "{}x",
                        r.get(&key).await.unwrap_or_default().trim_end_matches('x')
                    )
                } else {
                    "bogus".to_owned()
                };
                let got = r
                    .eval(SET_KEEPTTL, vec![key.clone()], vec![value])
                    .await
                    .map_err(|e| e.details().to_owned());
                return format!("corrupt {what} {got:?}").replace(&r.prefix, "P");
            } else {
                set[0].to_owned()
            };
            let got = r
                .eval(&script, vec![key], vec![])
                .await
                .map_err(|e| e.details().to_owned());
            format!("corrupt {what} {on} {got:?}")
        }
    };
    text.replace(&r.prefix, "P")
}

static CASES: AtomicUsize = AtomicUsize::new(0);
static TALLY: std::sync::Mutex<BTreeMap<&'static str, usize>> =
    std::sync::Mutex::new(BTreeMap::new());

fn count(what: &'static str, n: usize) {
    *TALLY.lock().unwrap().entry(what).or_default() += n;
}

async fn run_case(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let one = standalone().await;
    let many = standalone().await;
    for r in [&one, &many] {
        for i in [0, 1, 2, 4] {
            admin::promo_set(&r.ledger, &id(PROMOS[i]), spec(i), false)
                .await
                .unwrap();
        }
    }
    let mut carry: Vec<Line> = Vec::new();
    for (n, step) in steps.iter().enumerate() {
        match step {
            Step::Batch { placements, split } => {
                let mut lines = std::mem::take(&mut carry);
                lines.extend(placements.iter().flatten().cloned());
                if *split && placements.last().is_some_and(|p| p.len() > 1) {
                    carry.push(lines.pop().expect("a line"));
                    count("placements split across batches", 1);
                }
                let mut expected = Vec::new();
                for l in &lines {
                    let c = call(&one, l);
                    let got = one.eval(scripts::DEDUCT.body, c.keys, c.args).await;
                    expected.push(show(&one, got.map_err(|e| e.details().to_owned())));
                }
                let batch = calls::deduct_batch(lines.iter().map(|l| call(&many, l)).collect());
                let reply = many
                    .eval(scripts::DEDUCT_BATCH.body, batch.keys, batch.args)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("step {n}: the batch call: {e}")))?;
                let Value::Array(items) = reply else {
                    return Err(TestCaseError::fail(format!("batch reply {reply:?}")));
                };
                prop_assert_eq!(items.len(), lines.len(), "step {}: one element a line", n);
                for (i, (item, want)) in items.into_iter().zip(&expected).enumerate() {
                    let got = show(&many, Ok(item));
                    prop_assert_eq!(
                        &got,
                        want,
                        "step {}, line {} of {}: {:?}\nbatch {:?}",
                        n,
                        i,
                        lines.len(),
                        lines[i],
                        lines
                    );
                }
                tally_batch(&lines, &expected);
            }
            other => {
                let want = other_step(&one, other).await;
                let got = other_step(&many, other).await;
                prop_assert_eq!(got, want, "step {}: {:?}", n, other);
                count("steps between batches", 1);
            }
        }
        let (a, b) = (one.dump().await, many.dump().await);
        let (a, b) = (strip(&one, &a), strip(&many, &b));
        if a != b {
            let a: BTreeMap<_, _> = a.into_iter().collect();
            let b: BTreeMap<_, _> = b.into_iter().collect();
            return Err(TestCaseError::fail(format!(
                "step {n}: {step:?}: the keys differ (one by one vs batched): {:?}",
                diff(&a, &b)
            )));
        }
    }
    CASES.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// What the batch held, for the printed tally and the final check that
/// the cases reached the places that matter.
fn tally_batch(lines: &[Line], replies: &[String]) {
    count("batches", 1);
    count("lines", lines.len());
    let mut events = std::collections::BTreeSet::new();
    let mut orders = std::collections::BTreeMap::<usize, usize>::new();
    let mut same_event_lines = false;
    for l in lines {
        if !events.insert((l.event, l.promo)) {
            count("duplicate lines within a batch", 1);
        }
        *orders.entry(order_of(l.event)).or_default() += 1;
        same_event_lines |= lines
            .iter()
            .any(|m| m.event == l.event && m.promo != l.promo);
    }
    if same_event_lines {
        count("batches holding two lines of one order", 1);
    }
    let hot = lines.iter().filter(|l| l.promo == 0).count();
    if hot > 1 {
        count("batches with several lines of the hot promotion", 1);
    }
    for (i, r) in replies.iter().enumerate() {
        if r.contains("\"accepted\"") {
            count("accepted", 1);
        }
        if r.contains("budget_exceeded") || r.contains("stock_insufficient") {
            count("ran out", 1);
            if lines[..i]
                .iter()
                .zip(replies)
                .any(|(l, r)| l.promo == lines[i].promo && r.contains("\"accepted\""))
            {
                count("ran out after an acceptance in the same batch", 1);
            }
        }
        if r.contains("user_limit_reached") {
            count("user limit reached", 1);
        }
        if r.starts_with("error CORRUPT") {
            count("corrupt lines", 1);
            if i > 0 && i + 1 < replies.len() {
                count("corrupt lines in the middle of a batch", 1);
            }
        }
        if r.contains("corrupt_promotion") {
            count("corrupt_promotion replayed", 1);
        }
        if r.contains("promotion_inactive") {
            count("inactive", 1);
        }
        if r.contains("order_reverted") {
            count("order reverted", 1);
        }
    }
}

/// A coalesced batch decides every line exactly as deduct.lua one line at
/// a time, whatever happens between batches.
#[test]
fn coalesced_batches_decide_as_deduct_lua_one_by_one() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(64);
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
    let result = runner.run(&prop::collection::vec(step(), 20..=40), |steps| {
        rt.block_on(run_case(steps))
    });
    let tally = TALLY.lock().unwrap().clone();
    println!(
        "coalesced batches: {} cases passed (configured: {cases})",
        CASES.load(Ordering::Relaxed)
    );
    for (k, v) in &tally {
        println!("  {k:<50} {v}");
    }
    if let Err(e) = result {
        panic!("{e}");
    }
    for needed in [
        "duplicate lines within a batch",
        "batches holding two lines of one order",
        "placements split across batches",
        "ran out after an acceptance in the same batch",
        "user limit reached",
        "corrupt lines in the middle of a batch",
        "corrupt_promotion replayed",
        "order reverted",
        "inactive",
        "steps between batches",
    ] {
        assert!(
            tally.get(needed).is_some_and(|&n| n > 0),
            "no case reached {needed:?}: {tally:?}"
        );
    }
}

/// deduct_batch.lua before coalescing (issue 14): deduct.lua's body per
/// line, each line reading its promotion and writing its own HINCRBYs. Kept
/// here only for [`measure_coalescing`]'s before/after.
const UNCOALESCED_LOOP: &str = r#"
local n = tonumber(ARGV[1])
local out = {}
for i = 0, n - 1 do
  local keys = { KEYS[4 * i + 1], KEYS[4 * i + 2], KEYS[4 * i + 3], KEYS[4 * i + 4] }
  local args = {}
  for j = 1, 7 do args[j] = ARGV[1 + 7 * i + j] end
  local ok, r = pcall(deduct_one, keys, args)
  if not ok then r = { err = type(r) == 'table' and (r.err or r.fail) or tostring(r) } end
  if type(r) == 'table' and r.err then out[i + 1] = { 'ERR', r.err } else out[i + 1] = r end
end
return out
"#;

/// Redis time per batch call, uncoalesced vs coalesced (INFO commandstats:
/// usec per EVALSHA, and the commands the scripts ran per call), over the
/// same batches of 32 fresh placement lines: `hot` (every line on one
/// promotion) and `spread` (32 promotions, one line each). The two scripts
/// run in alternating blocks of 10 calls, each on its own keyspace, so the
/// load of a shared machine falls on both alike. A measurement, not a check
/// (no speed assertion):
/// `cargo test --test it ledger::scripts::coalesce::measure -- --ignored --nocapture`
/// (BLOCKS sets the blocks a script and workload, default 40).
#[test]
#[ignore = "a measurement; run by hand"]
fn measure_coalescing() {
    let blocks: usize = std::env::var("BLOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(measure(blocks));
}

async fn measure(blocks: usize) {
    use fred::prelude::{Client, ClientLike, LuaInterface};
    use fred::types::{ClusterHash, CustomCommand};
    async fn run(client: &Client, name: &'static str, args: &[&str]) -> String {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let cmd = CustomCommand::new_static(name, ClusterHash::FirstKey, false);
        let v: Value = client.custom(cmd, args).await.unwrap();
        v.as_string().unwrap_or_default()
    }
    /// Seconds of CPU of Redis's main thread so far (INFO cpu).
    fn cpu(info: &str) -> f64 {
        info.lines()
            .filter(|l| {
                l.starts_with("used_cpu_user_main_thread:")
                    || l.starts_with("used_cpu_sys_main_thread:")
            })
            .filter_map(|l| l.split_once(':')?.1.trim().parse::<f64>().ok())
            .sum()
    }
    /// (command -> (calls, usec)) of INFO commandstats.
    fn stats(info: &str) -> BTreeMap<String, (f64, f64)> {
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter_map(|l| {
                let (name, rest) = l.split_once(':')?;
                let field = |f: &str| -> f64 {
                    rest.split(',')
                        .find_map(|kv| kv.strip_prefix(&format!("{f}=")))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0.0)
                };
                Some((name.to_owned(), (field("calls"), field("usec"))))
            })
            .collect()
    }
    let old_body = format!(
        "{}local function deduct_one(KEYS, ARGV)\n{}\nend\n{UNCOALESCED_LOOP}",
        include_str!("../../../../lua/lib.lua"),
        include_str!("../../../../lua/deduct.lua"),
    );
    let scripts = [
        ("uncoalesced", old_body.as_str()),
        ("coalesced", scripts::DEDUCT_BATCH.body),
    ];
    println!(
        "{:<8} {:<12} {:>7} {:>10} {:>10} {:>10} {:>10}  script commands per call (their usec)",
        "workload", "script", "calls", "usec/call", "usec/line", "lua us", "cpu us/call"
    );
    let mut per_call = BTreeMap::new();
    for workload in ["hot", "spread"] {
        let mut spaces = Vec::new();
        for (_, body) in scripts {
            let r = standalone().await;
            for i in 0..32 {
                let big = "999999999999";
                r.seed(
                    &format!("p{i}"),
                    &[
                        ("budget", big),
                        ("stock", big),
                        ("initial_budget", big),
                        ("initial_stock", big),
                        ("gen", "1"),
                    ],
                )
                .await;
            }
            let client = r.pool().next().clone();
            let sha = run(&client, "SCRIPT", &["LOAD", body]).await;
            spaces.push((
                r,
                client,
                sha,
                0.0f64,
                0.0f64,
                BTreeMap::<String, (f64, f64)>::new(),
                0.0f64,
            ));
        }
        let mut batch = 0;
        for _ in 0..blocks {
            // Each goes first in every other block.
            spaces.reverse();
            for (r, client, sha, calls, usec, commands, cpu_secs) in spaces.iter_mut() {
                run(client, "CONFIG", &["RESETSTAT"]).await;
                let cpu0 = cpu(&run(client, "INFO", &["cpu"]).await);
                for _ in 0..10 {
                    batch += 1;
                    let mut keys = Vec::new();
                    let mut args = vec!["32".to_owned()];
                    for i in 0..32 {
                        let p = format!("p{}", if workload == "hot" { 0 } else { i });
                        let e = format!("e{batch}x{i}");
                        let c = format!("c{}", (batch * 32 + i) % 1000);
                        let k = r.keys().deduct_line(&id(&p), &id(&e), &id(&c), &id(&e));
                        keys.extend(k.into_vec());
                        args.extend([
                            "5".to_owned(),
                            "1".to_owned(),
                            "1800000000".to_owned(),
                            e,
                            "2592000".to_owned(),
                            "604800".to_owned(),
                            c,
                        ]);
                    }
                    let _: Value = client.evalsha(sha.as_str(), keys, args).await.unwrap();
                }
                *cpu_secs += cpu(&run(client, "INFO", &["cpu"]).await) - cpu0;
                let s = stats(&run(client, "INFO", &["commandstats"]).await);
                let (c, u) = s["evalsha"];
                *calls += c;
                *usec += u;
                for (name, (n, u)) in s {
                    if !["evalsha", "script"].contains(&name.as_str())
                        && !name.starts_with("config")
                        && !name.starts_with("info")
                    {
                        let e = commands.entry(name).or_default();
                        e.0 += n;
                        e.1 += u;
                    }
                }
            }
        }
        if blocks % 2 == 1 {
            spaces.reverse();
        }
        for ((script, _), (_, _, _, calls, usec, commands, cpu_secs)) in scripts.iter().zip(&spaces)
        {
            let inner: f64 = commands.values().map(|(_, u)| u).sum();
            let commands: Vec<String> = commands
                .iter()
                .map(|(k, (n, u))| format!("{k} {:.0} ({:.0} us)", n / calls, u / calls))
                .collect();
            println!(
                "{workload:<8} {script:<12} {calls:>7} {:>10.1} {:>10.2} {:>10.1} {:>10.1}  {}",
                usec / calls,
                usec / calls / 32.0,
                (usec - inner) / calls,
                cpu_secs * 1e6 / calls,
                commands.join(", ")
            );
            per_call.insert((workload, *script), (usec / calls, cpu_secs / calls));
        }
    }
    for workload in ["hot", "spread"] {
        let (new, old) = (
            per_call[&(workload, "coalesced")],
            per_call[&(workload, "uncoalesced")],
        );
        println!(
            "{workload}: coalesced / uncoalesced per batch call: EVALSHA usec {:.2}, main-thread CPU {:.2}",
            new.0 / old.0,
            new.1 / old.1
        );
    }
}
