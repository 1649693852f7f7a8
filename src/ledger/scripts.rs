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
        let body = if name == "deduct_batch" && crate::mutants::mutant("coalesce-skip-check") {
            assert!(
                body.contains(COALESCE_RUNNING.0),
                "coalesce-skip-check: deduct_batch.lua changed"
            );
            String::leak(body.replace(COALESCE_RUNNING.0, COALESCE_RUNNING.1))
        } else {
            body
        };
        #[cfg(feature = "mutants")] // TEST-ONLY mutant: corrupt data is not remembered.
        let body = if crate::mutants::mutant("forget-corrupt") {
            assert!(
                body.contains(REMEMBER_CORRUPT),
                "forget-corrupt: lib.lua changed"
            );
            String::leak(body.replace(REMEMBER_CORRUPT, ""))
        } else {
            body
        };
        #[cfg(feature = "mutants")] // TEST-ONLY mutant: a give leaves no "moved on" memo.
        let body = if name == "bucket" && crate::mutants::mutant("bucket-no-gift-memo") {
            assert!(
                body.contains(GIFT_MEMO),
                "bucket-no-gift-memo: bucket.lua changed"
            );
            String::leak(body.replace(GIFT_MEMO, ""))
        } else {
            body
        };
        let sha1 = fred::util::sha1_hash(body);
        Script {
            name,
            body,
            sha1_str: Str::from(sha1.as_str()),
            sha1,
        }
    }
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
/// `super::buckets`). Not in [`all`] yet: no bucketed promotion exists
/// until the pipeline walks them.
pub static BUCKET: LazyLock<Script> = with_lib!("bucket");
/// Finishes an operator's change of a bucketed promotion (issue 28).
pub static PROMO_OP_DONE: LazyLock<Script> = with_lib!("promo_op_done");
/// `deductor audit`'s read of one promotion at one instant (reads only).
pub static AUDIT: LazyLock<Script> =
    LazyLock::new(|| Script::new("audit", include_str!("../../lua/audit.lua")));

/// Every script, for `SCRIPT LOAD` at startup.
pub fn all() -> [&'static Script; 16] {
    [
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
        &BUCKET,
        &PROMO_OP_DONE,
    ]
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

/// EVALSHA, falling back to EVAL on `NOSCRIPT`. The keys and arguments
/// become fred's byte buffers once (moved, not copied); the fallback's
/// copies of them share those buffers.
pub(crate) async fn eval(
    client: &Client,
    script: &Script,
    keys: Vec<String>,
    args: Vec<String>,
) -> Result<Value, fred::error::Error> {
    let keys: Vec<Key> = keys.into_iter().map(Key::from).collect();
    let args: Vec<Value> = args.into_iter().map(Value::from).collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The forget-corrupt mutant removes this line; if lib.lua changes, the
    /// mutant would silently be the real build.
    #[test]
    fn the_forget_corrupt_mutant_finds_its_line() {
        assert!(include_str!("../../lua/lib.lua").contains(REMEMBER_CORRUPT));
    }

    /// The coalesce-skip-check mutant and the double-deduct mutant patch
    /// these texts of the batch script.
    #[test]
    fn the_batch_mutants_find_their_text() {
        assert!(DEDUCT_BATCH.body.contains(COALESCE_RUNNING.0));
        assert!(DEDUCT_BATCH.body.contains(DEDUCT_ONE));
        assert!(DEDUCT_BATCH.body.contains(FRESH_MEMO_READ));
    }

    #[test]
    fn sha1_is_of_the_body() {
        assert_eq!(DEDUCT.sha1.len(), 40);
        assert_ne!(DEDUCT.sha1, ROLLBACK.sha1);
        assert_eq!(DEDUCT.sha1, fred::util::sha1_hash(DEDUCT.body));
    }
}
