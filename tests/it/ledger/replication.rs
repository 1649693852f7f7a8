//! Replicated Redis against real servers: Sentinel urls (with credentials
//! for the sentinels and the data nodes), a failover followed without a
//! restart, and the durability gate (`redis.wait_replicas`): an event is
//! not done while its writes lack a replica, and with the gate on a
//! `kill -9` of a lagging primary loses no acknowledged deduction, while
//! without it the same fault loses some (measured and printed).
//!
//! Each test runs its own primary, replica and sentinels on free ports
//! (tests/it/common/replication.rs); the shared dev stack is never touched.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::redis::*;
use crate::common::replication::*;
use deductor::admin::{self, PromoSpec};
use deductor::config::RedisSettings;
use deductor::domain::decision::PlaceDecision;
use deductor::error::Disposition;
use deductor::ledger::{ErrorClass, Ledger, LedgerError};
use fred::prelude::*;

const T: i64 = 1_800_000_000;

fn gate_settings(url: &str, prefix: &str, wait_replicas: u32) -> RedisSettings {
    let mut s = settings(url, prefix);
    s.wait_replicas = wait_replicas;
    s.wait_timeout_ms = 200;
    s.command_timeout_ms = 1_000;
    s.connect_timeout_ms = 1_000;
    s.pool_size = 4;
    s
}

/// Retries `op` while the durability gate reports a shortfall, up to five
/// times in all, as the pipeline retries it: on a loaded machine a healthy
/// replica can miss these tests' 200 ms WAIT. Any other error, and the
/// fifth shortfall, are returned as they are.
async fn until_durable<T, F, Fut>(mut op: F) -> Result<T, LedgerError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LedgerError>>,
{
    let mut attempts = 1;
    loop {
        match op().await {
            Err(e) if e.class() == ErrorClass::Replicas && attempts < 5 => attempts += 1,
            other => return other,
        }
    }
}

fn spec(n: u64) -> PromoSpec {
    PromoSpec {
        budget: Some(n),
        stock: Some(n),
        ..PromoSpec::default()
    }
}

async fn stock(ledger: &Ledger, p: &str) -> i64 {
    let v: Option<i64> = ledger
        .pool()
        .hget(ledger.keys().promotion(&id(p)), "stock")
        .await
        .unwrap();
    v.expect("the promotion has a stock")
}

async fn record_exists(ledger: &Ledger, p: &str, order: &str) -> bool {
    let n: i64 = ledger
        .pool()
        .exists(ledger.keys().record(&id(p), &id(order)))
        .await
        .unwrap();
    n == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_url_with_credentials_connects_and_deducts() {
    crate::common::service::init_tracing();
    let r = Replicated::start(true, Some("data-secret"), Some("sentinel-secret")).await;
    let prefix = unique_prefix();
    let mut s = gate_settings(&r.sentinel_url(), &prefix, 1);
    s.password = "data-secret".into();
    s.sentinel_password = "sentinel-secret".into();
    let ledger = Ledger::connect(&s)
        .await
        .expect("connects through the sentinels");
    admin::promo_set(&ledger, &id("p"), spec(100), false)
        .await
        .unwrap();
    let d = ledger
        .place(&placed("e1", "o1", "c1", T, &[("p", 3, 1)]))
        .await
        .unwrap();
    assert!(
        matches!(
            d,
            PlaceDecision::Accepted {
                duplicate: false,
                ..
            }
        ),
        "{d:?}"
    );
    // It went to the primary the sentinels name, and the gate saw the replica.
    assert_eq!(stock(&ledger, "p").await, 99);
    assert_eq!(
        r.node_cli(
            r.replica.port,
            &["HGET", &ledger.keys().promotion(&id("p")), "stock"]
        ),
        "99"
    );
    ledger.quit().await;

    // The two credentials are separate: without the sentinels' own the
    // connect fails as an auth error (fatal: a restart will not fix it),
    // the data nodes' alone are not enough.
    s.sentinel_password.clear();
    let e = Ledger::connect(&s)
        .await
        .expect_err("the sentinels require a password");
    assert_eq!(e.class(), ErrorClass::Auth, "{e}");
    assert_eq!(e.disposition(), Disposition::Fatal, "{e}");
}

/// The service user of docs/operations.md (as in tests/it/service/security/redis_acl.rs).
const SERVICE_ACL: &str = "resetchannels -@all +evalsha +eval +script|load +ping +info \
    +get +set +del +decr +hgetall +hset +hincrby +sadd +expire +pttl";
/// What the gate and Sentinel add on the data nodes, and the sentinels' user.
const GATE_ACL: &str = "+wait +client|id";
const SENTINEL_DATA_ACL: &str = "+role";
const SENTINELS_ACL: &str = "+sentinel|get-master-addr-by-name +sentinel|sentinels";

fn set_user(port: u16, user: &str, rules: &[&str]) {
    let mut args = vec![
        "ACL", "SETUSER", user, "reset", "on", ">pw", "~promo:*", "~t*",
    ];
    args.extend(rules.iter().flat_map(|r| r.split_whitespace()));
    assert_eq!(cli(port, &args), "OK", "ACL SETUSER on {port}");
}

/// The documented rules are enough for the service through Sentinel with
/// the gate on, and `+wait` and `+role` are each needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_rules_cover_sentinel_and_the_gate() {
    crate::common::service::init_tracing();
    let r = Replicated::start(true, None, None).await;
    let prefix = unique_prefix();
    let admin = Ledger::connect(&gate_settings(&r.sentinel_url(), &prefix, 0))
        .await
        .unwrap();
    admin::promo_set(&admin, &id("p"), spec(100), false)
        .await
        .unwrap();
    let users = [
        ("full", vec![SERVICE_ACL, GATE_ACL, SENTINEL_DATA_ACL]),
        ("nowait", vec![SERVICE_ACL, "+client|id", SENTINEL_DATA_ACL]),
        ("norole", vec![SERVICE_ACL, GATE_ACL]),
    ];
    for node in [r.primary.port, r.replica.port] {
        for (user, rules) in &users {
            set_user(node, user, rules);
        }
    }
    for s in &r.sentinels {
        set_user(s.port, "watcher", &[SENTINELS_ACL]);
    }
    let settings_for = |user: &str| {
        let mut s = gate_settings(&r.sentinel_url(), &prefix, 1);
        s.username = user.into();
        s.password = "pw".into();
        s.sentinel_username = "watcher".into();
        s.sentinel_password = "pw".into();
        s
    };
    let ledger = Ledger::connect(&settings_for("full"))
        .await
        .expect("documented rules");
    ledger
        .place(&placed("e1", "o1", "c1", T, &[("p", 1, 1)]))
        .await
        .expect("a gated placement as the documented user");
    ledger.quit().await;

    let ledger = Ledger::connect(&settings_for("nowait")).await.unwrap();
    let err = ledger
        .place(&placed("e2", "o2", "c2", T, &[("p", 1, 1)]))
        .await
        .expect_err("WAIT is refused");
    assert_eq!(err.class(), ErrorClass::Auth, "{err}");
    ledger.quit().await;

    let err = Ledger::connect(&settings_for("norole"))
        .await
        .expect_err("ROLE is refused");
    assert_eq!(err.class(), ErrorClass::Auth, "{err}");
    admin.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_holds_an_event_while_its_replica_lags() {
    crate::common::service::init_tracing();
    let r = Replicated::start(false, None, None).await;
    let prefix = unique_prefix();
    let gated = Ledger::connect(&gate_settings(&r.primary_url(), &prefix, 1))
        .await
        .unwrap();
    let ungated = Ledger::connect(&gate_settings(&r.primary_url(), &prefix, 0))
        .await
        .unwrap();
    admin::promo_set(&ungated, &id("p"), spec(100), false)
        .await
        .unwrap();
    let e1 = placed("e1", "o1", "c1", T, &[("p", 1, 1)]);
    until_durable(|| gated.place(&e1))
        .await
        .expect("the replica keeps up");

    r.proxy.set(Link::Stalled);
    let e2 = placed("e2", "o2", "c2", T, &[("p", 1, 1)]);
    for _ in 0..3 {
        let err = gated
            .place(&e2)
            .await
            .expect_err("not done while the replica lags");
        assert_eq!(err.class(), ErrorClass::Replicas, "{err}");
        assert_eq!(err.disposition(), Disposition::Retry, "{err}");
    }
    // The primary took the write; only the acknowledgement is held back.
    assert!(record_exists(&ungated, "p", "o2").await);
    // Without the gate the same lag goes unnoticed: acknowledged at once.
    let e3 = placed("e3", "o3", "c3", T, &[("p", 1, 1)]);
    ungated.place(&e3).await.expect("no gate, no wait");

    r.proxy.set(Link::Flowing);
    let d = until_durable(|| gated.place(&e2))
        .await
        .expect("done once the replica caught up");
    assert!(
        matches!(
            d,
            PlaceDecision::Accepted {
                duplicate: true,
                ..
            }
        ),
        "{d:?}"
    );
    // Deducted once, however many attempts.
    assert_eq!(stock(&ungated, "p").await, 97);
    // A refund goes through the same gate.
    r.proxy.set(Link::Stalled);
    let refund = refunded("e4", "o1", "c1", &[("p", None, None)]);
    let err = gated.refund(&refund).await.expect_err("refund held too");
    assert_eq!(err.class(), ErrorClass::Replicas, "{err}");
    r.proxy.set(Link::Flowing);
    until_durable(|| gated.refund(&refund))
        .await
        .expect("refund done after the lag");
    assert_eq!(stock(&ungated, "p").await, 98);
    gated.quit().await;
    ungated.quit().await;
}

/// On a Cluster the writes of a line go to its promotion's primary, so the
/// gate's WAIT must go there too: with one primary's replica stopped, an
/// order on another primary is done, and an order touching the stopped
/// replica's primary is held (a WAIT sent to any other node would pass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_gate_waits_on_the_nodes_that_took_the_writes() {
    crate::common::service::init_tracing();
    let c = ReplicatedCluster::start().await;
    let prefix = unique_prefix();
    let ledger = Ledger::connect(&gate_settings(&c.url(), &prefix, 1))
        .await
        .unwrap();
    // Two promotions on different primaries.
    let client = ledger.pool().next();
    let primary_of = |p: &str| -> u16 {
        let slot = fred::util::redis_keyslot(ledger.keys().promotion(&id(p)).as_bytes());
        client
            .cached_cluster_state()
            .and_then(|s| s.get_server(slot).map(|s| s.port))
            .expect("slot has a primary")
    };
    let a = "promo-a".to_owned();
    let b = (0..1000)
        .map(|n| format!("promo-{n}"))
        .find(|p| primary_of(p) != primary_of(&a))
        .expect("a promotion on another primary");
    for p in [&a, &b] {
        admin::promo_set(&ledger, &id(p), spec(100), false)
            .await
            .unwrap();
    }
    let e1 = placed("e1", "o1", "c1", T, &[(&a, 1, 1), (&b, 1, 1)]);
    until_durable(|| ledger.place(&e1))
        .await
        .expect("every replica keeps up");

    let stalled = c.replica_of(primary_of(&b));
    stalled.signal(libc::SIGSTOP);
    let only_a = placed("e2", "o2", "c2", T, &[(&a, 1, 1)]);
    let on_b = placed("e3", "o3", "c3", T, &[(&b, 1, 1)]);
    let both = placed("e4", "o4", "c4", T, &[(&a, 1, 1), (&b, 1, 1)]);
    let held = async {
        until_durable(|| ledger.place(&only_a))
            .await
            .expect("a's replica is fine");
        for _ in 0..3 {
            for e in [&on_b, &both] {
                let err = ledger.place(e).await.expect_err("b's replica is stopped");
                assert_eq!(err.class(), ErrorClass::Replicas, "{err}");
            }
        }
    };
    let result = tokio::time::timeout(Duration::from_secs(20), held).await;
    stalled.signal(libc::SIGCONT);
    result.expect("the checks ran while the replica was stopped");
    for e in [&on_b, &both] {
        let mut tries = 0;
        while let Err(err) = ledger.place(e).await {
            tries += 1;
            assert!(tries < 100, "never done after the replica resumed: {err}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(stock(&ledger, &a).await, 97);
    assert_eq!(stock(&ledger, &b).await, 97);
    ledger.quit().await;
}

/// The service with the gate, end to end: while the replica's link is
/// stalled an event's outcome is not published and its offset not
/// committed (the ledger keeps retrying it); once the link flows it is
/// done, with one outcome and one deduction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_commits_nothing_the_replicas_lack() {
    use crate::common::kafka;
    use crate::common::service::{self, Fixture};
    let r = Replicated::start(false, None, None).await;
    let mut f = Fixture::new("gate", 1).await;
    f.redis_url = r.primary_url();
    let ledger = f.ledger().await;
    f.promo(&ledger, "p", spec(100)).await;
    let settings = f.settings(&[
        ("redis.wait_replicas", "1"),
        ("redis.wait_timeout_ms", "200"),
        ("retry.max_interval_ms", "200"),
    ]);
    let svc = service::start(settings);
    r.proxy.set(Link::Stalled);
    let event = serde_json::json!({"type": "OrderPlaced", "event_id": "e1", "order_id": "o1",
        "customer_id": "c1", "occurred_at": "2026-11-30T08:00:00Z",
        "lines": [{"promotion_id": "p", "budget": 5, "stock": 1}]});
    kafka::produce_events(&f.topics.input, &[event]).await;
    // The scripts ran (the primary has the record) but the event stays open.
    eventually(60, "the primary took the deduction", || {
        r.node_cli(
            r.proxy.port,
            &["EXISTS", &ledger.keys().record(&id("p"), &id("o1"))],
        ) == "1"
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!svc.is_finished(), "the service stopped by itself");
    assert_eq!(svc.status.events_done.load(Ordering::Relaxed), 0);
    let committed = kafka::committed(&f.topics.group, &f.topics.input, 1).await;
    assert!(
        committed.values().all(|c| c.unwrap_or(0) == 0),
        "committed while the replica lacked the write: {committed:?}"
    );

    r.proxy.set(Link::Flowing);
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 1, Duration::from_secs(60))
        .await;
    assert_eq!(svc.status.events_done.load(Ordering::Relaxed), 1);
    let outcomes = kafka::read_all(&f.topics.outcome).await;
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert_eq!(stock(&ledger, "p").await, 99);
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");
    ledger.quit().await;
    f.cleanup().await;
}

/// With the gate on, a placement whose first line rejects afresh releases
/// its later lines too. An earlier attempt deducted both lines and was not
/// done (its WAIT fell short); then a failover lost the first line's
/// writes (simulated here on the primary: the record gone, the amounts
/// back, and the budget short meanwhile), while the later line's, on
/// another node of a Cluster, survived. The retry rejects the first line
/// afresh: it must release the later line, or the rejected event holds it
/// (found by `scripts/chaos --failover` on a Cluster; before the fix the
/// second line stayed deducted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_gate_a_fresh_rejection_releases_the_later_lines_an_earlier_attempt_deducted() {
    crate::common::service::init_tracing();
    let r = Replicated::start(false, None, None).await;
    let prefix = unique_prefix();
    let gated = Ledger::connect(&gate_settings(&r.primary_url(), &prefix, 1))
        .await
        .unwrap();
    for p in ["a", "b"] {
        admin::promo_set(&gated, &id(p), spec(10), false)
            .await
            .unwrap();
    }
    let e = placed("e1", "o1", "c1", T, &[("a", 5, 1), ("b", 1, 1)]);
    let d = until_durable(|| gated.place(&e)).await.unwrap();
    assert!(matches!(d, PlaceDecision::Accepted { .. }), "{d:?}");
    assert_eq!(stock(&gated, "b").await, 9);

    // The failover lost line a's writes; its budget is short now.
    let pool = gated.pool();
    let _: i64 = pool
        .del(gated.keys().record(&id("a"), &id("o1")))
        .await
        .unwrap();
    let _: i64 = pool
        .hset(
            gated.keys().promotion(&id("a")),
            [("budget", "3"), ("stock", "10")],
        )
        .await
        .unwrap();

    let d = until_durable(|| gated.place(&e)).await.unwrap();
    match &d {
        PlaceDecision::Rejected {
            duplicate: false,
            promotion_id,
            ..
        } => assert_eq!(promotion_id.as_str(), "a", "{d:?}"),
        other => panic!("expected a fresh rejection on a: {other:?}"),
    }
    assert_eq!(
        stock(&gated, "b").await,
        10,
        "the rejected event still holds its later line"
    );
    gated.quit().await;
}

/// Issue 23, defect 6 with the durability gate on: a corrupt record met by
/// a redelivery of a three-line order releases the lines before *and*
/// after it (tests/it/ledger/edges.rs runs it without the gate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_gate_a_corrupt_record_met_on_redelivery_releases_the_later_lines_too() {
    crate::common::service::init_tracing();
    let set = Replicated::start(false, None, None).await;
    let prefix = unique_prefix();
    let gated = Ledger::connect(&gate_settings(&set.primary_url(), &prefix, 1))
        .await
        .unwrap();
    let r = TestRedis::of_ledger(gated, &set.primary_url()).await;
    crate::ledger::edges::corrupt_record_met_on_redelivery_releases_every_other_line(
        &r,
        async |e| until_durable(|| r.ledger.place(e)).await.unwrap(),
    )
    .await;
    r.ledger.quit().await;
}

/// What one failover run measured (printed by the tests: the fields are
/// read through Debug).
#[derive(Debug)]
#[allow(dead_code)]
struct Figures {
    acknowledged: usize,
    acknowledged_after_failover: usize,
    lost: usize,
    fatal_errors: Vec<String>,
    failover_secs: f64,
    /// `EVAL` calls on the new primary: NOSCRIPT fallbacks (EVALSHA found
    /// no script: scripts replicate as effects, so a replica has none).
    noscript_fallbacks: u64,
}

/// Streams placements (8 workers, about 400/s) through a Sentinel url; the
/// replica's link stalls for 2 s, then the primary is killed with `kill -9`
/// and the stalled bytes are dropped; Sentinel promotes the replica; the old
/// primary comes back as its replica. Then every acknowledged deduction is
/// looked up on the new primary, and stock must equal the records left.
/// The failover runs drive hundreds of placements a second and a failover
/// each; run them one at a time so neither starves the other's replica.
static FAILOVER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn failover_run(wait_replicas: u32) -> Figures {
    let _one_at_a_time = FAILOVER.lock().await;
    crate::common::service::init_tracing();
    let mut r = Replicated::start(true, None, None).await;
    let prefix = unique_prefix();
    let ledger = Ledger::connect(&gate_settings(&r.sentinel_url(), &prefix, wait_replicas))
        .await
        .unwrap();
    const INITIAL: u64 = 1_000_000;
    admin::promo_set(&ledger, &id("flash"), spec(INITIAL), false)
        .await
        .unwrap();
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let failed_over = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::<(u64, bool)>::new()));
    let fatal = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut workers = Vec::new();
    for _ in 0..8 {
        let (ledger, next, stop, failed_over, acked, fatal) = (
            ledger.clone(),
            next.clone(),
            stop.clone(),
            failed_over.clone(),
            acked.clone(),
            fatal.clone(),
        );
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let e = placed(
                    &format!("e{i}"),
                    &format!("o{i}"),
                    &format!("c{i}"),
                    T,
                    &[("flash", 1, 1)],
                );
                // Like the pipeline: retry until done, or give up uncommitted at stop.
                loop {
                    match ledger.place(&e).await {
                        Ok(PlaceDecision::Accepted { .. }) => {
                            acked
                                .lock()
                                .unwrap()
                                .push((i, failed_over.load(Ordering::SeqCst)));
                            break;
                        }
                        Ok(other) => panic!("event {i}: {other:?}"),
                        Err(err) if err.disposition() == Disposition::Retry => {
                            if stop.load(Ordering::SeqCst) {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(err) => {
                            fatal.lock().unwrap().push(err.to_string());
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    r.proxy.set(Link::Stalled);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed_at = Instant::now();
    r.primary.kill9();
    r.proxy.set(Link::Cut);
    r.wait_promoted(r.replica.port, 90, None).await;
    let failover_secs = killed_at.elapsed().as_secs_f64();
    failed_over.store(true, Ordering::SeqCst);
    // The gate needs a replica again: the old primary rejoins as one.
    r.restart_old_primary_as_replica_of(r.replica.port).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked.lock().unwrap().iter().filter(|a| a.1).count() < 50 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    ledger.quit().await;

    let after = Ledger::connect(&gate_settings(
        &format!("redis://127.0.0.1:{}", r.replica.port),
        &prefix,
        0,
    ))
    .await
    .unwrap();
    let acked = acked.lock().unwrap().clone();
    let mut lost = 0;
    for (i, _) in &acked {
        if !record_exists(&after, "flash", &format!("o{i}")).await {
            lost += 1;
        }
    }
    let mut records = 0;
    for i in 0..next.load(Ordering::SeqCst) {
        records += usize::from(record_exists(&after, "flash", &format!("o{i}")).await);
    }
    // Consistent on the new primary whatever was lost: no stock held by a
    // vanished record, none given twice.
    assert_eq!(
        INITIAL as i64 - stock(&after, "flash").await,
        records as i64,
        "stock taken vs records on the new primary"
    );
    after.quit().await;
    let stats = cli(r.replica.port, &["INFO", "commandstats"]);
    let noscript_fallbacks = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_eval:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let fatal_errors = fatal.lock().unwrap().clone();
    Figures {
        acknowledged: acked.len(),
        acknowledged_after_failover: acked.iter().filter(|a| a.1).count(),
        lost,
        fatal_errors,
        failover_secs,
        noscript_fallbacks,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_gate_a_failover_loses_no_acknowledged_deduction() {
    let f = failover_run(1).await;
    eprintln!("wait_replicas=1: {f:?}");
    assert!(f.fatal_errors.is_empty(), "{f:?}");
    assert!(
        f.acknowledged_after_failover > 0,
        "the failover was followed: {f:?}"
    );
    assert_eq!(f.lost, 0, "{f:?}");
}

/// The control: the same fault without the gate loses acknowledged
/// deductions (the issue measured ~680 of ~2,800); if this ever reports 0,
/// the fault no longer tests anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_gate_a_failover_loses_acknowledged_deductions() {
    let f = failover_run(0).await;
    eprintln!("wait_replicas=0: {f:?}");
    assert!(f.fatal_errors.is_empty(), "{f:?}");
    assert!(
        f.acknowledged_after_failover > 0,
        "the failover was followed: {f:?}"
    );
    assert!(f.lost > 0, "the fault lost nothing without the gate: {f:?}");
}

/// The gate's cost at the ledger (not a test: run it with
/// `cargo test --release --test it replication::gate_cost -- --ignored --nocapture`).
/// 16 concurrent orders at a time, single-line placements, against a
/// primary and one replica replicating directly (no proxy), with
/// `wait_replicas` 0 and 1 in turn; events/s and p50 / p99 of `place`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test"]
async fn gate_cost() {
    let r = Replicated::start(false, None, None).await;
    let primary = r.primary.port.to_string();
    r.node_cli(r.replica.port, &["REPLICAOF", "127.0.0.1", &primary]);
    r.wait_in_sync(r.replica.port).await;
    let url = format!("redis://127.0.0.1:{primary}");
    let prefix = unique_prefix();
    let setup = Ledger::connect(&gate_settings(&url, &prefix, 0))
        .await
        .unwrap();
    admin::promo_set(&setup, &id("p"), spec(100_000_000), false)
        .await
        .unwrap();
    let n: u64 = std::env::var("GATE_COST_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    for round in 0..2 {
        for wait in [0, 1] {
            let ledger = Ledger::connect(&gate_settings(&url, &prefix, wait))
                .await
                .unwrap();
            let next = Arc::new(AtomicU64::new(0));
            let start = Instant::now();
            let mut workers = Vec::new();
            for _ in 0..16 {
                let (ledger, next) = (ledger.clone(), next.clone());
                workers.push(tokio::spawn(async move {
                    let mut took = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= n {
                            return took;
                        }
                        let tag = format!("r{round}w{wait}i{i}");
                        let e = placed(&tag, &tag, &tag, T, &[("p", 1, 1)]);
                        let t = Instant::now();
                        ledger.place(&e).await.unwrap();
                        took.push(t.elapsed());
                    }
                }));
            }
            let mut took = Vec::new();
            for w in workers {
                took.extend(w.await.unwrap());
            }
            let secs = start.elapsed().as_secs_f64();
            took.sort();
            let q = |f: f64| took[((took.len() as f64 * f) as usize).min(took.len() - 1)];
            eprintln!(
                "gate_cost round {round} wait_replicas={wait}: {n} events in {secs:.2} s = {:.0} events/s, place p50 {:?} p99 {:?}",
                n as f64 / secs,
                q(0.50),
                q(0.99)
            );
            ledger.quit().await;
        }
    }
    setup.quit().await;
}
