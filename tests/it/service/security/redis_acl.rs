//! A least-privilege Redis ACL user: the service works with the documented
//! rules, every rule is needed, an admin user has its own, and the Cluster
//! needs its few more.

use super::redis_tls::private_redis;
use super::*;
use crate::common::service::{self, Fixture};
use deductor::admin::PromoSpec;

/// The service's least-privilege ACL rules after `reset on >PW ~PREFIX:*`,
/// as docs/operations.md ("A least-privilege Redis user") gives them: the
/// script calls, `SCRIPT LOAD` for `deductor check`, `PING` for readiness,
/// and the commands the scripts themselves run (Redis checks those against
/// the calling user too).
pub(super) const SERVICE_ACL: &str = "resetchannels -@all +evalsha +eval +script|load +ping +info \
    +get +set +del +decr +hgetall +hset +hincrby +sadd +expire +pttl";

/// The operators' user for `promo set|show|pause|resume|adjust|limit|delete`,
/// as documented: the promo_* scripts, plain reads and the ledger marker
/// (`SET`), no `SCAN` (which a key pattern does not confine: it lists every
/// key name of the database).
pub(super) const OPERATOR_ACL: &str = "resetchannels -@all +evalsha +eval +script|load +ping \
    +info +exists +incr +hset +hdel +del +hgetall +hget +hmget +get +set +type";

/// The readers' user for `promo list|show`, `audit`, `order show` and
/// `event show`, as documented: `SCAN` and reads, nothing that writes;
/// `audit` reads each promotion with one read-only script, `audit.lua`
/// (`DBSIZE` + `SCAN` on a standalone server, `CLUSTER KEYSLOT`, `NODES`
/// (is the slot being migrated?), `COUNTKEYSINSLOT` and `GETKEYSINSLOT` on
/// a Cluster).
pub(super) const READER_ACL: &str = "resetchannels -@all +ping +info +scan +hgetall +hget \
    +hmget +get +exists +type +evalsha +eval +script|load +dbsize +cluster|keyslot \
    +cluster|nodes +cluster|countkeysinslot +cluster|getkeysinslot +smembers";

pub(super) fn acl_rules(password: &str, prefix: &str, rules: &str) -> Vec<String> {
    let mut v = vec![
        "reset".to_owned(),
        "on".to_owned(),
        format!(">{password}"),
        format!("~{prefix}:*"),
    ];
    v.extend(rules.split_whitespace().map(str::to_owned));
    v
}

/// A raw command as `user` sends it; the error text when Redis refuses it.
pub(super) async fn raw(ledger: &deductor::ledger::Ledger, args: &[&str]) -> Result<(), String> {
    use fred::prelude::ClientLike;
    use fred::types::{ClusterHash, CustomCommand};
    let cmd = CustomCommand::new(args[0].to_owned(), ClusterHash::FirstKey, false);
    let rest: Vec<fred::prelude::Value> = args[1..].iter().map(|a| (*a).into()).collect();
    ledger
        .pool()
        .next()
        .custom::<fred::prelude::Value, _>(cmd, rest)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A command refused by the ACL, and saying so.
fn assert_refused<E: std::fmt::Display>(result: Result<(), E>, what: &str) {
    match result {
        Ok(()) => panic!("{what} was allowed"),
        Err(e) => {
            let e = e.to_string();
            // NOPERM, or Redis 7.0's code-less refusal inside a script,
            // which the ledger classifies as one (auth).
            assert!(
                e.contains("NOPERM") || e.contains("(auth)"),
                "{what}: not read as a refusal: {e}"
            );
        }
    }
}

pub(super) fn assert_noperm(result: Result<(), String>, what: &str) {
    match result {
        Ok(()) => panic!("{what} was allowed"),
        Err(e) => assert!(e.contains("NOPERM"), "{what}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn least_privilege_redis_user() {
    use fred::prelude::AclInterface;
    let f = Fixture::new("sec-acl", 1).await;
    let admin = f.ledger().await;
    let tag = format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
    let users = [
        (format!("deductor-test-{tag}"), SERVICE_ACL),
        (format!("deductor-operator-test-{tag}"), OPERATOR_ACL),
        (format!("deductor-reader-test-{tag}"), READER_ACL),
    ];
    let password = wrong_password();
    for (user, rules) in &users {
        admin
            .pool()
            .acl_setuser(user.as_str(), acl_rules(&password, &f.prefix, rules))
            .await
            .unwrap_or_else(|e| panic!("ACL SETUSER {user}: {e}"));
    }
    let checks = tokio::spawn(acl_checks(
        f.clone(),
        users[0].0.clone(),
        users[1].0.clone(),
        users[2].0.clone(),
        password,
    ))
    .await;
    for (user, _) in &users {
        let _: Result<i64, _> = admin.pool().acl_deluser(user.as_str()).await;
    }
    admin.quit().await;
    if let Err(e) = checks {
        std::panic::resume_unwind(e.into_panic());
    }
    f.cleanup().await;
}

pub(super) async fn acl_checks(
    f: Fixture,
    user: String,
    admin_user: String,
    reader_user: String,
    password: String,
) {
    use deductor::admin;
    use deductor::ledger::Ledger;
    let as_user =
        |u: &str| f.settings(&[("redis.username", u), ("redis.password", password.as_str())]);

    // The whole service works as this user: events in, outcomes out.
    let settings = as_user(&user);
    round_trip(&f, settings.clone()).await;
    let ledger = Ledger::connect(&settings.redis)
        .await
        .expect("the service user connects");
    ledger.ping().await.expect("PING");
    ledger.load_scripts().await.expect("SCRIPT LOAD");

    // Anything else is refused: other keys, the keyspace, the server.
    let used = format!("{}:{{sec}}:used:c-1", f.prefix);
    assert_noperm(
        raw(&ledger, &["GET", "other:key"]).await,
        "GET of a key outside the prefix",
    );
    assert_noperm(
        raw(&ledger, &["SET", "other:key", "1"]).await,
        "SET outside the prefix",
    );
    assert_noperm(raw(&ledger, &["FLUSHALL"]).await, "FLUSHALL");
    assert_noperm(raw(&ledger, &["FLUSHDB"]).await, "FLUSHDB");
    assert_noperm(raw(&ledger, &["KEYS", "*"]).await, "KEYS");
    assert_noperm(raw(&ledger, &["SCAN", "0"]).await, "SCAN");
    assert_noperm(raw(&ledger, &["CONFIG", "GET", "*"]).await, "CONFIG GET");
    assert_noperm(raw(&ledger, &["ACL", "LIST"]).await, "ACL LIST");
    assert_noperm(
        raw(&ledger, &["HGETALL", "other:{sec}"]).await,
        "HGETALL outside the prefix",
    );
    assert_noperm(
        raw(&ledger, &["EVAL", "return 1", "1", "other:key"]).await,
        "a script on a key outside the prefix",
    );
    // The documented limit: Redis checks the commands a script runs against
    // the calling user, so the commands the scripts need (GET among them)
    // are allowed directly too, on the prefix's keys only.
    raw(&ledger, &["GET", &used])
        .await
        .expect("GET on a promotion key (needed by the scripts)");

    // Admin commands: `promo show` reads with HGETALL (allowed); `promo set`
    // (EXISTS in its script) and `audit` (SCAN) need the admin user.
    let p = deductor::domain::event::Id::parse("sec").unwrap();
    let shown = admin::promo_show(&ledger, &p).await.expect("promo show");
    assert!(shown.is_some());
    let spec = PromoSpec {
        budget: Some(1),
        ..PromoSpec::default()
    };
    let refused = admin::promo_set(&ledger, &p, spec.clone(), true).await;
    assert!(
        refused.is_err(),
        "promo set as the service user: {refused:?}"
    );
    // A refused SCAN reads as the refusal it is (fred alone reports
    // "Expected bulk string array from SCAN").
    let refused = deductor::admin::audit::run(&ledger, &[]).await;
    assert_refused(refused.map(drop), "audit as the service user");
    let refused = deductor::admin::promo::list(&ledger, None, None).await;
    assert_refused(refused.map(drop), "promo list as the service user");
    ledger.quit().await;

    let admin_ledger = Ledger::connect(&as_user(&admin_user).redis)
        .await
        .expect("the admin user connects");
    admin::promo_set(&admin_ledger, &p, spec, true)
        .await
        .expect("promo set as the admin user");
    assert!(admin::promo_show(&admin_ledger, &p)
        .await
        .unwrap()
        .is_some());
    deductor::admin::promo::set_paused(&admin_ledger, &p, true)
        .await
        .expect("promo pause as the operators' user");
    deductor::admin::promo::set_paused(&admin_ledger, &p, false)
        .await
        .expect("promo resume as the operators' user");
    // No SCAN: it would list every key name of the instance (`SCAN 0
    // MATCH billing:*`), whatever the key pattern.
    assert_noperm(
        raw(&admin_ledger, &["SCAN", "0", "MATCH", "other:*"]).await,
        "SCAN as the operators' user",
    );
    let refused = deductor::admin::promo::list(&admin_ledger, None, None).await;
    assert_refused(refused.map(drop), "promo list as the operators' user");
    assert_noperm(
        raw(&admin_ledger, &["FLUSHALL"]).await,
        "FLUSHALL as the operators' user",
    );
    admin_ledger.quit().await;

    // The readers' user: list and audit, nothing that writes.
    let reader = Ledger::connect(&as_user(&reader_user).redis)
        .await
        .expect("the readers' user connects");
    let listed = deductor::admin::promo::list(&reader, None, None)
        .await
        .expect("promo list as the readers' user");
    assert!(listed.iter().any(|l| l.promotion_id == p), "{listed:?}");
    deductor::admin::audit::run(&reader, &[])
        .await
        .expect("audit as the readers' user");
    assert!(admin::promo_show(&reader, &p).await.unwrap().is_some());
    let refused = deductor::admin::promo::set_paused(&reader, &p, true).await;
    assert_refused(refused.map(drop), "promo pause as the readers' user");
    assert_noperm(
        raw(&reader, &["DEL", &used]).await,
        "DEL as the readers' user",
    );
    // It runs audit.lua, a read-only script; a script that writes is
    // refused, as Redis checks each command a script runs.
    match raw(
        &reader,
        &["EVAL", "return redis.call('DEL', KEYS[1])", "1", &used],
    )
    .await
    {
        Ok(()) => panic!("a writing script as the readers' user was allowed"),
        // NOPERM, or Redis 7.0's and Valkey 8's code-less refusals inside a
        // script (ledger::error::error_code reads both as NOPERM).
        Err(e) => assert!(
            e.contains("NOPERM")
                || e.contains("can't run this command")
                || e.contains("ACL failure in script"),
            "a writing script as the readers' user: {e}"
        ),
    }
    reader.quit().await;

    // `deductor check` as the service user: passes, password not shown.
    let env = f.env(&[("redis.username", &user), ("redis.password", &password)]);
    let (ok, out) = check(&env);
    assert!(ok, "check as the service user:\n{out}");
    assert!(
        !out.contains(&password),
        "check shows the Redis password:\n{out}"
    );
}

/// The service's Redis work as `rules` allow it, on a private Redis: a
/// two-line placement rejected on its second line (memo, deduct, release), a
/// placement (per-customer count, record, TTL), its refund, `PING` and
/// `SCRIPT LOAD`, after a `SCRIPT FLUSH` so the `EVAL` fallback runs too.
/// Ok when every decision is the one full rights give.
/// Where [`service_ops`] runs.
pub(super) struct Target<'a> {
    /// Full rights: creates the promotions (and flushes the script cache).
    pub(super) admin: &'a deductor::ledger::Ledger,
    /// One full-rights connection per node: ACL users are per node.
    pub(super) nodes: &'a [deductor::ledger::Ledger],
    pub(super) url: &'a str,
    pub(super) prefix: &'a str,
    /// `SCRIPT FLUSH` first (a private server only).
    pub(super) flush: bool,
}

pub(super) async fn service_ops(
    t: &Target<'_>,
    round: usize,
    rules: &[&str],
) -> Result<(), String> {
    use fred::prelude::AclInterface;
    let (user, password) = (format!("svc-{}-{round}", t.prefix), wrong_password());
    for node in t.nodes {
        node.pool()
            .acl_setuser(
                user.as_str(),
                acl_rules(&password, t.prefix, &rules.join(" ")),
            )
            .await
            .map_err(|e| format!("ACL SETUSER: {e}"))?;
    }
    let result = service_ops_as(t, round, &user, &password).await;
    for node in t.nodes {
        let _: Result<i64, _> = node.pool().acl_deluser(user.as_str()).await;
    }
    result
}

pub(super) async fn service_ops_as(
    t: &Target<'_>,
    round: usize,
    user: &str,
    password: &str,
) -> Result<(), String> {
    use crate::common::redis::{placed, refunded};
    use deductor::domain::decision::{PlaceDecision, Reason};
    use deductor::ledger::Ledger;
    let p = format!("p{round}");
    let id = deductor::domain::event::Id::parse(&p).unwrap();
    let spec = PromoSpec {
        budget: Some(1_000),
        stock: Some(10),
        per_customer: Some(2),
        ..PromoSpec::default()
    };
    deductor::admin::promo_set(t.admin, &id, spec, false)
        .await
        .map_err(|e| e.to_string())?;
    if t.flush {
        raw(t.admin, &["SCRIPT", "FLUSH"]).await?;
    }

    let mut settings = crate::common::redis::settings(t.url, t.prefix);
    settings.username = user.to_owned();
    settings.password = password.to_owned();
    let ledger = Ledger::connect(&settings)
        .await
        .map_err(|e| e.to_string())?;
    let at = 1_800_000_000;
    // Ids of this round only: a stored memo of an earlier round would
    // answer instead of the scripts.
    let (e0, e1, e2, e3) = (
        format!("e-0-{round}"),
        format!("e-1-{round}"),
        format!("e-2-{round}"),
        format!("e-3-{round}"),
    );
    let missing = format!("missing{round}");
    let ops = async {
        let e = placed(&e0, "o-0", "c-1", at, &[(&p, 10, 1), (&missing, 1, 0)]);
        match ledger.place(&e).await.map_err(|e| e.to_string())? {
            PlaceDecision::Rejected {
                reason: Reason::PromotionNotFound,
                ..
            } => {}
            d => return Err(format!("two-line placement: {d:?}")),
        }
        let e = placed(&e1, "o-1", "c-1", at, &[(&p, 100, 1)]);
        match ledger.place(&e).await.map_err(|e| e.to_string())? {
            PlaceDecision::Accepted { .. } => {}
            d => return Err(format!("placement: {d:?}")),
        }
        // A second placement of the order, absorbed on p (the record notes
        // it) and rejected on the missing promotion (the note is removed).
        let e = placed(&e3, "o-1", "c-1", at, &[(&p, 100, 1), (&missing, 1, 0)]);
        match ledger.place(&e).await.map_err(|e| e.to_string())? {
            PlaceDecision::Rejected {
                reason: Reason::PromotionNotFound,
                ..
            } => {}
            d => return Err(format!("absorbed two-line placement: {d:?}")),
        }
        let r = refunded(&e2, "o-1", "c-1", &[(&p, None, None)]);
        let d = ledger.refund(&r).await.map_err(|e| e.to_string())?;
        if !d.applied() {
            return Err(format!("refund: {d:?}"));
        }
        // A batch with two lines of p, coalesced: p's counters are written
        // once, by HSET, at the end (lua/deduct_batch.lua), as the service's
        // batches do under load.
        // With the day index, as the service calls it, on a standalone server.
        let ttl = deductor::ledger::calls::Ttls::new(3600, 3600);
        let ttl = if ledger.is_clustered() {
            ttl
        } else {
            ttl.indexed(3600)
        };
        let lines: Vec<_> = [("e-4", "o-4", "c-4"), ("e-5", "o-5", "c-5")]
            .iter()
            .map(|(e, o, c)| {
                let e = placed(&format!("{e}-{round}"), o, c, at, &[(&p, 1, 1)]);
                deductor::ledger::calls::deduct(
                    ledger.keys(),
                    &ttl,
                    &e.header,
                    &e.lines[0],
                    deductor::ledger::calls::today(),
                )
            })
            .collect();
        let call = deductor::ledger::calls::deduct_batch(lines);
        use fred::prelude::LuaInterface;
        let reply: fred::prelude::Value = ledger
            .pool()
            .eval(
                deductor::ledger::scripts::DEDUCT_BATCH.body,
                call.keys,
                call.args,
            )
            .await
            .map_err(|e| format!("coalesced batch: {e}"))?;
        let text = format!("{reply:?}");
        if text.contains("ERR") || text.matches("accepted").count() != 2 {
            return Err(format!("coalesced batch: {text}"));
        }
        ledger.ping().await.map_err(|e| e.to_string())?;
        ledger.load_scripts().await.map_err(|e| e.to_string())
    };
    let result = ops.await;
    ledger.quit().await;
    result
}

/// The documented service ACL is enough, and each of its command rules is
/// needed by some service operation (`+info` only silences a warning, and
/// `+pttl` only saves a write: without it the day index's TTL is raised on
/// every new record, as before the rule; `the_day_index_ttl_is_raised_only_below_the_records`
/// tests both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn every_rule_of_the_service_acl_is_needed() {
    service::init_tracing();
    let server = private_redis(false).await;
    let url = format!("redis://127.0.0.1:{}", server.port);
    let admin = deductor::ledger::Ledger::connect(&crate::common::redis::settings(&url, "promo"))
        .await
        .expect("connecting to the private redis-server");
    let nodes = [admin.clone()];
    let t = Target {
        admin: &admin,
        nodes: &nodes,
        url: &url,
        prefix: "promo",
        flush: true,
    };
    let rules: Vec<&str> = SERVICE_ACL.split_whitespace().collect();
    service_ops(&t, 0, &rules)
        .await
        .unwrap_or_else(|e| panic!("the documented ACL is not enough: {e}"));
    for (i, rule) in rules.iter().enumerate() {
        if !rule.starts_with('+') || *rule == "+info" || *rule == "+pttl" {
            continue;
        }
        let without: Vec<&str> = rules
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, r)| *r)
            .collect();
        let r = service_ops(&t, i + 1, &without).await;
        assert!(
            r.is_err(),
            "the service works without {rule}: drop it from the documented ACL"
        );
        // A refused command inside a script is a misconfiguration, not
        // corrupt promotion data: it must never become a rejection.
        let e = r.unwrap_err();
        assert!(
            !e.contains("CorruptPromotion"),
            "without {rule} the ACL refusal was reported as corrupt data: {e}"
        );
    }
    admin.quit().await;
}

/// What the service user needs on top of [`SERVICE_ACL`] with Redis Cluster:
/// the slot map and the cluster state at connect; `ASKING` (for a client that
/// follows `ASK` redirects; deductor's does not, see docs/operations.md
/// "Resharding") is granted as the docs suggest, harmlessly.
pub(super) const CLUSTER_ACL: &str = "+cluster|slots +cluster|info +asking";

/// The service user on the dev-stack's Redis Cluster (created on every node:
/// ACL users are per node), with the cluster rules of docs/operations.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn service_acl_on_redis_cluster() {
    service::init_tracing();
    let cluster = crate::common::redis::cluster().await;
    let url = crate::common::redis::cluster_url();
    let mut nodes = Vec::new();
    for addr in cluster_nodes(&url) {
        let node = deductor::ledger::Ledger::connect(&crate::common::redis::settings(
            &format!("redis://{addr}"),
            &cluster.prefix,
        ))
        .await
        .unwrap_or_else(|e| panic!("cluster node {addr}: {e}"));
        nodes.push(node);
    }
    let t = Target {
        admin: &cluster.ledger,
        nodes: &nodes,
        url: &url,
        prefix: &cluster.prefix,
        flush: false,
    };
    let rules: Vec<&str> = SERVICE_ACL
        .split_whitespace()
        .chain(CLUSTER_ACL.split_whitespace())
        .collect();
    service_ops(&t, 0, &rules)
        .await
        .unwrap_or_else(|e| panic!("the documented cluster ACL is not enough: {e}"));
    for (i, rule) in ["+cluster|slots", "+cluster|info"].into_iter().enumerate() {
        let without: Vec<&str> = rules.iter().copied().filter(|r| *r != rule).collect();
        let r = service_ops(&t, i + 1, &without).await;
        assert!(r.is_err(), "the service works without {rule} on a cluster");
    }
    for node in &nodes {
        node.quit().await;
    }
}

/// `redis-cluster://a?node=b&node=c` -> `[a, b, c]`.
pub(super) fn cluster_nodes(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (first, query) = rest.split_once('?').unwrap_or((rest, ""));
    std::iter::once(first.trim_end_matches('/').to_owned())
        .chain(
            query
                .split('&')
                .filter_map(|kv| kv.strip_prefix("node="))
                .map(str::to_owned),
        )
        .collect()
}

/// What the service user needs on top of [`SERVICE_ACL`] for bucketed
/// promotions (docs/operations.md): the commands lua/bucket.lua runs on a
/// bucket's keys (its sets of pending ids, its sorted sets of gifts, the
/// reservation's reads; `SADD` is in the service's rules already) and `HDEL` for lua/promo_op_done.lua (the
/// sweeper finishing an operator's change).
pub(super) const BUCKET_ACL: &str = "+srem +scard +zadd +zrem +zrangebylex +exists +hget +hdel";

/// What the operators' user needs on top of [`OPERATOR_ACL`] and
/// [`BUCKET_ACL`] for `promo adjust` and `rebalance` of a bucketed
/// promotion: the walks' `SADD` and lua/promo_op_done.lua's `HINCRBY`.
pub(super) const OPERATOR_BUCKET_ACL: &str = "+sadd +hincrby";

/// A bucketed sale as a user with `rules`, on its own promotion `hot<round>`:
/// lines gathering from other buckets under a per-customer limit (their
/// reservations), a refund (mark, notify, revert, release), the sweeper,
/// an operator's change finished by it. The first error, as text.
async fn bucket_ops(
    admin: &deductor::ledger::Ledger,
    url: &str,
    round: usize,
    rules: &str,
) -> Result<(), String> {
    use crate::common::redis::{placed, refunded};
    use deductor::admin::bucketed;
    use deductor::domain::buckets::{BucketId, Units};
    use deductor::domain::decision::PlaceDecision;
    use deductor::domain::event::Id;
    use deductor::ledger::bucketed::BucketOp;
    use deductor::ledger::Ledger;
    use fred::prelude::AclInterface;
    let p = Id::parse(&format!("hot{round}")).unwrap();
    let spec = PromoSpec {
        budget: Some(30),
        stock: Some(3),
        per_customer: Some(1),
        ..PromoSpec::default()
    };
    bucketed::create(admin, &p, spec, 3).await.unwrap();
    let (user, password) = (format!("svc-b{round}"), wrong_password());
    admin
        .pool()
        .acl_setuser(user.as_str(), acl_rules(&password, "promo", rules))
        .await
        .unwrap();
    let mut settings = crate::common::redis::settings(url, "promo");
    settings.username = user.clone();
    settings.password = password;
    let ledger = Ledger::connect(&settings)
        .await
        .map_err(|e| e.to_string())?;
    let ops = async {
        // Four orders whose order's bucket is 0: the first takes bucket 0's
        // unit, the next two gather from buckets 1 and 2, the last is short.
        let orders: Vec<String> = (0..)
            .map(|i| format!("o{round}-{i}"))
            .filter(|o| Id::parse(o).unwrap().bucket(3) == 0)
            .take(4)
            .collect();
        let mut accepted = 0;
        for (i, o) in orders.iter().enumerate() {
            let e = placed(
                &format!("e{i}"),
                o,
                &format!("c{i}"),
                1_800_000_000,
                &[(p.as_str(), 10, 1)],
            );
            if matches!(
                ledger.place(&e).await.map_err(|e| e.to_string())?,
                PlaceDecision::Accepted { .. }
            ) {
                accepted += 1;
            }
        }
        if accepted != 3 {
            return Err(format!("{accepted} accepted"));
        }
        let r = refunded("r0", &orders[0], "c0", &[(p.as_str(), None, None)]);
        if !ledger
            .refund(&r)
            .await
            .map_err(|e| e.to_string())?
            .applied()
        {
            return Err("refund not applied".to_owned());
        }
        let layout = ledger
            .learn_layout(&p)
            .await
            .map_err(|e| e.to_string())?
            .unwrap();
        ledger.sweep(&layout).await.map_err(|e| e.to_string())?;
        let id = Id::parse("adj-acl").unwrap();
        admin
            .begin_bucket_op(&p, &id, BucketOp::Add(Units::new(0, 1)))
            .await
            .unwrap();
        ledger
            .finish_pending_bucket_ops(&p, &layout)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    };
    let result = tokio::time::timeout(std::time::Duration::from_secs(30), ops)
        .await
        .unwrap_or_else(|_| Err("timed out".to_owned()));
    ledger.quit().await;
    let _: Result<i64, _> = admin.pool().acl_deluser(user.as_str()).await;
    result
}

/// The bucket rules are enough for a bucketed sale, each of them is needed
/// by it, and without them a bucketed line fails with the ACL's refusal,
/// never as a decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn bucketed_promotions_need_the_bucket_rules() {
    service::init_tracing();
    let server = private_redis(false).await;
    let url = format!("redis://127.0.0.1:{}", server.port);
    let admin = deductor::ledger::Ledger::connect(&crate::common::redis::settings(&url, "promo"))
        .await
        .expect("connecting to the private redis-server");
    let all = format!("{SERVICE_ACL} {BUCKET_ACL}");
    bucket_ops(&admin, &url, 0, &all)
        .await
        .unwrap_or_else(|e| panic!("the documented bucket rules are not enough: {e}"));
    let e = bucket_ops(&admin, &url, 1, SERVICE_ACL)
        .await
        .expect_err("refused without the bucket rules");
    assert!(
        e.contains("NOPERM") || e.contains("Auth") || e.contains("auth"),
        "{e}"
    );
    assert!(
        !e.contains("Corrupt"),
        "an ACL refusal read as corrupt data: {e}"
    );
    for (i, rule) in BUCKET_ACL.split_whitespace().enumerate() {
        let without: Vec<&str> = BUCKET_ACL
            .split_whitespace()
            .filter(|r| r != &rule)
            .collect();
        let r = bucket_ops(
            &admin,
            &url,
            i + 2,
            &format!("{SERVICE_ACL} {}", without.join(" ")),
        )
        .await;
        assert!(
            r.is_err(),
            "a bucketed sale works without {rule}: drop it from the documented rules"
        );
        assert!(
            !r.unwrap_err().contains("Corrupt"),
            "without {rule}: read as corrupt data"
        );
    }
    // The operators' user, with the bucket rules and `+sadd +hincrby`
    // (docs/operations.md): every command of a bucketed promotion.
    {
        use deductor::admin::bucketed;
        use deductor::domain::event::Id;
        use fred::prelude::AclInterface;
        let (user, password) = ("op-buckets", wrong_password());
        let rules = format!("{OPERATOR_ACL} {BUCKET_ACL} {OPERATOR_BUCKET_ACL}");
        admin
            .pool()
            .acl_setuser(user, acl_rules(&password, "promo", &rules))
            .await
            .unwrap();
        let mut settings = crate::common::redis::settings(&url, "promo");
        settings.username = user.to_owned();
        settings.password = password;
        let op = deductor::ledger::Ledger::connect(&settings).await.unwrap();
        let p = Id::parse("hot-op").unwrap();
        let spec = PromoSpec {
            budget: Some(30),
            stock: Some(3),
            ..PromoSpec::default()
        };
        bucketed::create(&op, &p, spec, 3).await.unwrap();
        bucketed::set_paused(&op, &p, true).await.unwrap();
        bucketed::set_paused(&op, &p, false).await.unwrap();
        bucketed::limit(&op, &p, Some(2)).await.unwrap();
        let done = bucketed::adjust(&op, &p, Some(10), Some(1)).await.unwrap();
        assert_eq!(done, Some(deductor::domain::buckets::Units::new(10, 1)));
        bucketed::rebalance(&op, &p).await.unwrap();
        deductor::admin::promo_show(&op, &p).await.unwrap().unwrap();
        op.quit().await;
        let _: Result<i64, _> = admin.pool().acl_deluser(user).await;
    }
    admin.quit().await;
}
