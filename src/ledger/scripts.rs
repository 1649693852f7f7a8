//! The Lua scripts of `lua/`: compiled in, called by SHA1 with EVALSHA, and
//! sent whole with EVAL when a node's script cache lacks them (`NOSCRIPT`:
//! after a restart, a failover or `SCRIPT FLUSH`; EVAL also caches it there).
//! Each Cluster node has its own cache, and EVALSHA/EVAL are routed by the
//! first key, so the fallback runs on the node that said `NOSCRIPT`.
//! `lua/lib.lua` (helpers shared by the scripts) is compiled in front of
//! each script that uses it: the SHA1 is of that whole text.
//!
//! The calls are built in [`super::calls`], their replies decoded in
//! [`super::reply`].

use std::collections::HashMap;
use std::sync::LazyLock;

use fred::bytes_utils::Str;
use fred::prelude::{Client, Key, LuaInterface, Value};

use super::error::{classify, ErrorClass};

/// One script: its metric name, body and SHA1 (computed once).
#[derive(Debug, PartialEq, Eq)]
pub struct Script {
    pub name: &'static str,
    pub body: &'static str,
    pub sha1: String,
    /// `sha1` as fred's shared string: a clone per call copies nothing.
    sha1_str: Str,
}

impl Script {
    /// A script whose text is final (no mutant applies to it).
    fn composed(name: &'static str, body: &'static str) -> Script {
        let sha1 = fred::util::sha1_hash(body);
        Script {
            name,
            body,
            sha1_str: Str::from(sha1.as_str()),
            sha1,
        }
    }

    fn new(name: &'static str, body: &'static str) -> Script {
        #[cfg(feature = "mutants")] // TEST-ONLY mutant: a redelivery deducts again.
        let body = if name == "deduct" && crate::mutants::mutant("double-deduct") {
            String::leak(format!("{DOUBLE_DEDUCT}{body}"))
        } else if name == "deduct_batch" && crate::mutants::mutant("double-deduct") {
            assert!(
                body.contains(FRESH_MEMO_READ),
                "double-deduct: deduct_batch.lua changed"
            );
            String::leak(
                body.replace(DEDUCT_ONE, &format!("{DEDUCT_ONE}{DOUBLE_DEDUCT}"))
                    .replace(
                        FRESH_MEMO_READ,
                        &format!("{DOUBLE_DEDUCT_FRESH}{FRESH_MEMO_READ}"),
                    ),
            )
        } else {
            body
        };
        #[cfg(feature = "mutants")] // TEST-ONLY mutant: a coalesced line skips its own check.
        let body = patched(
            body,
            name,
            "coalesce-skip-check",
            &["deduct_batch"],
            COALESCE_RUNNING,
        );
        #[cfg(feature = "mutants")] // TEST-ONLY mutant: a promotion kept too long.
        let body = patched(
            body,
            name,
            "batch-promo-stale",
            &["rollback_batch", "release_batch"],
            FORGET_PROMOS,
        );
        #[cfg(feature = "mutants")] // TEST-ONLY mutant: corrupt data is not remembered.
        let body = patched(body, name, "forget-corrupt", &[], (REMEMBER_CORRUPT, ""));
        #[cfg(feature = "mutants")] // TEST-ONLY mutant: a give leaves no "moved on" memo.
        let body = patched(
            body,
            name,
            "bucket-no-gift-memo",
            &["bucket"],
            (GIFT_MEMO, ""),
        );
        Script::composed(name, String::leak(cut_unused(body)))
    }
}

/// TEST-ONLY (feature `mutants`): `body` with `from` replaced by `to` when
/// `mutant` is the one chosen and script `name` is one of `scripts` (empty:
/// every script); panics when the text to replace is gone, so that a changed
/// script never leaves the mutant silently the real build.
#[cfg(feature = "mutants")]
fn patched(
    body: &'static str,
    name: &str,
    mutant: &str,
    scripts: &[&str],
    (from, to): (&str, &str),
) -> &'static str {
    if !(scripts.is_empty() || scripts.contains(&name)) || !crate::mutants::mutant(mutant) {
        return body;
    }
    assert!(body.contains(from), "{mutant}: {name}.lua changed");
    String::leak(body.replace(from, to))
}

/// TEST-ONLY (feature `mutants`): put in front of deduct.lua, forgets the
/// record (KEYS[3]) when it is this event's (ARGV[4]; the lean layout's second
/// field): a redelivery deducts again.
#[cfg(feature = "mutants")]
const DOUBLE_DEDUCT: &str = "local v = redis.pcall('GET', KEYS[3]) if type(v) == 'string' and \
     string.sub(v, 3, #ARGV[4] + 3) == ARGV[4] .. '|' then redis.call('DEL', KEYS[3]) end\n";

/// The first read of lua/deduct_batch.lua's fresh line (its memo); the
/// double-deduct mutant goes in front of it.
#[cfg_attr(not(feature = "mutants"), allow(dead_code))]
const FRESH_MEMO_READ: &str = "  if redis.pcall('GET', k_memo) ~= false then return nil end\n";

/// TEST-ONLY (feature `mutants`): DOUBLE_DEDUCT in the fresh line of
/// lua/deduct_batch.lua, whose record key and event are `k_record` and
/// `event`.
#[cfg(feature = "mutants")]
const DOUBLE_DEDUCT_FRESH: &str =
    "  local v = redis.pcall('GET', k_record) if type(v) == 'string' and \
     string.sub(v, 3, #event + 3) == event .. '|' then redis.call('DEL', k_record) end\n";

/// TEST-ONLY (feature `mutants`): in lua/deduct_batch.lua, the move of the
/// running balance when a line of a coalesced batch deducts. Without it,
/// every later line checks its budget and stock against what was read at
/// the start of the call, not against what the lines before it left, while
/// the write at the end still sums every line's deduction.
#[cfg_attr(not(feature = "mutants"), allow(dead_code))]
const COALESCE_RUNNING: (&str, &str) = (
    "p[field] = p[field] + tonumber(by)",
    "-- (mutant coalesce-skip-check) the running balance stays as read",
);

/// TEST-ONLY (feature `mutants`): in lua/rollback_batch.lua and
/// lua/release_batch.lua, the line that drops the promotions the in-line
/// lines read when a line is handed to the single script's body (which may
/// give units back). Without it, a later in-line line of that promotion
/// answers (a refund's remaining budget) or credits (a release, capped at
/// the initial amount) from what was read before.
#[cfg_attr(not(feature = "mutants"), allow(dead_code))]
const FORGET_PROMOS: (&str, &str) = (
    "  if not ok or r == nil then promos = {} end\n",
    "  -- (mutant batch-promo-stale) the promotions read are kept\n",
);

/// The line that wraps lua/deduct.lua's body into a function of
/// lua/deduct_batch.lua; `read_promotion` and `redis` are the batch's
/// coalescing stand-ins (see the header of deduct_batch.lua).
#[cfg_attr(not(feature = "mutants"), allow(dead_code))]
const DEDUCT_ONE: &str = "local function deduct_one(KEYS, ARGV, read_promotion, redis)\n";

/// TEST-ONLY (feature `mutants`): the line of lua/lib.lua's
/// `remembering_corrupt` that stores the memo; without it, corrupt data is
/// forgotten as before the fix of issue 10 item 1, and a redelivery after the
/// data is repaired decides afresh.
/// lua/bucket.lua's Give: the gift memo at the giver (issue 28's "moved
/// on" memo), which the `bucket-no-gift-memo` mutant leaves out.
#[cfg_attr(not(feature = "mutants"), allow(dead_code))]
const GIFT_MEMO: &str = "  write_gift(e, a, { state = 'g', units = total, to = receiver })";

#[cfg_attr(not(feature = "mutants"), allow(dead_code))]
const REMEMBER_CORRUPT: &str =
    "if is_corrupt(err) then redis.call('SET', key, value, 'EX', ttl) end";

/// A script of `lua/` with `lua/lib.lua` (the shared helpers) in front:
/// Redis scripts cannot load one another.
macro_rules! with_lib {
    ($name:literal) => {
        LazyLock::new(|| {
            Script::new(
                $name,
                concat!(
                    include_str!("../../lua/lib.lua"),
                    include_str!(concat!("../../lua/", $name, ".lua"))
                ),
            )
        })
    };
}

pub static DEDUCT: LazyLock<Script> = with_lib!("deduct");
/// deduct.lua's body, unchanged, as `deduct_one(KEYS, ARGV, read_promotion,
/// redis)`, called by lua/deduct_batch.lua for each line of a batch that is
/// not fresh (a fresh line, no memo and no record, the batch decides with
/// its own code), which coalesces the lines' promotion reads and writes
/// (issue 27 item 1).
pub static DEDUCT_BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "deduct_batch",
        concat!(
            include_str!("../../lua/lib.lua"),
            "local function deduct_one(KEYS, ARGV, read_promotion, redis)\n",
            include_str!("../../lua/deduct.lua"),
            "\nend\n",
            include_str!("../../lua/deduct_batch.lua")
        ),
    )
});
pub static RELEASE: LazyLock<Script> = with_lib!("release");
pub static ROLLBACK: LazyLock<Script> = with_lib!("rollback");
pub static MEMO: LazyLock<Script> = with_lib!("memo");
/// rollback.lua's body, unchanged, as `rollback_one(KEYS, ARGV)`, called by
/// lua/rollback_batch.lua for each refund line of a batch.
pub static ROLLBACK_BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "rollback_batch",
        concat!(
            include_str!("../../lua/lib.lua"),
            "local function rollback_one(KEYS, ARGV)\n",
            include_str!("../../lua/rollback.lua"),
            "\nend\n",
            include_str!("../../lua/rollback_batch.lua")
        ),
    )
});
/// release.lua's body, unchanged, as `release_one(KEYS, ARGV)`, called by
/// lua/release_batch.lua for each line of a batch of releases.
pub static RELEASE_BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "release_batch",
        concat!(
            include_str!("../../lua/lib.lua"),
            "local function release_one(KEYS, ARGV)\n",
            include_str!("../../lua/release.lua"),
            "\nend\n",
            include_str!("../../lua/release_batch.lua")
        ),
    )
});
/// memo.lua's body, unchanged, as `memo_one(KEYS, ARGV)`, called by
/// lua/memo_batch.lua for each key of a batch of memo reads.
pub static MEMO_BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "memo_batch",
        concat!(
            include_str!("../../lua/lib.lua"),
            "local function memo_one(KEYS, ARGV)\n",
            include_str!("../../lua/memo.lua"),
            "\nend\n",
            include_str!("../../lua/memo_batch.lua")
        ),
    )
});
pub static PROMO_SET: LazyLock<Script> =
    LazyLock::new(|| Script::new("promo_set", include_str!("../../lua/promo_set.lua")));
// The operator's in-place changes of a live promotion (src/admin/promo.rs).
pub static PROMO_STATUS: LazyLock<Script> = with_lib!("promo_status");
pub static PROMO_ADJUST: LazyLock<Script> = with_lib!("promo_adjust");
pub static PROMO_LIMIT: LazyLock<Script> = with_lib!("promo_limit");
pub static PROMO_DELETE: LazyLock<Script> = with_lib!("promo_delete");
/// One operation of the bucket protocol on one bucket (docs/buckets.md;
/// `super::buckets`): lib.lua and lua/bucket.lua, whole (the mutants
/// applied). What runs is [`bucket`]'s script of the operation.
pub static BUCKET: LazyLock<Script> = with_lib!("bucket");

/// lua/bucket.lua specialised per operation ([`specialize_bucket`]), by name.
static BUCKET_OPS: LazyLock<Vec<(&'static str, Script)>> = LazyLock::new(|| {
    bucket_ops(BUCKET.body)
        .into_iter()
        .map(|op| {
            let body = String::leak(specialize_bucket(BUCKET.body, op));
            (op, Script::composed("bucket", body))
        })
        .collect()
});

/// The script of lua/bucket.lua's operation `op` (`None`: no such
/// operation).
pub fn bucket(op: &str) -> Option<&'static Script> {
    BUCKET_OPS.iter().find(|(o, _)| *o == op).map(|(_, s)| s)
}

/// The operations of a lua/bucket.lua text: the names of its
/// `SIGNATURES` table, in order.
pub fn bucket_ops(body: &str) -> Vec<&str> {
    let mut ops = Vec::new();
    let mut inside = false;
    for line in body.lines() {
        if line == "local SIGNATURES = {" {
            inside = true;
        } else if inside && line == "}" {
            break;
        } else if let Some(name) = signature(line).filter(|_| inside) {
            ops.push(name);
        }
    }
    ops
}

/// The operation a line of lua/bucket.lua's `SIGNATURES` table is for
/// (`  Name = { ... },`).
fn signature(line: &str) -> Option<&str> {
    line.strip_prefix("  ")
        .and_then(|l| l.split_once(" = {"))
        .map(|(name, _)| name)
}

/// lib.lua + lua/bucket.lua (`body`) cut down to what operation `op` runs:
/// the other operations' `function OPS.X` and their `SIGNATURES` entries
/// left out, then every top-level `local function` that nothing left
/// names, until none is. The script's behaviour for `op` is the whole
/// script's: its dispatch, checks and helpers are the same text.
///
/// Why: Redis runs a script's top level on every call, and each function
/// it defines is a closure allocated anew (about 400 instructions, plus
/// about 180 per upvalue), each table constructor too (SIGNATURES held
/// 27). The whole script spent about 250,000 instructions of the server
/// before its operation began, about 17x what the cheapest operation then
/// does (docs/benchmarks.md, "Bucket calls cut down per operation").
///
/// The texts' layout is what this relies on, and lua/bucket.lua's header
/// says so: a top-level function starts at column 0 (`local function` or
/// `function OPS.`) and ends at the next line that is exactly `end`, or
/// on its own line when that line closes it (a one-line function).
pub fn specialize_bucket(body: &str, op: &str) -> String {
    let keep_op = |name: &str| name == op || (op == "AdjustMark" && name == "TransferMark");
    let mut lines: Vec<&str> = Vec::new();
    let mut skipping = false;
    let mut in_signatures = false;
    for line in body.lines() {
        if skipping {
            skipping = line != "end";
            continue;
        }
        if line.trim_start().starts_with("--") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("function OPS.") {
            let name = rest.split('(').next().unwrap_or_default();
            if !keep_op(name) {
                skipping = !one_line(line);
                continue;
            }
        }
        if line == "OPS.AdjustMark = OPS.TransferMark" && op != "AdjustMark" {
            continue;
        }
        if line == "local SIGNATURES = {" {
            in_signatures = true;
        } else if in_signatures && line == "}" {
            in_signatures = false;
        } else if in_signatures && signature(line).is_some_and(|name| name != op) {
            continue;
        }
        lines.push(line);
    }
    cut(lines)
}

/// A script's text without its comment lines and without the top-level
/// definitions nothing in it names (src/ledger/scripts.rs composes lib.lua
/// in front of every script, and a script names only some of its helpers):
/// Redis runs a script's top level on every call, so each unused closure
/// or table is work for nothing. The layout this relies on is lua/bucket.lua's
/// header's ([`specialize_bucket`]).
pub fn cut_unused(body: &str) -> String {
    cut(body
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect())
}

/// `lines` without the top-level definitions nothing names.
fn cut(mut lines: Vec<&str>) -> String {
    // Functions nothing names, until none is left: a function goes when
    // every use of its name is inside itself; the words of what went no
    // longer count.
    let blocks = definitions(&lines);
    let block_words: Vec<Vec<&str>> = blocks
        .iter()
        .map(|(_, from, to)| {
            lines[*from..=*to]
                .iter()
                .flat_map(|l| words(code(l)))
                .collect()
        })
        .collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for w in lines.iter().flat_map(|l| words(code(l))) {
        *count.entry(w).or_default() += 1;
    }
    let mut gone = vec![false; blocks.len()];
    loop {
        let mut changed = false;
        for (i, (name, _, _)) in blocks.iter().enumerate() {
            let own = block_words[i].iter().filter(|w| *w == name).count();
            if !gone[i] && count.get(name).copied().unwrap_or(0) == own {
                gone[i] = true;
                changed = true;
                for w in &block_words[i] {
                    if let Some(c) = count.get_mut(w) {
                        *c -= 1;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for (i, (_, from, to)) in blocks.iter().enumerate().rev() {
        if gone[i] {
            lines.drain(*from..=*to);
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// Whether a top-level function's first line also closes it.
fn one_line(line: &str) -> bool {
    let n = |k: &str| words(line).filter(|w| *w == k).count();
    line.ends_with(" end") && n("function") + n("if") + n("do") == n("end")
}

/// The top-level definitions of `lines`, name, first and last line: each
/// `local function` and each `local NAME = ...` whose value calls nothing
/// (a table constructor over several lines ends where its braces close).
fn definitions<'a>(lines: &[&'a str]) -> Vec<(&'a str, usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let end = if let Some(rest) = line.strip_prefix("local function ") {
            let name = rest.split('(').next().unwrap_or_default();
            let end = if one_line(line) {
                i
            } else {
                (i + 1..lines.len())
                    .find(|&j| lines[j] == "end")
                    .unwrap_or(lines.len() - 1)
            };
            out.push((name, i, end));
            end
        } else if let Some((name, _)) = line
            .strip_prefix("local ")
            .and_then(|rest| rest.split_once(" = "))
            .filter(|(name, _)| words(name).count() == 1 && !name.contains(','))
        {
            let mut depth = 0i64;
            let mut end = i;
            for (j, l) in lines.iter().enumerate().skip(i) {
                let code = code(l);
                depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
                end = j;
                if depth <= 0 {
                    break;
                }
            }
            // Only a value that calls nothing (a constant, a table of
            // constants): a call may write, or fail on purpose.
            if !lines[i..=end].iter().any(|l| code(l).contains('(')) {
                out.push((name, i, end));
            }
            end
        } else {
            i
        };
        i = end + 1;
    }
    out
}

/// `line` without its comment (the texts have no `--` inside a string and
/// no block comments).
fn code(line: &str) -> &str {
    line.split("--").next().unwrap_or_default()
}

/// The identifiers (and numbers) of `line`.
fn words(line: &str) -> impl Iterator<Item = &str> {
    line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}
/// Finishes an operator's change of a bucketed promotion (issue 28).
pub static PROMO_OP_DONE: LazyLock<Script> = with_lib!("promo_op_done");
/// `deductor audit`'s read of one promotion at one instant (reads only).
pub static AUDIT: LazyLock<Script> =
    LazyLock::new(|| Script::new("audit", include_str!("../../lua/audit.lua")));

/// Every script, for `SCRIPT LOAD` at startup.
pub fn all() -> Vec<&'static Script> {
    let mut all: Vec<&'static Script> = vec![
        &DEDUCT,
        &DEDUCT_BATCH,
        &RELEASE,
        &RELEASE_BATCH,
        &ROLLBACK,
        &ROLLBACK_BATCH,
        &MEMO,
        &MEMO_BATCH,
        &PROMO_SET,
        &PROMO_STATUS,
        &PROMO_ADJUST,
        &PROMO_LIMIT,
        &PROMO_DELETE,
        &AUDIT,
        &PROMO_OP_DONE,
    ];
    all.extend(BUCKET_OPS.iter().map(|(_, s)| s));
    all
}

/// Runs `call` on `client` and records its duration
/// (`deductor_script_duration_seconds`); when it took longer than `slow`,
/// also counts it as slow and returns how long it took, for the caller's
/// warning (which names what the call was for).
pub(crate) async fn eval_timed(
    client: &Client,
    call: super::calls::Call,
    slow: std::time::Duration,
) -> (
    Result<Value, fred::error::Error>,
    Option<std::time::Duration>,
) {
    let start = std::time::Instant::now();
    let result = eval(client, call.script, call.keys, call.args).await;
    let took = start.elapsed();
    crate::metrics::script_duration(call.script.name, took.as_secs_f64());
    let slow = (took > slow).then(|| {
        crate::metrics::slow_script(call.script.name);
        took
    });
    (result, slow)
}

/// EVALSHA, falling back to EVAL on `NOSCRIPT`. The keys and arguments are
/// sent as slices of one buffer (see [`one_buffer`]); the fallback's copies
/// of them share it.
pub(crate) async fn eval(
    client: &Client,
    script: &Script,
    keys: Vec<String>,
    args: Vec<String>,
) -> Result<Value, fred::error::Error> {
    let (keys, args) = one_buffer(&keys, &args);
    match client
        .evalsha::<Value, _, _, _>(script.sha1_str.clone(), keys.clone(), args.clone())
        .await
    {
        Err(e) if classify(&e) == ErrorClass::NoScript => {
            tracing::debug!(
                script = script.name,
                "script not cached on the node; sending it whole"
            );
            client.eval::<Value, _, _, _>(script.body, keys, args).await
        }
        other => other,
    }
}

/// A call's keys and arguments copied into one buffer, each handed to fred
/// as a slice of it (a byte string, as Redis receives every argument).
/// A buffer per string, as `Key::from(String)` gives, is copied into a
/// shared buffer of its own the first time it is cloned, and the NOSCRIPT
/// fallback above clones them all: two allocations per key or argument, and
/// a batch call of 16 lines has over 200 of them. One buffer costs two
/// allocations a call, and its slices' clones only count references.
fn one_buffer(keys: &[String], args: &[String]) -> (Vec<Key>, Vec<Value>) {
    let len = keys.iter().chain(args).map(String::len).sum();
    let mut buf = fred::bytes::BytesMut::with_capacity(len);
    for s in keys.iter().chain(args) {
        buf.extend_from_slice(s.as_bytes());
    }
    let buf = buf.freeze();
    let mut at = 0;
    let mut next = |s: &String| {
        let b = buf.slice(at..at + s.len());
        at += s.len();
        b
    };
    let keys = keys.iter().map(|s| Key::from(next(s))).collect();
    let args = args.iter().map(|s| Value::Bytes(next(s))).collect();
    (keys, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key and argument comes out of the one buffer as it went in,
    /// empty and multi-byte ones included, in order.
    #[test]
    fn one_buffer_hands_each_string_back_whole() {
        let keys = vec![
            "promo:{p1}".to_string(),
            String::new(),
            "k\u{e9}y".to_string(),
        ];
        let args = vec![
            String::new(),
            "12".to_string(),
            "\u{1F600}x".to_string(),
            String::new(),
        ];
        let (k, a) = one_buffer(&keys, &args);
        let k: Vec<&[u8]> = k.iter().map(|k| k.as_bytes()).collect();
        let want_k: Vec<&[u8]> = keys.iter().map(|s| s.as_bytes()).collect();
        assert_eq!(k, want_k);
        let a: Vec<Vec<u8>> = a
            .iter()
            .map(|v| match v {
                Value::Bytes(b) => b.to_vec(),
                other => panic!("not a byte string: {other:?}"),
            })
            .collect();
        let want_a: Vec<Vec<u8>> = args.iter().map(|s| s.as_bytes().to_vec()).collect();
        assert_eq!(a, want_a);
        assert_eq!(one_buffer(&[], &[]).0.len(), 0);
    }

    /// The forget-corrupt mutant removes this line; if lib.lua changes, the
    /// mutant would silently be the real build.
    #[test]
    fn the_forget_corrupt_mutant_finds_its_line() {
        assert!(include_str!("../../lua/lib.lua").contains(REMEMBER_CORRUPT));
    }

    /// The coalesce-skip-check, double-deduct and batch-promo-stale mutants
    /// patch these texts of the batch scripts.
    #[test]
    fn the_batch_mutants_find_their_text() {
        assert!(DEDUCT_BATCH.body.contains(COALESCE_RUNNING.0));
        assert!(DEDUCT_BATCH.body.contains(DEDUCT_ONE));
        assert!(DEDUCT_BATCH.body.contains(FRESH_MEMO_READ));
        assert!(ROLLBACK_BATCH.body.contains(FORGET_PROMOS.0));
        assert!(RELEASE_BATCH.body.contains(FORGET_PROMOS.0));
    }

    /// Each operation's script keeps its own operation, signature and
    /// every function it calls, and leaves the others out.
    #[test]
    fn each_bucket_operation_has_a_script_of_its_own() {
        let ops = bucket_ops(BUCKET.body);
        assert_eq!(ops.len(), 28, "{ops:?}");
        for op in &ops {
            let s = bucket(op).expect("a script per operation");
            assert_eq!(s.name, "bucket", "one metric name for all");
            let defines = |name: &str| s.body.contains(&format!("function OPS.{name}("));
            let expected = if *op == "AdjustMark" {
                "TransferMark"
            } else {
                op
            };
            assert!(defines(expected), "{op}: its function");
            for other in ops.iter().filter(|o| **o != expected) {
                assert!(!defines(other), "{op}: also defines {other}");
            }
            let signatures: Vec<&str> = bucket_ops(s.body);
            assert_eq!(signatures, [*op], "{op}: its signature alone");
            // Every definition a remaining line names is still there
            // (comments aside).
            let body: Vec<&str> = s.body.lines().collect();
            let kept = definitions(&body);
            for (name, _, _) in definitions(&BUCKET.body.lines().collect::<Vec<_>>()) {
                let code = |l: &&str| l.split("--").next().unwrap_or_default().to_owned();
                let named = body.iter().enumerate().any(|(i, l)| {
                    let own = kept
                        .iter()
                        .any(|(n, from, to)| *n == name && (*from..=*to).contains(&i));
                    !own && words(&code(l)).any(|w| w == name)
                });
                let defined = kept.iter().any(|(n, _, _)| *n == name);
                assert!(!named || defined, "{op}: names {name} but lost it");
            }
            assert!(
                s.body.len() < BUCKET.body.len() * 3 / 4,
                "{op}: not cut down"
            );
            assert!(s.body.ends_with("return run(main)\n"), "{op}: its dispatch");
        }
        assert!(bucket("Deduct").is_none());
        // The startup load covers them.
        let loaded: Vec<&str> = all().iter().map(|s| s.sha1.as_str()).collect();
        assert!(ops
            .iter()
            .all(|op| loaded.contains(&bucket(op).map_or("", |s| s.sha1.as_str()))));
    }

    /// The cut is by the texts' layout: one-line functions, and a
    /// function only another unused function names, go too.
    #[test]
    fn the_cut_follows_what_is_named() {
        let body = "local function a(x) return x end\n\
                    local function b(x)\n  return a(x)\nend\n\
                    local function c(x) if x then return 1 end return 0 end\n\
                    local function d()\n  return c(1)\nend\n\
                    local OPS = {}\n\
                    function OPS.One()\n  return d()\nend\n\
                    function OPS.Two()\n  return b(1)\nend\n\
                    local SIGNATURES = {\n  One = {},\n  Two = {},\n}\n\
                    local UNUSED = { 1,\n  2 }\n\
                    -- a comment naming a(x)\n\
                    local SIDE = redis.call('INCR', 'x')\n\
                    local CHECKED = tostring(2)\n\
                    local function main()\n  return OPS[op](SIGNATURES[op])\nend\n\
                    return run(main)\n";
        let one = specialize_bucket(body, "One");
        assert_eq!(
            one,
            "local function c(x) if x then return 1 end return 0 end\n\
             local function d()\n  return c(1)\nend\n\
             local OPS = {}\n\
             function OPS.One()\n  return d()\nend\n\
             local SIGNATURES = {\n  One = {},\n}\n\
             local SIDE = redis.call('INCR', 'x')\n\
             local CHECKED = tostring(2)\n\
             local function main()\n  return OPS[op](SIGNATURES[op])\nend\n\
             return run(main)\n"
        );
        let two = specialize_bucket(body, "Two");
        assert!(
            two.contains("function b(") && two.contains("function a("),
            "{two}"
        );
        assert!(
            !two.contains("function c(") && !two.contains("function d("),
            "{two}"
        );
    }

    #[test]
    fn sha1_is_of_the_body() {
        assert_eq!(DEDUCT.sha1.len(), 40);
        assert_ne!(DEDUCT.sha1, ROLLBACK.sha1);
        assert_eq!(DEDUCT.sha1, fred::util::sha1_hash(DEDUCT.body));
    }
}
