//! lua/bucket.lua held to the model, call by call, on a real Redis.
//!
//! Each case of the property test (`case()`) runs through the model with
//! its trace on: every call on a bucket, its reply and the bucket's
//! counters after it, and every corruption and repair. The trace is then
//! replayed on Redis: each call runs lua/bucket.lua on the bucket's own
//! keys, and its reply and the bucket's hash afterwards must be the
//! model's. The deliveries' interleavings, crashes and zombies are the
//! model's; what is tested here is that each operation does to Redis what
//! it does to the model, from every state those runs reach.
//!
//! Cases: `PROPTEST_CASES` (default 3,000, at most 300 here: each call is a
//! round trip; `BUCKET_SCRIPT_CASES` sets any number).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use fred::prelude::{ClusterInterface, HashesInterface, KeysInterface};
use fred::util::redis_keyslot;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::bucket::*;
use super::{case, cases, run_traced, Case};
use crate::common::redis::{cluster as cluster_redis, standalone, TestRedis};
use deductor::ledger::buckets::{op_args as args, parse_reply as reply, BucketArg};
use deductor::ledger::scripts;

const BODY: &str = concat!(
    include_str!("../../../../lua/lib.lua"),
    include_str!("../../../../lua/bucket.lua")
);
const TTL: &str = "86400";

/// What replays did: cases, calls, corruptions.
#[derive(Default)]
struct Counts {
    cases: AtomicU64,
    calls: AtomicU64,
    faults: AtomicU64,
    /// Cases whose buckets were served by more than one Cluster node.
    spread: AtomicU64,
}

fn e(id: Ev) -> String {
    id.to_arg()
}

fn n(x: impl ToString) -> String {
    x.to_string()
}

fn int<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("not a number: {s:?}"))
}

fn units(b: &str, s: &str) -> Result<Units, String> {
    Ok(Units::new(int(b)?, int(s)?))
}

/// Bucket j's hash as a `View` (the budget a corruption hid, restored).
fn view(h: &BTreeMap<String, String>, k: usize, hidden: Option<&str>) -> Result<View, String> {
    let f = |name: &str| -> Result<i64, String> {
        match (name, hidden) {
            ("budget", Some(v)) => int(v),
            _ => int(h.get(name).map_or("0", String::as_str)),
        }
    };
    Ok(View {
        avail: Units::new(f("budget")?, f("stock")?),
        held: Units::new(f("held_budget")?, f("held_stock")?),
        tentative: Units::new(f("set_budget")?, f("set_stock")?),
        incr: u64::try_from(f("incr")?).map_err(|e| e.to_string())?,
        notify: u64::try_from(f("notify")?).map_err(|e| e.to_string())?,
        bounds: (0..k)
            .map(|m| match h.get(&format!("bound:{m}")) {
                None => Ok(None),
                Some(x) => {
                    let (b, s) = x.split_once(',').ok_or(format!("bound {x:?}"))?;
                    units(b, s).map(Some)
                }
            })
            .collect::<Result<_, _>>()?,
    })
}

/// A fresh bucket's hash: `share` free, nothing held or set aside, its
/// place among K, the per-customer limit (absent: none).
pub(super) fn bucket_fields(
    share: Units,
    j: usize,
    k: usize,
    limit: Option<u32>,
) -> Vec<(String, String)> {
    let mut fields = vec![
        ("budget".to_owned(), n(share.budget)),
        ("stock".to_owned(), n(share.stock)),
        ("index".to_owned(), n(j)),
        ("buckets".to_owned(), n(k)),
    ];
    for f in [
        "held_budget",
        "held_stock",
        "set_budget",
        "set_stock",
        "incr",
        "notify",
    ] {
        fields.push((f.to_owned(), "0".to_owned()));
    }
    if let Some(limit) = limit {
        fields.push(("per_customer".to_owned(), n(limit)));
    }
    fields
}

async fn replay(
    r: &TestRedis,
    scripts: &Scripts,
    case_no: u64,
    c: &Case,
    trace: &[Traced],
    counts: &Counts,
) -> Result<(), TestCaseError> {
    // Under the test's prefix, as `Keys::bucket` names them (so the
    // test's cleanup and dumps see them).
    let key = |j: usize| format!("{}:{{p{case_no}~{j}}}", r.prefix);
    for j in 0..c.k {
        let fields = bucket_fields(c.initial.share(c.k, j), j, c.k, c.limit);
        let _: () = r.pool().hset(key(j), fields).await.expect("HSET");
        let _: () = r.pool().expire(key(j), 3_600, None).await.expect("EXPIRE");
    }
    if r.cluster {
        if let Some(routing) = r.pool().next().cached_cluster_state() {
            let nodes: std::collections::BTreeSet<String> = (0..c.k)
                .filter_map(|j| routing.get_server(redis_keyslot(key(j).as_bytes())))
                .map(|s| s.to_string())
                .collect();
            if nodes.len() > 1 {
                counts.spread.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    // The budget a corruption hid, per bucket.
    let mut hidden: BTreeMap<usize, String> = BTreeMap::new();
    for (i, t) in trace.iter().enumerate() {
        match t {
            Traced::Corrupt(j) => {
                counts.faults.fetch_add(1, Ordering::Relaxed);
                let v: Option<String> = r.pool().hget(key(*j), "budget").await.expect("HGET");
                hidden.insert(*j, v.expect("a bucket's budget"));
                let _: () = r
                    .pool()
                    .hset(key(*j), ("budget", "corrupt!"))
                    .await
                    .expect("HSET");
            }
            Traced::Repair(j) => {
                // The operator's repair: the counters back, the bounds gone,
                // a notification.
                let v = hidden.remove(j).expect("a repair after a corruption");
                let _: () = r.pool().hset(key(*j), ("budget", v)).await.expect("HSET");
                for m in 0..c.k {
                    let _: () = r
                        .pool()
                        .hdel(key(*j), format!("bound:{m}"))
                        .await
                        .expect("HDEL");
                }
                let _: () = r
                    .pool()
                    .hincrby(key(*j), "notify", 1)
                    .await
                    .expect("HINCRBY");
            }
            Traced::Call(j, op, want, after) => {
                counts.calls.fetch_add(1, Ordering::Relaxed);
                let (name, rest) = args(op);
                let mut argv = vec![name.to_owned(), TTL.to_owned()];
                argv.extend(rest);
                let got = r
                    .eval(scripts.of(name), vec![key(*j)], argv.clone())
                    .await
                    .map_err(|e| format!("script error: {e}"))
                    .and_then(reply);
                let got = match got {
                    Ok(g) => g,
                    Err(e) => {
                        return Err(TestCaseError::fail(format!(
                            "call {i} on bucket {j}, {op:?} ({argv:?}): {e}"
                        )))
                    }
                };
                let want = match want {
                    Reply::Gifts(g) => {
                        let mut g = g.clone();
                        g.sort();
                        Reply::Gifts(g)
                    }
                    w => w.clone(),
                };
                if got != want {
                    return Err(TestCaseError::fail(format!(
                        "call {i} on bucket {j}, {op:?}: the script answered {got:?}, the model {want:?}"
                    )));
                }
                let h: BTreeMap<String, String> = r.pool().hgetall(key(*j)).await.expect("HGETALL");
                let seen = view(&h, c.k, hidden.get(j).map(String::as_str))
                    .map_err(|e| TestCaseError::fail(format!("bucket {j}'s hash {h:?}: {e}")))?;
                if seen != *after {
                    return Err(TestCaseError::fail(format!(
                        "after call {i} on bucket {j}, {op:?}: the hash holds {seen:?}, the model {after:?}"
                    )));
                }
            }
        }
    }
    counts.cases.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// A lua/bucket.lua text specialised per operation, as the service runs
/// it (`scripts::specialize_bucket`).
struct Scripts(BTreeMap<String, String>);

impl Scripts {
    fn new(body: &str) -> Scripts {
        let mut ops = scripts::bucket_ops(body);
        ops.push("Deduct"); // no such operation: its script refuses every call
        Scripts(
            ops.into_iter()
                .map(|op| (op.to_owned(), scripts::specialize_bucket(body, op)))
                .collect(),
        )
    }

    fn of(&self, op: &str) -> &str {
        self.0
            .get(op)
            .map_or("return redis.error_reply('no script')", String::as_str)
    }
}

static SCRIPTS: std::sync::LazyLock<Scripts> = std::sync::LazyLock::new(|| Scripts::new(BODY));

/// Runs up to `cases` cases of the model, each replayed on `body`,
/// specialised per operation.
fn check(
    body: &str,
    cluster: bool,
    cases: u32,
    shrink: u32,
    counts: &Counts,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let r = rt.block_on(async {
        if cluster {
            cluster_redis().await
        } else {
            standalone().await
        }
    });
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: shrink,
        ..Config::default()
    });
    let serial = AtomicU64::new(0);
    let scripts = Scripts::new(body);
    runner
        .run(&case(), |c| {
            let l = run_traced(&c, Mutant::None, true)?;
            let trace = l.trace.expect("a trace");
            let case_no = serial.fetch_add(1, Ordering::Relaxed);
            rt.block_on(replay(&r, &scripts, case_no, &c, &trace, counts))
        })
        .map_err(|e| e.to_string())
}

/// Every call of the model's runs, replayed on lua/bucket.lua, answers as
/// the model does and leaves the bucket's counters and bounds as the model
/// has them.
#[test]
fn the_bucket_script_answers_as_the_model() {
    let counts = Counts::default();
    // BUCKET_SCRIPT_CASES for a longer run; each call is a round trip.
    let n = std::env::var("BUCKET_SCRIPT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| cases(3_000).min(300));
    let result = check(BODY, false, n, 256, &counts);
    println!(
        "bucket script: {} cases, {} calls replayed, {} corruptions",
        counts.cases.load(Ordering::Relaxed),
        counts.calls.load(Ordering::Relaxed),
        counts.faults.load(Ordering::Relaxed)
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The replay can fail: a script that forgets one write is caught.
#[test]
fn a_broken_bucket_script_is_caught() {
    for (what, line, broken) in [
        (
            "a notification does not raise the bound",
            "  if x ~= nil then redis.call('HSET', B, 'bound:' .. to,",
            "  if false then redis.call('HSET', B, 'bound:' .. to,",
        ),
        (
            "a yield does not move the attempt on",
            "  if attempt(e) == num(a) then put(",
            "  if false then put(",
        ),
        // Issue 28's "moved on" memo: a give that leaves no gift memo at
        // the giver (the units move, nothing says where).
        (
            "a give leaves no gift memo",
            "  write_gift(e, a, { state = 'g', units = total, to = receiver })",
            "",
        ),
    ] {
        assert!(BODY.contains(line), "lua/bucket.lua changed: {line:?}");
        let body = BODY.replace(line, broken);
        match check(&body, false, 300, 0, &Counts::default()) {
            Err(e) => println!("caught ({what}): {}", e.lines().next().unwrap_or("")),
            Ok(()) => panic!("not caught in 300 cases: {what}"),
        }
    }
}

/// The same on the Redis Cluster: each bucket's keys on its own slot, the
/// buckets of a case on different nodes where their tags hash there (the
/// script derives every key from KEYS[1], so all of them must be served by
/// the node of KEYS[1]'s slot).
#[test]
fn the_bucket_script_answers_as_the_model_on_a_cluster() {
    let counts = Counts::default();
    let result = check(BODY, true, cases(3_000).min(100), 256, &counts);
    let spread = counts.spread.load(Ordering::Relaxed);
    println!(
        "bucket script on a Cluster: {} cases ({spread} with buckets on several nodes), {} calls replayed",
        counts.cases.load(Ordering::Relaxed),
        counts.calls.load(Ordering::Relaxed),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(spread > 0, "no case had its buckets on two nodes");
}

/// Every malformed call is refused with BADARG before anything is read or
/// written: each argument of each operation replaced by values its kind
/// does not allow, a missing or extra argument, an unknown operation, a
/// bad TTL, a second key.
#[test]
fn a_malformed_call_is_refused_and_writes_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let r = standalone().await;
        let key = format!("{}:{{bad~0}}", r.prefix);
        let fields: Vec<(String, String)> = [
            ("budget", "10"),
            ("stock", "10"),
            ("held_budget", "0"),
            ("held_stock", "0"),
            ("set_budget", "0"),
            ("set_stock", "0"),
            ("incr", "0"),
            ("notify", "0"),
            ("index", "0"),
            ("buckets", "2"),
            ("per_customer", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let _: () = r.pool().hset(&key, fields).await.expect("HSET");
        let u = Units::new(1, 1);
        let credit = Credit {
            from: 1,
            attempt: 0,
            units: u,
        };
        // One call of each operation, with its kinds of arguments.
        let samples: Vec<(Op, &[&str])> = vec![
            (
                Op::Start {
                    ev: 1,
                    cust: 1,
                    units: u,
                    at: 0,
                },
                &["id", "id", "n", "n", "n"],
            ),
            (Op::Peek { ev: 1 }, &["id"]),
            (
                Op::Reject {
                    ev: 1,
                    a: 0,
                    incr: 0,
                    notify: 0,
                    dim: Dim::Stock,
                    saw_corrupt: false,
                    seen: vec![(1, u)],
                },
                &["id", "n", "n", "n", "dim", "flag", "items"],
            ),
            (
                Op::Give {
                    ev: 1,
                    a: 0,
                    want: u,
                    receiver: 1,
                },
                &["id", "n", "n", "n", "n"],
            ),
            (
                Op::Accept {
                    ev: 1,
                    cust: 1,
                    units: u,
                    a: 0,
                    mine: vec![(1, u)],
                },
                &["id", "id", "n", "n", "n", "items"],
            ),
            (Op::Yield { ev: 1, a: 0 }, &["id", "n"]),
            (Op::ReturnAll { ev: 1, upto: 0 }, &["id", "n"]),
            (Op::Reserve { order: 1, cust: 1 }, &["id", "id"]),
            (Op::Settle { ev: 1 }, &["id"]),
            (Op::Undo { ev: 1 }, &["id"]),
            (Op::Unreserve { order: 1 }, &["id"]),
            (
                Op::Cleanup {
                    ev: 1,
                    credited: vec![credit],
                },
                &["id", "items"],
            ),
            (Op::RefundLook { ev: 2, order: 1 }, &["id", "id"]),
            (Op::Notify { to: 1, units: u }, &["n", "n", "n"]),
            (Op::RefundRevert { ev: 2, order: 1 }, &["id", "id"]),
            (Op::ReleaseLook { ev: 1 }, &["id"]),
            (Op::ReleaseRevert { ev: 1 }, &["id"]),
            (Op::Memo { ev: 1 }, &["id"]),
            (Op::TransferMark { id: 3 }, &["id"]),
            (
                Op::TransferTake { id: 3, n: u, to: 1 },
                &["id", "n", "n", "n"],
            ),
            (
                Op::TransferCredit {
                    id: 3,
                    from: 1,
                    took: u,
                },
                &["id", "n", "n", "n"],
            ),
            (Op::TransferSettle { id: 3, credited: u }, &["id", "n", "n"]),
            (Op::AdjustMark { id: 3 }, &["id"]),
            (Op::AdjustCredit { id: 3, share: u }, &["id", "n", "n"]),
            (Op::AdjustRemove { id: 3, share: u }, &["id", "n", "n"]),
            (Op::OpenGifts, &[]),
            (Op::EventState { id: 1 }, &["id"]),
            (Op::GiveBack { id: 1, a: 0 }, &["id", "n"]),
        ];
        let long_id = "x".repeat(65);
        let bad = |kind: &str| -> Vec<String> {
            let v: Vec<&str> = match kind {
                "id" => vec!["", "a b", "x|y", "a:b", "{x}", "é", &long_id],
                "n" => vec![
                    "",
                    "-1",
                    "01",
                    "1e3",
                    " 5",
                    "nan",
                    "0x10",
                    "1234567890123456",
                ],
                "dim" => vec!["", "budget", "order_reverted", "Stock_insufficient"],
                "flag" => vec!["", "2", "true"],
                _ => vec!["1:2", "1:2:x", ";", "1:2:3;", "-1:2:3", "1:2:3:4:5"],
            };
            v.into_iter().map(str::to_owned).collect()
        };
        let before = r.dump().await;
        assert!(
            before.contains_key(&key),
            "the dump sees the bucket: {before:?}"
        );
        let mut refused = 0;
        let mut expect_badarg = |argv: Vec<String>, keys: Vec<String>, what: String| {
            let r = &r;
            let before = &before;
            refused += 1;
            async move {
                let op = argv.first().map_or("", String::as_str);
                let got = r.eval(SCRIPTS.of(op), keys, argv.clone()).await;
                match got {
                    Err(e) if e.details().starts_with("BADARG ") => {}
                    other => panic!("{what}: {argv:?} answered {other:?}, not BADARG"),
                }
                assert_eq!(&r.dump().await, before, "{what}: {argv:?} wrote");
            }
        };
        for (op, kinds) in &samples {
            let (name, good) = args(op);
            assert_eq!(good.len(), kinds.len(), "{name}: the sample's kinds");
            let argv = |rest: Vec<String>| {
                let mut v = vec![name.to_owned(), TTL.to_owned()];
                v.extend(rest);
                v
            };
            for (i, kind) in kinds.iter().enumerate() {
                for b in bad(kind) {
                    let mut rest = good.clone();
                    rest[i] = b;
                    expect_badarg(
                        argv(rest),
                        vec![key.clone()],
                        format!("{name} argument {i}"),
                    )
                    .await;
                }
            }
            let mut more = good.clone();
            more.push("1".into());
            expect_badarg(argv(more), vec![key.clone()], format!("{name}: one more")).await;
            if !good.is_empty() {
                let fewer = good[..good.len() - 1].to_vec();
                expect_badarg(argv(fewer), vec![key.clone()], format!("{name}: one fewer")).await;
            }
            let mut no_ttl = argv(good.clone());
            no_ttl[1] = "0".into();
            expect_badarg(no_ttl, vec![key.clone()], format!("{name}: TTL 0")).await;
            expect_badarg(
                argv(good.clone()),
                vec![key.clone(), key.clone()],
                format!("{name}: two keys"),
            )
            .await;
        }
        expect_badarg(
            vec!["Deduct".into(), TTL.into()],
            vec![key.clone()],
            "an unknown operation".into(),
        )
        .await;
        println!("bucket script: {refused} malformed calls refused, nothing written");
        // A stored value the script cannot read is CORRUPT naming its key
        // (never a Lua runtime error).
        for (suffix, value, op) in [
            (
                format!(":order:{}", e(1)),
                "q|c1|1|1|",
                Op::Start {
                    ev: 1,
                    cust: 1,
                    units: u,
                    at: 0,
                },
            ),
            (
                format!(":order:{}", e(1)),
                "d|c1|x|1|",
                Op::ReleaseLook { ev: 1 },
            ),
            (format!(":attempt:{}", e(4)), "-1", Op::EventState { id: 4 }),
            (
                format!(":gift:{}:0", e(3)),
                "g|1|1",
                Op::TransferTake { id: 3, n: u, to: 1 },
            ),
            (format!(":in:{}", e(3)), "1;1", Op::TransferMark { id: 3 }),
            // Met after what the call would write first: the pending
            // mark's removal, the give-back of a stale gift, the
            // notification's count, the credit's mark, the reservation.
            (
                format!(":order:{}", e(1)),
                "d|c1|1",
                Op::RefundRevert { ev: 2, order: 1 },
            ),
            (
                format!(":gift:{}:0", e(1)),
                "g|1",
                Op::Give {
                    ev: 1,
                    a: 1,
                    want: u,
                    receiver: 1,
                },
            ),
            (
                format!(":in:{}", e(3)),
                "x,1",
                Op::TransferCredit {
                    id: 3,
                    from: 1,
                    took: u,
                },
            ),
            (format!(":used:{}", e(1)), "-", Op::Unreserve { order: 1 }),
        ] {
            let k = format!("{key}{suffix}");
            r.set(&k, value).await;
            // What the call would have read before: a pending mark, the
            // stale gift listed as open, a reservation held.
            r.set(&format!("{key}:resv:{}", e(1)), &format!("h|{}", e(1)))
                .await;
            r.eval(
                "redis.call('ZADD', KEYS[1], 0, ARGV[1]) redis.call('SADD', KEYS[2], ARGV[2])",
                vec![format!("{key}:open"), format!("{key}:pending")],
                vec![format!("{}#0", e(1)), e(2)],
            )
            .await
            .expect("ZADD, SADD");
            let before = r.dump().await;
            assert!(before.contains_key(&k), "the dump sees {k}");
            let (name, rest) = args(&op);
            let mut argv = vec![name.to_owned(), TTL.to_owned()];
            argv.extend(rest);
            match r
                .eval(SCRIPTS.of(name), vec![key.clone()], argv.clone())
                .await
            {
                Err(err) if err.details().starts_with(&format!("CORRUPT {k} ")) => {}
                other => panic!("{k} = {value:?}, {argv:?} answered {other:?}, not CORRUPT {k}"),
            }
            assert_eq!(r.dump().await, before, "{argv:?} wrote before it met {k}");
            r.del(&k).await;
        }
    });
}
