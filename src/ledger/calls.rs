//! Pure builders of every script call: which script, its KEYS and its ARGV,
//! in the order of the script's header (`lua/*.lua`). Nothing here talks to
//! Redis; [`super::Ledger`] sends what these build, and the tests below
//! hold each builder against the KEYS/ARGV lines of its script's header.

use super::scripts::{self, Script};
use crate::domain::event::{Header, Id, PlaceLine, RefundLine};
use crate::domain::keys::Keys;

/// One script call, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub script: &'static Script,
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

/// The TTLs every line script takes, as canonical integers (formatted once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ttls {
    pub record: String,
    pub refund: String,
    /// `deduct.lua`'s `index_ttl_secs` (record TTL + one day) where new
    /// records are indexed by day (a standalone server: `audit P` reads
    /// the index, not the keyspace); `None` on a Redis Cluster, where
    /// `audit` lists slot {P} and no index is kept.
    pub index: Option<String>,
}

/// Seconds in a day: the width of one `promo:{P}:index:<D>`.
pub const DAY_SECS: u64 = 86_400;

impl Ttls {
    pub fn new(record_secs: u64, refund_secs: u64) -> Ttls {
        Ttls {
            record: record_secs.to_string(),
            refund: refund_secs.to_string(),
            index: None,
        }
    }

    /// The same, with new records indexed by day (a standalone server).
    pub fn indexed(mut self, record_secs: u64) -> Ttls {
        self.index = Some(record_secs.saturating_add(DAY_SECS).to_string());
        self
    }
}

/// Today as `promo:{P}:index:<D>` numbers days: unix seconds / 86400.
pub fn today() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / DAY_SECS)
}

fn call(script: &'static Script, keys: Vec<String>, args: Vec<String>) -> Call {
    Call { script, keys, args }
}

/// A line script's call, with the day index's key and arguments after its
/// own (KEYS[5]: `promo:{P}:index:<day>`; the order id and the index TTL)
/// where `ttl.index` says records are indexed.
#[allow(clippy::too_many_arguments)]
fn with_index(
    script: &'static Script,
    keys: &Keys,
    ttl: &Ttls,
    p: &Id,
    h: &Header,
    day: u64,
    mut key_list: Vec<String>,
    mut args: Vec<String>,
) -> Call {
    if let Some(index_ttl) = &ttl.index {
        key_list.push(keys.index(p, day));
        args.push(h.order_id.to_string());
        args.push(index_ttl.clone());
    }
    call(script, key_list, args)
}

/// `deduct.lua` for one placement line; with `ttl.index`, a record it
/// creates is added to the index of `day` (see [`today`]).
pub fn deduct(keys: &Keys, ttl: &Ttls, h: &Header, line: &PlaceLine, day: u64) -> Call {
    let k = keys.deduct_line(&line.promotion_id, &h.order_id, &h.customer_id, &h.event_id);
    let key_list = k.into_vec();
    // Room for the index's two (with_index): no second allocation.
    let mut args = Vec::with_capacity(9);
    args.extend([
        line.budget.to_string(),
        line.stock.to_string(),
        h.occurred_at.to_string(),
        h.event_id.to_string(),
        ttl.record.clone(),
        ttl.refund.clone(),
        h.customer_id.to_string(),
    ]);
    with_index(
        &scripts::DEDUCT,
        keys,
        ttl,
        &line.promotion_id,
        h,
        day,
        key_list,
        args,
    )
}

/// `deduct_batch.lua`: the [`deduct`] calls of `lines`, decided in this
/// order in one call (their keys and arguments are moved, not copied).
pub fn deduct_batch(lines: Vec<Call>) -> Call {
    counted_batch(&scripts::DEDUCT_BATCH, lines)
}

/// A batch script's call: the count of `lines`, then each line's keys and
/// arguments in order (moved, not copied).
fn counted_batch(script: &'static Script, lines: Vec<Call>) -> Call {
    let width = lines.first().map_or(4, |c| c.keys.len());
    let per_line = lines.first().map_or(0, |c| c.args.len());
    let mut keys = Vec::with_capacity(width * lines.len());
    let mut args = Vec::with_capacity(1 + per_line * lines.len());
    args.push(lines.len().to_string());
    for c in lines {
        keys.extend(c.keys);
        args.extend(c.args);
    }
    call(script, keys, args)
}

/// `release.lua`: undo what event `h` deducted on `line`, and mark the line.
pub fn release(keys: &Keys, ttl: &Ttls, h: &Header, line: &PlaceLine, customer: &Id) -> Call {
    let k = keys.deduct_line(&line.promotion_id, &h.order_id, customer, &h.event_id);
    call(
        &scripts::RELEASE,
        k.into_vec(),
        vec![
            h.event_id.to_string(),
            ttl.refund.clone(),
            customer.to_string(),
        ],
    )
}

/// `release_batch.lua`: the releases `lines` (each a [`release`] call) as
/// one call, on a single Redis or a Sentinel primary.
pub fn release_batch(lines: Vec<Call>) -> Call {
    counted_batch(&scripts::RELEASE_BATCH, lines)
}

/// `memo.lua`: the stored rejection of placement event `h` on promotion `p`.
pub fn memo(keys: &Keys, h: &Header, p: &Id) -> Call {
    call(&scripts::MEMO, vec![keys.rejected(p, &h.event_id)], vec![])
}

/// `rollback_batch.lua`: the refund lines `lines` (each a [`rollback`]
/// call, all with or all without the index) as one call, on a single Redis
/// or a Sentinel primary.
pub fn rollback_batch(lines: Vec<Call>) -> Call {
    counted_batch(&scripts::ROLLBACK_BATCH, lines)
}

/// `memo_batch.lua`: the memo reads `reads` (each a [`memo`] call) as one
/// call, on a single Redis or a Sentinel primary.
pub fn memo_batch(reads: Vec<Call>) -> Call {
    let keys = reads.into_iter().flat_map(|c| c.keys).collect();
    call(&scripts::MEMO_BATCH, keys, vec![])
}

/// `rollback.lua` for one refund line, acting on `customer`'s counter (the
/// event's, or the one the record names: see [`super::reply::RollbackReply`]);
/// with `ttl.index`, a tombstone it creates is added to the index of `day`.
pub fn rollback(
    keys: &Keys,
    ttl: &Ttls,
    h: &Header,
    line: &RefundLine,
    customer: &Id,
    day: u64,
) -> Call {
    let k = keys.rollback_line(&line.promotion_id, &h.order_id, customer, &h.event_id);
    let amount = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
    let key_list = k.into_vec();
    let args = vec![
        amount(line.budget),
        amount(line.stock),
        ttl.record.clone(),
        ttl.refund.clone(),
        h.event_id.to_string(),
        customer.to_string(),
    ];
    with_index(
        &scripts::ROLLBACK,
        keys,
        ttl,
        &line.promotion_id,
        h,
        day,
        key_list,
        args,
    )
}

/// How `promo_set.lua` treats an existing promotion (its ARGV[1]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetMode {
    /// Refuse when it exists.
    Create,
    /// Replace it only when its records hold nothing.
    ReplaceIdle,
    /// Replace it whatever it holds.
    Replace,
}

/// `promo_set.lua`: write promotion `p`'s hash from `fields`.
pub fn promo_set(keys: &Keys, p: &Id, mode: SetMode, fields: Vec<(&str, String)>) -> Call {
    let mode = match mode {
        SetMode::Create => "0",
        SetMode::ReplaceIdle => "1",
        SetMode::Replace => "2",
    };
    let mut args = Vec::with_capacity(1 + 2 * fields.len());
    args.push(mode.to_owned());
    for (k, v) in fields {
        args.push(k.to_owned());
        args.push(v);
    }
    call(
        &scripts::PROMO_SET,
        vec![keys.promotion(p), keys.generation(p)],
        args,
    )
}

/// `promo_status.lua`: pause or resume `p`.
pub fn promo_status(keys: &Keys, p: &Id, paused: bool) -> Call {
    let status = if paused { "paused" } else { "active" };
    call(
        &scripts::PROMO_STATUS,
        vec![keys.promotion(p)],
        vec![status.to_owned()],
    )
}

/// `promo_adjust.lua`: move budget and/or stock by a signed delta.
pub fn promo_adjust(keys: &Keys, p: &Id, budget: Option<i64>, stock: Option<i64>) -> Call {
    let delta = |d: Option<i64>| d.map(|d| d.to_string()).unwrap_or_default();
    call(
        &scripts::PROMO_ADJUST,
        vec![keys.promotion(p)],
        vec![delta(budget), delta(stock)],
    )
}

/// `promo_op_done.lua`: the operator's change `id` of bucketed promotion
/// `p` is finished; the initial amounts move by the signed deltas, once.
pub fn promo_op_done(keys: &Keys, p: &Id, id: &str, budget: i64, stock: i64) -> Call {
    call(
        &scripts::PROMO_OP_DONE,
        vec![keys.promotion(p)],
        vec![format!("op:{id}"), budget.to_string(), stock.to_string()],
    )
}

/// `promo_limit.lua`: set (`Some`) or remove (`None`) the per-customer limit.
pub fn promo_limit(keys: &Keys, p: &Id, per_customer: Option<u64>) -> Call {
    call(
        &scripts::PROMO_LIMIT,
        vec![keys.promotion(p)],
        vec![per_customer.map(|n| n.to_string()).unwrap_or_default()],
    )
}

/// `promo_delete.lua`: delete `p`, only when nothing is outstanding unless `force`.
pub fn promo_delete(keys: &Keys, p: &Id, force: bool) -> Call {
    let mode = if force { "force" } else { "check" };
    call(
        &scripts::PROMO_DELETE,
        vec![keys.promotion(p)],
        vec![mode.to_owned()],
    )
}

/// How `audit.lua` finds the keys of the promotion it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditMode<'a> {
    /// Redis Cluster: `CLUSTER GETKEYSINSLOT` of slot {P}, inside the script.
    Slot,
    /// A standalone server of at most `limit` keys: `SCAN` inside the script.
    Scan { limit: u64 },
    /// The keys the caller listed.
    Keys(&'a [String]),
    /// A standalone server: the records the promotion's day indexes name,
    /// `today` being the caller's [`today`].
    Index { today: u64 },
}

/// `audit.lua`: promotion `p`, its records and counters, read at one instant.
pub fn audit(keys: &Keys, p: &Id, mode: AuditMode<'_>) -> Call {
    let promotion = keys.promotion(p);
    let prefix = format!("{promotion}:");
    let mut args = match mode {
        AuditMode::Slot => vec!["slot".to_owned(), prefix, "0".to_owned()],
        AuditMode::Scan { limit } => vec!["scan".to_owned(), prefix, limit.to_string()],
        AuditMode::Keys(_) => vec!["keys".to_owned(), prefix, "0".to_owned()],
        AuditMode::Index { today } => vec!["index".to_owned(), prefix, today.to_string()],
    };
    if let AuditMode::Keys(listed) = mode {
        args.extend(listed.iter().cloned());
    }
    call(&scripts::AUDIT, vec![promotion], args)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// The `-- KEYS[i] name  pattern` and `-- ARGV[i] name` lines of a
    /// script's header: (name, pattern) per key, name per argument, in order.
    fn header(body: &str) -> (Vec<(String, String)>, Vec<String>) {
        let mut keys = Vec::new();
        let mut args = Vec::new();
        for line in body
            .lines()
            .take_while(|l| l.starts_with("--") || l.is_empty())
        {
            let words: Vec<&str> = line.trim_start_matches("--").split_whitespace().collect();
            match words.as_slice() {
                [k, name, pattern, ..] if k.starts_with("KEYS[") => {
                    assert_eq!(*k, format!("KEYS[{}]", keys.len() + 1), "{line}");
                    keys.push((name.to_string(), pattern.to_string()));
                }
                [a, name, ..] if a.starts_with("ARGV[") && !a.contains("..") => {
                    assert_eq!(*a, format!("ARGV[{}]", args.len() + 1), "{line}");
                    args.push(name.to_string());
                }
                _ => {}
            }
        }
        (keys, args)
    }

    /// The scripts with a builder tested here (TESTED), and [`own`]: a
    /// script's own file in lua/, with its header (what is sent to Redis
    /// has lib.lua in front and no comments: `scripts::cut_unused`).
    macro_rules! tested {
        ($($name:literal),*) => {
            const TESTED: &[&str] = &[$($name),*];

            fn own(script: &Script) -> &'static str {
                match script.name {
                    $($name => include_str!(concat!("../../lua/", $name, ".lua")),)*
                    other => panic!("no lua/ file for script {other}"),
                }
            }
        };
    }
    tested!(
        "deduct",
        "deduct_batch",
        "release",
        "release_batch",
        "memo",
        "memo_batch",
        "rollback",
        "rollback_batch",
        "promo_set",
        "promo_status",
        "promo_adjust",
        "promo_limit",
        "promo_delete",
        "audit",
        // (its builder, `ledger::buckets::op_args`, is tested there)
        "bucket",
        "promo_op_done"
    );

    fn id(s: &str) -> Id {
        Id::parse(s).expect("a valid id")
    }

    fn h() -> Header {
        Header {
            event_id: id("e1"),
            order_id: id("o1"),
            customer_id: id("c1"),
            occurred_at: -33,
        }
    }

    /// Checks `c` against its script's header: one key per KEYS line, each
    /// the header's pattern with P, O, C and E filled in, and each argument
    /// the value `values` gives for the header's name of it.
    fn check(c: &Call, customer: &str, values: &[(&str, &str)]) {
        let (keys, args) = header(own(c.script));
        assert!(
            !keys.is_empty(),
            "{}: no KEYS lines in the header",
            c.script.name
        );
        let expected: Vec<String> = keys
            .iter()
            .map(|(_, pattern)| {
                pattern
                    .replace("{P}", "{p1}")
                    .replace("{O}", "o1")
                    .replace("{C}", customer)
                    .replace("{E}", "e1")
                    .replace("{D}", "77")
            })
            .collect();
        assert_eq!(c.keys, expected, "{}: KEYS", c.script.name);
        let values: HashMap<&str, &str> = values.iter().copied().collect();
        let expected: Vec<String> = args
            .iter()
            .map(|name| match values.get(name.as_str()) {
                Some(v) => v.to_string(),
                None => panic!("{}: no value given for ARGV {name}", c.script.name),
            })
            .collect();
        assert_eq!(
            c.args[..expected.len()],
            expected[..],
            "{}: ARGV",
            c.script.name
        );
    }

    fn ttl() -> Ttls {
        Ttls::new(44, 55)
    }

    fn place_line() -> PlaceLine {
        PlaceLine {
            promotion_id: id("p1"),
            budget: 11,
            stock: 22,
        }
    }

    #[test]
    fn deduct_follows_its_header() {
        let values = [
            ("budget", "11"),
            ("stock", "22"),
            ("occurred_at", "-33"),
            ("event_id", "e1"),
            ("record_ttl_secs", "44"),
            ("refund_ttl_secs", "55"),
            ("customer_id", "c1"),
            ("order_id", "o1"),
            ("index_ttl_secs", "86444"),
        ];
        // A standalone server: every KEYS and ARGV line, the index of day 77.
        let c = deduct(
            &Keys::default(),
            &ttl().indexed(44),
            &h(),
            &place_line(),
            77,
        );
        assert_eq!(c.args.len(), 9);
        assert_eq!(c.keys[4], "promo:{p1}:index:77");
        check(&c, "c1", &values);
        // A Redis Cluster: the first four keys and seven arguments, no index.
        let c = deduct(&Keys::default(), &ttl(), &h(), &place_line(), 77);
        assert_eq!(c.keys.len(), 4);
        assert_eq!(c.args.len(), 7);
        let indexed = deduct(
            &Keys::default(),
            &ttl().indexed(44),
            &h(),
            &place_line(),
            77,
        );
        assert_eq!(c.keys[..], indexed.keys[..4]);
        assert_eq!(c.args[..], indexed.args[..7]);
    }

    #[test]
    fn release_follows_its_header() {
        let c = release(
            &Keys::default(),
            &ttl(),
            &h(),
            &place_line(),
            &h().customer_id,
        );
        assert_eq!(c.args.len(), 3);
        check(
            &c,
            "c1",
            &[
                ("event_id", "e1"),
                ("refund_ttl_secs", "55"),
                ("customer_id", "c1"),
            ],
        );
    }

    #[test]
    fn memo_follows_its_header() {
        let c = memo(&Keys::default(), &h(), &id("p1"));
        assert!(c.args.is_empty());
        check(&c, "c1", &[]);
    }

    #[test]
    fn release_batch_follows_its_header() {
        let (ttl, line) = (ttl(), place_line());
        let lines = [
            release(&Keys::default(), &ttl, &h(), &line, &id("c1")),
            release(&Keys::default(), &ttl, &h(), &line, &id("c2")),
        ];
        let batch = release_batch(lines.to_vec());
        assert_eq!(batch.script.name, "release_batch");
        assert_eq!(batch.keys.len(), 8);
        assert_eq!(batch.keys[..4], lines[0].keys[..]);
        assert_eq!(batch.keys[4..], lines[1].keys[..]);
        assert_eq!(batch.args, ["2", "e1", "55", "c1", "e1", "55", "c2"]);
        let header = own(&scripts::RELEASE_BATCH);
        assert!(header.contains("KEYS[4i+1 .. 4i+4]"), "{header}");
        assert!(header.contains("ARGV[3i+2 .. 3i+4]"), "{header}");
    }

    #[test]
    fn rollback_batch_follows_its_header() {
        let line = RefundLine {
            promotion_id: id("p1"),
            budget: Some(7),
            stock: None,
        };
        let header = own(&scripts::ROLLBACK_BATCH);
        for (ttl, keys, args) in [(ttl().indexed(44), 5, 8), (ttl(), 4, 6)] {
            let lines = [
                rollback(&Keys::default(), &ttl, &h(), &line, &id("c1"), 1),
                rollback(&Keys::default(), &ttl, &h(), &line, &id("c2"), 1),
            ];
            let batch = rollback_batch(lines.to_vec());
            assert_eq!(batch.script.name, "rollback_batch");
            assert_eq!(batch.keys.len(), 2 * keys);
            assert_eq!(batch.keys[keys..], lines[1].keys[..]);
            assert_eq!(batch.args.len(), 1 + 2 * args);
            assert_eq!(batch.args[0], "2");
            assert_eq!(batch.args[1..=args], lines[0].args[..]);
            assert_eq!(batch.args[1 + args..], lines[1].args[..]);
        }
        // The header names the layouts this builder follows.
        assert!(header.contains("KEYS[5i+1 .. 5i+5]"), "{header}");
        assert!(header.contains("ARGV[8i+2 .. 8i+9]"), "{header}");
        assert!(header.contains("KEYS[4i+1 .. 4i+4]"), "{header}");
        assert!(header.contains("ARGV[6i+2 .. 6i+7]"), "{header}");
    }

    #[test]
    fn memo_batch_is_the_reads_keys_in_order() {
        let reads = [
            memo(&Keys::default(), &h(), &id("p1")),
            memo(&Keys::default(), &h(), &id("p2")),
        ];
        let batch = memo_batch(reads.to_vec());
        assert_eq!(batch.script.name, "memo_batch");
        assert_eq!(
            batch.keys,
            [&reads[0].keys[..], &reads[1].keys[..]].concat()
        );
        assert!(batch.args.is_empty());
        // The header names the layout this builder follows.
        let header = own(&scripts::MEMO_BATCH);
        assert!(header.contains("KEYS[1 .. N]"), "{header}");
        assert!(header.contains("ARGV          none"), "{header}");
    }

    #[test]
    fn rollback_follows_its_header_and_acts_on_the_given_customer() {
        let line = RefundLine {
            promotion_id: id("p1"),
            budget: Some(7),
            stock: None,
        };
        let c = rollback(
            &Keys::default(),
            &ttl().indexed(44),
            &h(),
            &line,
            &id("c9"),
            77,
        );
        assert_eq!(c.args.len(), 8);
        check(
            &c,
            "c9",
            &[
                ("budget", "7"),
                ("stock", ""),
                ("record_ttl_secs", "44"),
                ("refund_ttl_secs", "55"),
                ("event_id", "e1"),
                ("customer_id", "c9"),
                ("order_id", "o1"),
                ("index_ttl_secs", "86444"),
            ],
        );
        let plain = rollback(&Keys::default(), &ttl(), &h(), &line, &id("c9"), 77);
        assert_eq!(plain.keys[..], c.keys[..4]);
        assert_eq!(plain.args[..], c.args[..6]);
    }

    #[test]
    fn promo_calls_follow_their_headers() {
        let k = Keys::default();
        let p = id("p1");
        let c = promo_set(
            &k,
            &p,
            SetMode::ReplaceIdle,
            vec![("budget", "5".to_owned()), ("stock", "6".to_owned())],
        );
        check(&c, "c1", &[("force", "1")]);
        assert_eq!(c.args[1..], ["budget", "5", "stock", "6"]);
        assert_eq!(promo_set(&k, &p, SetMode::Create, vec![]).args, ["0"]);
        assert_eq!(promo_set(&k, &p, SetMode::Replace, vec![]).args, ["2"]);

        check(&promo_status(&k, &p, true), "c1", &[("status", "paused")]);
        check(&promo_status(&k, &p, false), "c1", &[("status", "active")]);
        let c = promo_adjust(&k, &p, Some(-250), None);
        check(&c, "c1", &[("budget", "-250"), ("stock", "")]);
        check(
            &promo_limit(&k, &p, Some(3)),
            "c1",
            &[("per_customer", "3")],
        );
        check(&promo_limit(&k, &p, None), "c1", &[("per_customer", "")]);
        check(&promo_delete(&k, &p, false), "c1", &[("mode", "check")]);
        check(&promo_delete(&k, &p, true), "c1", &[("mode", "force")]);
    }

    #[test]
    fn audit_follows_its_header() {
        let k = Keys::default();
        let p = id("p1");
        let prefix = ("prefix", "promo:{p1}:");
        check(
            &audit(&k, &p, AuditMode::Slot),
            "c1",
            &[("mode", "slot"), prefix, ("limit", "0")],
        );
        check(
            &audit(&k, &p, AuditMode::Scan { limit: 9 }),
            "c1",
            &[("mode", "scan"), prefix, ("limit", "9")],
        );
        let listed = ["promo:{p1}:order:o1".to_owned()];
        let c = audit(&k, &p, AuditMode::Keys(&listed));
        check(&c, "c1", &[("mode", "keys"), prefix, ("limit", "0")]);
        assert_eq!(c.args[3..], listed);
        check(
            &audit(&k, &p, AuditMode::Index { today: 20_000 }),
            "c1",
            &[("mode", "index"), prefix, ("limit", "20000")],
        );
    }

    #[test]
    fn a_batch_is_its_lines_deduct_calls_in_order() {
        let (a, mut b) = (h(), h());
        b.event_id = id("e-2");
        b.customer_id = id("c-2");
        let lines = [
            deduct(&Keys::new("promo"), &ttl(), &a, &place_line(), 1),
            deduct(&Keys::new("promo"), &ttl(), &b, &place_line(), 1),
        ];
        let batch = deduct_batch(lines.to_vec());
        assert_eq!(batch.script.name, "deduct_batch");
        assert_eq!(batch.keys.len(), 8);
        assert_eq!(batch.keys[..4], lines[0].keys[..]);
        assert_eq!(batch.keys[4..], lines[1].keys[..]);
        assert_eq!(batch.args[0], "2");
        assert_eq!(batch.args[1..8], lines[0].args[..]);
        assert_eq!(batch.args[8..], lines[1].args[..]);
        // The header names the layout this builder follows.
        let header = own(&scripts::DEDUCT_BATCH);
        assert!(header.contains("KEYS[4i+1 .. 4i+4]"), "{header}");
        assert!(header.contains("ARGV[7i+2 .. 7i+8]"), "{header}");
        // With the index: five keys and nine arguments a line.
        let ttl = ttl().indexed(44);
        let lines = [
            deduct(&Keys::new("promo"), &ttl, &a, &place_line(), 1),
            deduct(&Keys::new("promo"), &ttl, &b, &place_line(), 1),
        ];
        let batch = deduct_batch(lines.to_vec());
        assert_eq!(batch.keys.len(), 10);
        assert_eq!(batch.keys[5..], lines[1].keys[..]);
        assert_eq!(batch.args.len(), 19);
        assert_eq!(batch.args[10..], lines[1].args[..]);
        assert!(header.contains("KEYS[5i+1 .. 5i+5]"), "{header}");
        assert!(header.contains("ARGV[9i+2 .. 9i+10]"), "{header}");
    }

    #[test]
    fn promo_op_done_names_the_field_and_signed_deltas() {
        let keys = Keys::new("promo");
        let p = Id::parse("hot").unwrap();
        let c = promo_op_done(&keys, &p, "adj-1", -5, 0);
        assert_eq!(c.script.name, "promo_op_done");
        assert_eq!(c.keys, vec!["promo:{hot}".to_owned()]);
        assert_eq!(c.args, vec!["op:adj-1", "-5", "0"]);
    }

    #[test]
    fn every_script_has_a_builder_tested_here() {
        // (lua/bucket.lua is one script per operation, all named "bucket".)
        let mut all: Vec<&str> = scripts::all().iter().map(|s| s.name).collect();
        all.dedup();
        assert_eq!(all.len(), TESTED.len(), "{all:?}");
        for name in all {
            assert!(TESTED.contains(&name), "{name} has no builder test");
        }
    }
}
