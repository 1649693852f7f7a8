//! Redis helpers for integration tests: a [`Ledger`] on the real standalone
//! Redis or Cluster under a key prefix of its own (tests run in parallel and
//! never flush), seeding, raw script calls, and dumps of every key under the
//! prefix to compare before and after.
//!
//! A test that cannot reach Redis fails: it never skips.

use std::collections::{BTreeMap, HashMap};

use deductor::config::RedisSettings;
use deductor::domain::decision::{PlaceDecision, Reason, RefundDecision};
use deductor::domain::event::{Header, Id, OrderPlaced, OrderRefunded, PlaceLine, RefundLine};
use deductor::domain::keys::{Keys, LineKeys};
use deductor::domain::stored::{record_fields, RECORD_FIELDS};
use deductor::ledger::Ledger;
use fred::prelude::*;

pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const DEFAULT_CLUSTER_URL: &str =
    "redis-cluster://127.0.0.1:7001?node=127.0.0.1:7002&node=127.0.0.1:7003";

/// `DEDUCTOR_REDIS_URL`, or the loopback default.
pub fn redis_url() -> String {
    std::env::var("DEDUCTOR_REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.to_owned())
}

/// The database of the standalone Redis that the ledger tests
/// ([`standalone`]) own. Their dumps and clean-ups SCAN the database, and a
/// dev-stack Redis also serves the demo and earlier runs in database 0: with
/// ~500k such keys a dump took 0.5 s a call and `ledger::model` over 30
/// minutes. (The service tests keep database 0: the documented ACL rules do
/// not allow `SELECT`.)
pub const TEST_DB: u8 = 9;

/// [`redis_url`] with database [`TEST_DB`], unless the url names one.
pub fn test_db_url() -> String {
    with_db(&redis_url(), TEST_DB)
}

/// `url` with `/db` after the host, unless it has a path already.
fn with_db(url: &str, db: u8) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let after_scheme = base.split_once("://").map_or(base, |(_, r)| r);
    let host_part = after_scheme
        .rsplit_once('@')
        .map_or(after_scheme, |(_, h)| h);
    let mut out = if host_part.contains('/') && !host_part.ends_with('/') {
        base.to_owned()
    } else {
        format!("{}/{db}", base.trim_end_matches('/'))
    };
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[test]
fn a_test_database_is_added_only_where_none_is_named() {
    assert_eq!(
        with_db("redis://127.0.0.1:6379", 9),
        "redis://127.0.0.1:6379/9"
    );
    assert_eq!(
        with_db("redis://127.0.0.1:6379/", 9),
        "redis://127.0.0.1:6379/9"
    );
    assert_eq!(
        with_db("redis://127.0.0.1:6379/3", 9),
        "redis://127.0.0.1:6379/3"
    );
    assert_eq!(
        with_db("redis://u:p/w@h:1?x=1", 9),
        "redis://u:p/w@h:1/9?x=1"
    );
    assert_eq!(with_db("rediss://h:1", 2), "rediss://h:1/2");
}

/// `DEDUCTOR_REDIS_CLUSTER_URL`, or the loopback default.
pub fn cluster_url() -> String {
    std::env::var("DEDUCTOR_REDIS_CLUSTER_URL").unwrap_or_else(|_| DEFAULT_CLUSTER_URL.to_owned())
}

/// A key prefix no other test (or run) uses.
pub fn unique_prefix() -> String {
    format!("t{:016x}", rand::random::<u64>())
}

/// Settings for tests: the service defaults with `url` and `prefix` (see
/// [`deductor_testkit::settings::redis`]).
pub fn settings(url: &str, prefix: &str) -> RedisSettings {
    deductor_testkit::settings::redis(url, prefix)
}

pub fn id(s: &str) -> Id {
    Id::parse(s).unwrap_or_else(|e| panic!("bad test id {s:?}: {e}"))
}

/// An `OrderPlaced` with lines `(promotion, budget, stock)`.
pub fn placed(
    event: &str,
    order: &str,
    customer: &str,
    at: i64,
    lines: &[(&str, u64, u64)],
) -> OrderPlaced {
    OrderPlaced {
        header: header(event, order, customer, at),
        lines: lines
            .iter()
            .map(|&(p, budget, stock)| PlaceLine {
                promotion_id: id(p),
                budget,
                stock,
            })
            .collect(),
    }
}

/// An `OrderRefunded` with lines `(promotion, budget, stock)`; `None` = everything.
pub fn refunded(
    event: &str,
    order: &str,
    customer: &str,
    lines: &[(&str, Option<u64>, Option<u64>)],
) -> OrderRefunded {
    OrderRefunded {
        header: header(event, order, customer, 1_800_000_000),
        lines: lines
            .iter()
            .map(|&(p, budget, stock)| RefundLine {
                promotion_id: id(p),
                budget,
                stock,
            })
            .collect(),
    }
}

fn header(event: &str, order: &str, customer: &str, at: i64) -> Header {
    Header {
        event_id: id(event),
        order_id: id(order),
        customer_id: id(customer),
        occurred_at: at,
    }
}

/// A placement's rejection as (duplicate, reason, failing promotion);
/// panics on an acceptance.
pub fn rejected(d: &PlaceDecision) -> (bool, Reason, String) {
    match d {
        PlaceDecision::Rejected {
            duplicate,
            reason,
            promotion_id,
        } => (*duplicate, *reason, promotion_id.to_string()),
        other => panic!("expected rejected, got {other:?}"),
    }
}

/// Line `i` of a refund's decision as (status, duplicate, budget, stock).
pub fn line(d: &RefundDecision, i: usize) -> (Result<(), Reason>, bool, u64, u64) {
    let l = &d.lines[i];
    (l.status, l.duplicate, l.budget, l.stock)
}

/// One key as dumped: its type and value, and whether it has a TTL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dumped {
    pub value: DumpedValue,
    pub expires: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DumpedValue {
    String(String),
    Hash(BTreeMap<String, String>),
    /// A set's members: the day indexes `prefix:{P}:index:<D>`.
    Set(std::collections::BTreeSet<String>),
    Other(String),
}

/// The name [`TestRedis::dump`] gives the day indexes of promotion `p`:
/// `prefix:{P}:index:D`, their members together, so that a dump does not
/// depend on the day a test runs on (or a run across midnight).
pub fn index_key(keys: &Keys, p: &str) -> String {
    keys.index(&id(p), 0).replace(":index:0", ":index:D")
}

/// `prefix:{P}:index:D` for a day index `prefix:{P}:index:<day>`.
fn index_name(key: &str) -> Option<String> {
    let (head, day) = key.rsplit_once(":index:")?;
    (head.ends_with('}') && !day.is_empty() && day.bytes().all(|b| b.is_ascii_digit()))
        .then(|| format!("{head}:index:D"))
}

pub type Dump = BTreeMap<String, Dumped>;

/// A ledger on a real Redis under its own prefix.
pub struct TestRedis {
    pub ledger: Ledger,
    pub prefix: String,
    pub url: String,
    pub cluster: bool,
    /// The shared hold on the dev-stack servers (None: the test holds them
    /// exclusively).
    _stack: Option<super::StackGuard>,
}

/// A ledger on the standalone Redis; fails the test when unreachable.
pub async fn standalone() -> TestRedis {
    connect(&test_db_url(), false).await
}

/// A ledger on the Redis Cluster; fails the test when unreachable.
pub async fn cluster() -> TestRedis {
    connect(&cluster_url(), true).await
}

/// The same, for a test that holds the servers exclusively
/// ([`super::stack_exclusive`]) because what it does (`SCRIPT FLUSH`
/// on every node, then a look at each node's cache) would race with the
/// scripts the other tests load meanwhile.
pub async fn cluster_within(_exclusive: &super::Exclusive) -> TestRedis {
    connect_holding(&cluster_url(), true, None).await
}

async fn connect(url: &str, cluster: bool) -> TestRedis {
    let stack = super::stack_shared().await;
    connect_holding(url, cluster, Some(stack)).await
}

async fn connect_holding(url: &str, cluster: bool, stack: Option<super::StackGuard>) -> TestRedis {
    let prefix = unique_prefix();
    let ledger = Ledger::connect(&settings(url, &prefix))
        .await
        .unwrap_or_else(|e| {
            panic!("cannot reach Redis at {url} (start it with scripts/dev-stack): {e}")
        });
    TestRedis {
        ledger,
        prefix,
        url: url.to_owned(),
        cluster,
        _stack: stack,
    }
}

impl TestRedis {
    /// Another ledger (other settings) on the same keys as `self`.
    pub async fn with_ledger(&self, ledger: Ledger) -> TestRedis {
        TestRedis {
            ledger,
            prefix: self.prefix.clone(),
            url: self.url.clone(),
            cluster: self.cluster,
            _stack: self._stack.clone(),
        }
    }

    /// `ledger` (on `url`, a Redis of the test's own: e.g. a replicated
    /// set of tests/it/common/replication.rs), under its own key prefix.
    pub async fn of_ledger(ledger: Ledger, url: &str) -> TestRedis {
        TestRedis {
            prefix: ledger.keys().prefix().to_owned(),
            ledger,
            url: url.to_owned(),
            cluster: false,
            _stack: Some(super::stack_shared().await),
        }
    }

    /// A ledger of a [`super::service::Fixture`]'s keys, on the standalone Redis.
    pub async fn of_fixture(f: &super::service::Fixture) -> TestRedis {
        TestRedis {
            ledger: f.ledger().await,
            prefix: f.prefix.clone(),
            url: f.redis_url.clone(),
            cluster: false,
            _stack: Some(super::stack_shared().await),
        }
    }

    pub fn keys(&self) -> &Keys {
        self.ledger.keys()
    }

    pub fn pool(&self) -> &Pool {
        self.ledger.pool()
    }

    /// Replaces promotion `p`'s hash with `fields` (raw: anything may be stored).
    pub async fn seed(&self, p: &str, fields: &[(&str, &str)]) {
        let key = self.keys().promotion(&id(p));
        let _: () = self.pool().del(&key).await.unwrap();
        self.hset(&key, fields).await;
    }

    /// HSET; on an order record stored lean (docs/contract.md section 2),
    /// the same change made to its fields, written back lean with its TTL.
    pub async fn hset(&self, key: &str, fields: &[(&str, &str)]) {
        if fields.is_empty() {
            return;
        }
        if let Some(mut h) = self.lean_record(key).await {
            for (k, v) in fields {
                h.insert((*k).to_owned(), (*v).to_owned());
            }
            return self.rewrite_record(key, &h).await;
        }
        let map: HashMap<String, String> = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let _: () = self.pool().hset(key, map).await.unwrap();
    }

    /// HDEL; on an order record stored lean, the field left out of it.
    pub async fn hdel(&self, key: &str, field: &str) {
        if let Some(mut h) = self.lean_record(key).await {
            h.remove(field);
            return self.rewrite_record(key, &h).await;
        }
        let _: () = self.pool().hdel(key, field).await.unwrap();
    }

    /// Stores `h` as the lean record `key`, keeping its TTL.
    async fn rewrite_record(&self, key: &str, h: &BTreeMap<String, String>) {
        let _: () = self
            .pool()
            .set(
                key,
                encode_record(h),
                Some(Expiration::KEEPTTL),
                None,
                false,
            )
            .await
            .unwrap();
    }

    pub async fn set(&self, key: &str, value: &str) {
        let _: () = self
            .pool()
            .set(key, value, None, None, false)
            .await
            .unwrap();
    }

    pub async fn del(&self, key: &str) {
        let _: () = self.pool().del(key).await.unwrap();
    }

    pub async fn get(&self, key: &str) -> Option<String> {
        self.pool().get(key).await.unwrap()
    }

    pub async fn hgetall(&self, key: &str) -> BTreeMap<String, String> {
        let h: HashMap<String, String> = self.pool().hgetall(key).await.unwrap();
        h.into_iter().collect()
    }

    /// An order record's fields, in either layout (docs/contract.md section 2:
    /// the lean string decoded as lib.lua decodes it, or a hash of the previous
    /// layout); empty when absent. Panics on a string that is no record.
    pub async fn record(&self, key: &str) -> BTreeMap<String, String> {
        match self.lean_record(key).await {
            Some(h) => h,
            None => self.hgetall(key).await,
        }
    }

    /// The fields of order record `key` when it is stored lean (a string);
    /// `None` for any other key or type. Panics on a string that is no record.
    async fn lean_record(&self, key: &str) -> Option<BTreeMap<String, String>> {
        if !record_key(key) {
            return None;
        }
        let kind: String = self.pool().r#type(key).await.unwrap();
        if kind != "string" {
            return None;
        }
        let v = self.get(key).await.unwrap_or_default();
        let h = record_fields(&v).unwrap_or_else(|| panic!("{key} holds {v:?}, no record"));
        Some(h.into_iter().collect())
    }

    /// A field of promotion `p`'s hash.
    pub async fn promo_field(&self, p: &str, field: &str) -> Option<String> {
        let key = self.keys().promotion(&id(p));
        self.pool().hget(key, field).await.unwrap()
    }

    /// A delivery of placement event `e` (order `o`, customer `c`, at unix
    /// time `t`) that ran deduct.lua on its line of promotion `p` (`budget`,
    /// `stock`; TTLs of 1000 s) and then died: the line's keys.
    #[allow(clippy::too_many_arguments)]
    pub async fn zombie_deduct(
        &self,
        p: &str,
        o: &str,
        c: &str,
        e: &str,
        t: i64,
        budget: u64,
        stock: u64,
    ) -> LineKeys {
        let k = self.keys().deduct_line(&id(p), &id(o), &id(c), &id(e));
        let args = [
            budget.to_string(),
            stock.to_string(),
            t.to_string(),
            e.to_owned(),
            "1000".to_owned(),
            "1000".to_owned(),
            c.to_owned(),
        ]
        .to_vec();
        let (mut keys, mut args) = (k.as_vec(), args);
        // As the service calls it: with the day index on a standalone server.
        if !self.cluster {
            keys.push(self.keys().index(&id(p), deductor::ledger::calls::today()));
            args.extend([o.to_owned(), "87400".to_owned()]);
        }
        self.eval(deductor::ledger::scripts::DEDUCT.body, keys, args)
            .await
            .unwrap();
        k
    }

    /// Runs a script body with EVAL, bypassing the ledger.
    pub async fn eval(
        &self,
        body: &str,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value, Error> {
        self.pool().eval(body, keys, args).await
    }

    /// Every key under this test's prefix, read in one script per primary.
    pub async fn dump(&self) -> Dump {
        let mut out = Dump::new();
        for reply in per_primary(self.pool().next(), self.cluster, DUMP_LUA, &self.pattern()).await
        {
            let Value::Array(entries) = reply else {
                panic!("dump reply {reply:?}")
            };
            for entry in entries {
                let Value::Array(e) = entry else {
                    panic!("dump entry {entry:?}")
                };
                let [name, kind, ttl, value] = <[Value; 4]>::try_from(e).expect("4 items");
                let name = name.as_string().expect("key name");
                let strings = |v: Value| -> Vec<String> {
                    let Value::Array(items) = v else {
                        panic!("dump value {v:?}")
                    };
                    items
                        .into_iter()
                        .map(|i| i.as_string().expect("string"))
                        .collect()
                };
                let value = match kind.as_string().as_deref() {
                    // A lean order record reads as the hash it replaces, so
                    // that either layout compares as the fields the scripts read.
                    Some("string") => {
                        let v = strings(value).remove(0);
                        match record_key(&name).then(|| record_fields(&v)).flatten() {
                            Some(h) => DumpedValue::Hash(h.into_iter().collect()),
                            None => DumpedValue::String(v),
                        }
                    }
                    Some("hash") => {
                        let flat = strings(value);
                        DumpedValue::Hash(
                            flat.chunks(2)
                                .map(|c| (c[0].clone(), c[1].clone()))
                                .collect(),
                        )
                    }
                    Some("none") => continue,
                    Some("set") => DumpedValue::Set(strings(value).into_iter().collect()),
                    other => DumpedValue::Other(format!("{other:?}")),
                };
                // An empty field of a previous-layout record reads as absent
                // once the record is rewritten lean (only `event` of a reverted
                // record may be empty without being corrupt).
                let value = match value {
                    DumpedValue::Hash(mut h) if record_key(&name) => {
                        h.retain(|_, v| !v.is_empty());
                        DumpedValue::Hash(h)
                    }
                    v => v,
                };
                let expires = ttl.as_i64().expect("pttl") > 0;
                if let (Some(merged), DumpedValue::Set(members)) = (index_name(&name), &value) {
                    let entry = out.entry(merged).or_insert(Dumped {
                        value: DumpedValue::Set(Default::default()),
                        expires,
                    });
                    entry.expires &= expires;
                    if let DumpedValue::Set(all) = &mut entry.value {
                        all.extend(members.iter().cloned());
                    }
                    continue;
                }
                out.insert(name, Dumped { value, expires });
            }
        }
        out
    }

    fn pattern(&self) -> String {
        format!("{}:*", self.prefix)
    }
}

/// Deletes the test's keys when it passed (a failed test keeps them for a look).
impl Drop for TestRedis {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let (url, pattern, cluster) = (self.url.clone(), self.pattern(), self.cluster);
        // Drop cannot await: clean up on a thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let client = Builder::from_config(Config::from_url(&url).unwrap())
                    .build()
                    .unwrap();
                if client.init().await.is_ok() {
                    per_primary(&client, cluster, CLEANUP_LUA, &pattern).await;
                    let _ = client.quit().await;
                }
            })
        })
        .join();
    }
}

/// Whether `key` is an order record `prefix:{P}:order:{O}`.
fn record_key(key: &str) -> bool {
    key.split_once("}:order:").is_some()
}

/// lib.lua's `encode_record`: the lean value of a record's fields (the fields
/// the scripts know; docs/contract.md section 2).
pub fn encode_record(h: &BTreeMap<String, String>) -> String {
    let get = |f: &str| h.get(f).map(String::as_str).unwrap_or("");
    let mut t: Vec<&str> = RECORD_FIELDS.iter().map(|f| get(f)).collect();
    t[0] = match get("state") {
        "deducted" => "d",
        "reverted" => "r",
        other => other,
    };
    if get("budget0") == get("budget") {
        t[4] = "";
    }
    if get("stock0") == get("stock") {
        t[5] = "";
    }
    let extra: Vec<String> = h
        .iter()
        .filter(|(f, _)| f.starts_with("absorbed:") || f.starts_with("refund:"))
        .map(|(f, v)| format!("{f}={v}"))
        .collect();
    if extra.is_empty() {
        while t.len() > 1 && t.last() == Some(&"") {
            t.pop();
        }
    }
    let mut out = t.join("|");
    for e in extra {
        out.push('|');
        out.push_str(&e);
    }
    out
}

/// `{ {key, type, pttl, {values...}}, ... }` of every key matching ARGV[1] on this node.
const DUMP_LUA: &str = r#"
local out, cursor = {}, '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = r[1]
  for _, k in ipairs(r[2]) do
    local t = redis.call('TYPE', k).ok
    local v = {}
    if t == 'string' then v = { redis.call('GET', k) } elseif t == 'hash' then v = redis.call('HGETALL', k)
    elseif t == 'set' then v = redis.call('SMEMBERS', k) end
    table.insert(out, { k, t, redis.call('PTTL', k), v })
  end
until cursor == '0'
return out
"#;

/// Deletes every key matching ARGV[1] on this node.
const CLEANUP_LUA: &str = r#"
local cursor, n = '0', 0
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = r[1]
  for _, k in ipairs(r[2]) do n = n + redis.call('UNLINK', k) end
until cursor == '0'
return n
"#;

/// Runs a key-less script on the server, or on every primary of a Cluster.
async fn per_primary(client: &Client, cluster: bool, body: &str, pattern: &str) -> Vec<Value> {
    if !cluster {
        let reply = client
            .eval::<Value, _, _, _>(body, Vec::<String>::new(), vec![pattern.to_owned()])
            .await
            .expect("script on the server");
        return vec![reply];
    }
    let primaries = client
        .cached_cluster_state()
        .expect("cluster state")
        .unique_primary_nodes();
    let mut out = Vec::new();
    for server in primaries {
        // fred routes EVAL by its keys even with a cluster node set, so the
        // script goes out as a custom command, which honours the node.
        let reply = client
            .with_cluster_node(server)
            .custom::<Value, _>(fred::cmd!("EVAL"), vec![body, "0", pattern])
            .await
            .expect("script on a primary");
        out.push(reply);
    }
    out
}

/// Asserts that the keys that differ between `before` and `after` are
/// exactly `changed` (in [`diff`]'s order: sorted); when not, the message
/// names `what` and each unexpected key with its value before and after.
pub fn assert_changed_only(before: &Dump, after: &Dump, changed: &[String], what: &str) {
    let got = diff(before, after);
    if got == changed {
        return;
    }
    let mut msg = format!("{what}: keys changed {got:?}, expected {changed:?}");
    for k in got.iter().filter(|k| !changed.contains(k)) {
        msg.push_str(&format!(
            "\n  {k}:\n    before {:?}\n    after  {:?}",
            before.get(k),
            after.get(k)
        ));
    }
    for k in changed.iter().filter(|k| !got.contains(k)) {
        msg.push_str(&format!(
            "\n  {k}: expected to change, still {:?}",
            after.get(k)
        ));
    }
    panic!("{msg}");
}

/// Asserts that `after` holds the same keys and values as `before`.
pub fn assert_same(before: &Dump, after: &Dump, what: &str) {
    assert_changed_only(before, after, &[], what);
}

impl TestRedis {
    /// Asserts that every key under the test's prefix is as in `before` (a
    /// [`TestRedis::dump`] taken before the operation): nothing was written.
    pub async fn assert_unchanged(&self, before: &Dump, what: &str) {
        assert_same(before, &self.dump().await, what);
    }

    /// Asserts that, since `before`, exactly the keys `changed` were
    /// written (added, removed or changed) and no other.
    pub async fn assert_changed(&self, before: &Dump, changed: &[String], what: &str) {
        assert_changed_only(before, &self.dump().await, changed, what);
    }
}

/// Keys whose dump differs between `a` and `b` (added, removed or changed).
pub fn diff(a: &Dump, b: &Dump) -> Vec<String> {
    let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

/// Issue 24 item 16's class check: on a standalone server, `audit P`'s read
/// through P's day indexes finds what the read of the whole keyspace finds
/// (every record a script created is named by an index): the same records,
/// the same amounts held, the same corrupt data and the same verdict. An
/// error names the first figure that differs. Promotions without `indexed`
/// (created by an earlier release, or on a Cluster) are not compared.
pub async fn index_reads_as_the_keyspace(ledger: &Ledger, p: &Id) -> Result<(), String> {
    use deductor::admin::audit::report;
    use deductor::ledger::calls::{today, AuditMode};
    use deductor::ledger::reply::AuditReply;
    let index = ledger
        .audit_read(p, AuditMode::Index { today: today() })
        .await
        .map_err(|e| format!("audit by index: {e}"))?;
    let AuditReply::Read(by_index) = index else {
        return Ok(());
    };
    let AuditReply::Read(by_scan) = ledger
        .audit_read(p, AuditMode::Scan { limit: u64::MAX })
        .await
        .map_err(|e| format!("audit by scan: {e}"))?
    else {
        return Err("audit by scan: not read".into());
    };
    let (a, b) = (
        report(ledger.keys(), p, &by_index),
        report(ledger.keys(), p, &by_scan),
    );
    let figures = |r: &deductor::admin::audit::Report| {
        let mut corrupt = r.corrupt.clone();
        corrupt.sort();
        let mut breaches = r.breaches.clone();
        breaches.sort();
        (
            r.records,
            r.held,
            r.outstanding_budget,
            r.outstanding_stock,
            r.held_other_incarnation,
            corrupt,
            breaches,
        )
    };
    if figures(&a) != figures(&b) {
        let names = |s: &deductor::ledger::reply::Snapshot| {
            s.records
                .iter()
                .filter(|(_, v)| !matches!(v, deductor::ledger::reply::Stored::Absent))
                .map(|(k, _)| k.clone())
                .collect::<std::collections::BTreeSet<_>>()
        };
        let missing: Vec<_> = names(&by_scan)
            .difference(&names(&by_index))
            .cloned()
            .collect();
        return Err(format!(
            "promotion {p}: the index read differs from the keyspace's (records no index names: \
             {missing:?}):\n  by index {:?}\n  by scan  {:?}",
            figures(&a),
            figures(&b)
        ));
    }
    Ok(())
}
