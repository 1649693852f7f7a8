//! Security against the real services: the pipeline over Kafka SASL/SCRAM
//! (SASL_PLAINTEXT on the dev-stack's 9094) and SASL_SSL (9095, the
//! dev-stack's own CA), configured only through the `kafka.consumer.*` /
//! `kafka.producer.*` pass-through; a wrong password is a fatal, clear error
//! that never shows the password; a least-privilege Redis ACL user the
//! service works with; Redis over TLS with a CA file.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use crate::common::kafka;
use crate::common::service::{self, Fixture};
use deductor::admin::PromoSpec;
use deductor::config::Settings;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// The SCRAM listener and its credentials (`scripts/dev-stack env`).
struct Scram {
    brokers: String,
    mechanism: String,
    username: String,
    password: String,
}

fn scram() -> Scram {
    Scram {
        brokers: env_or("DEDUCTOR_KAFKA_SASL_BROKERS", "127.0.0.1:9094"),
        mechanism: env_or("DEDUCTOR_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
        username: env_or("DEDUCTOR_KAFKA_SASL_USERNAME", "deductor"),
        password: env_or("DEDUCTOR_KAFKA_SASL_PASSWORD", "deductor-secret"),
    }
}

/// The SASL_SSL listener and the CA that signed its certificate.
fn tls_brokers() -> String {
    env_or("DEDUCTOR_KAFKA_TLS_BROKERS", "127.0.0.1:9095")
}

fn tls_ca() -> String {
    std::env::var("DEDUCTOR_KAFKA_TLS_CA").unwrap_or_else(|_| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(".stack/kafka/tls/ca.pem")
            .display()
            .to_string()
    })
}

/// `kafka.consumer.*` and `kafka.producer.*` overrides for one librdkafka
/// property set, plus the brokers.
fn kafka_overrides(brokers: &str, props: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut o = vec![("kafka.brokers".to_owned(), brokers.to_owned())];
    for client in ["consumer", "producer"] {
        for (k, v) in props {
            o.push((format!("kafka.{client}.{k}"), (*v).to_owned()));
        }
    }
    o
}

fn scram_props<'a>(s: &'a Scram, protocol: &'a str, password: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("security.protocol", protocol),
        ("sasl.mechanism", s.mechanism.as_str()),
        ("sasl.username", s.username.as_str()),
        ("sasl.password", password),
    ]
}

fn settings_with(f: &Fixture, extra: &[(String, String)]) -> Settings {
    let extra: Vec<(&str, &str)> = extra
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    f.settings(&extra)
}

fn event(kind: &str, e: &str, o: &str, lines: Value) -> Value {
    let at = if kind == "OrderPlaced" {
        "2026-11-29T10:00:00Z"
    } else {
        "2026-11-30T08:00:00Z"
    };
    json!({"type": kind, "event_id": e, "order_id": o, "customer_id": "c-1",
           "occurred_at": at, "lines": lines})
}

/// Runs the service in-process with `settings`, sends a two-line placement
/// that is rejected (so its first line is released), a placement, its
/// refund and an invalid event, and checks the outcomes and the dead letter:
/// the whole path (consume, every service script, produce, commit) over the
/// configured transport and Redis user.
async fn round_trip(f: &Fixture, settings: Settings) {
    let ledger = f.ledger().await;
    round_trip_with(f, &ledger, settings).await;
    ledger.quit().await;
}

/// [`round_trip`] with `ledger` (full rights) creating the promotion.
async fn round_trip_with(f: &Fixture, ledger: &deductor::ledger::Ledger, settings: Settings) {
    f.promo(
        ledger,
        "sec",
        PromoSpec {
            budget: Some(10_000),
            stock: Some(5),
            per_customer: Some(3),
            ..PromoSpec::default()
        },
    )
    .await;
    let svc = service::start(settings);
    let rejected = event(
        "OrderPlaced",
        "e-p0",
        // The same order as the next two: one order's events run one after
        // another, so the release is done before e-p1 deducts.
        "o-1",
        json!([{"promotion_id": "sec", "budget": 100, "stock": 1},
               {"promotion_id": "nope", "budget": 1}]),
    );
    let placed = event(
        "OrderPlaced",
        "e-p1",
        "o-1",
        json!([{"promotion_id": "sec", "budget": 700, "stock": 1}]),
    );
    let refund = event(
        "OrderRefunded",
        "e-r1",
        "o-1",
        json!([{"promotion_id": "sec"}]),
    );
    kafka::produce_events(&f.topics.input, &[rejected, placed, refund]).await;
    kafka::produce_raw(
        &f.topics.input,
        &[kafka::Raw {
            key: Some(b"o-2".to_vec()),
            payload: Some(b"{not json".to_vec()),
            ..kafka::Raw::default()
        }],
    )
    .await;
    let outcomes = kafka::read_n(&f.topics.outcome, 3, WAIT).await;
    // Different orders may finish in any order: look outcomes up by event.
    let by_event: std::collections::BTreeMap<String, Value> = outcomes
        .iter()
        .map(|r| {
            let v = r.json();
            (v["event_id"].as_str().unwrap_or_default().to_owned(), v)
        })
        .collect();
    let kinds: Vec<(&str, &str)> = by_event
        .iter()
        .map(|(e, v)| (e.as_str(), v["type"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("e-p0", "DeductRejected"),
            ("e-p1", "DeductAccepted"),
            ("e-r1", "RollbackApplied")
        ],
        "{by_event:#?}"
    );
    assert_eq!(by_event["e-p0"]["reason"], "promotion_not_found");
    assert_eq!(
        by_event["e-p1"]["lines"][0]["remaining"],
        json!({"budget": 9_300, "stock": 4}),
        "the rejected order's first line was released"
    );
    let dead = kafka::read_n(&f.topics.dlq, 1, WAIT).await;
    assert_eq!(dead[0].payload.as_deref(), Some(&b"{not json"[..]));
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, f.topics.partitions, WAIT).await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_over_sasl_scram() {
    let f = Fixture::new("sec-scram", 1).await;
    let s = scram();
    let settings = settings_with(
        &f,
        &kafka_overrides(&s.brokers, &scram_props(&s, "SASL_PLAINTEXT", &s.password)),
    );
    round_trip(&f, settings).await;
    f.cleanup().await;
}

/// A password that is not the listener's and that no log would contain by
/// chance.
fn wrong_password() -> String {
    format!("not-the-secret-{:016x}", rand::random::<u64>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_scram_password_is_fatal_and_never_shown() {
    let f = Fixture::new("sec-badpw", 1).await;
    let s = scram();
    let bad = wrong_password();
    let overrides = kafka_overrides(&s.brokers, &scram_props(&s, "SASL_PLAINTEXT", &bad));

    // In-process: run() gives up with an error instead of retrying forever.
    let svc = service::start(settings_with(&f, &overrides));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !svc.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the service still runs 30 s after every login was refused"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    let text = format!("{:#}", result.expect_err("a refused login is fatal"));
    assert!(text.contains("Authentication"), "not a clear error: {text}");
    assert!(!text.contains(&bad), "the error shows the password: {text}");

    // As a process, with debug logs: exits non-zero, says why, and neither
    // the logs nor the error line show the password.
    let mut extra: Vec<(&str, &str)> = overrides
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    extra.extend([("log.level", "debug"), ("log.format", "json")]);
    let env = f.env(&extra);
    let mut child = service::spawn(&env, &["run"]);
    let status = child
        .wait(Duration::from_secs(45))
        .unwrap_or_else(|| panic!("deductor run still runs; log:\n{}", child.log_tail(20)));
    let log = std::fs::read_to_string(&child.log).unwrap();
    assert!(!status.success(), "exit status {status}; log:\n{log}");
    assert!(
        log.contains("Authentication"),
        "no clear error; log:\n{log}"
    );
    assert!(!log.contains(&bad), "the output shows the password:\n{log}");

    // `deductor check`: fails, without the password; with the right one it passes.
    let out = check(&env);
    assert!(!out.0, "check passed with a wrong password:\n{}", out.1);
    assert!(
        out.1.contains("refused the login") && out.1.contains("Authentication"),
        "check does not say the login was refused:\n{}",
        out.1
    );
    assert!(
        !out.1.contains(&bad),
        "check shows the password:\n{}",
        out.1
    );
    let good = kafka_overrides(&s.brokers, &scram_props(&s, "SASL_PLAINTEXT", &s.password));
    let good: Vec<(&str, &str)> = good.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = check(&f.env(&good));
    assert!(out.0, "check fails with the right password:\n{}", out.1);
    assert!(
        !out.1.contains(&s.password),
        "check shows the password:\n{}",
        out.1
    );
    f.cleanup().await;
}

/// `deductor check` with `env`: (passed, stdout + stderr).
fn check(env: &[(String, String)]) -> (bool, String) {
    let out = service::command(env)
        .arg("check")
        .stdin(Stdio::null())
        .output()
        .expect("running deductor check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The consumer logs in, the producer does not (a typo in one of the two
/// property maps): the service stops with the producer's error instead of
/// retrying outcomes forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_producer_password_alone_is_fatal() {
    let f = Fixture::new("sec-badprod", 1).await;
    let s = scram();
    let bad = wrong_password();
    let mut o = vec![("kafka.brokers".to_owned(), s.brokers.clone())];
    for (client, pw) in [
        ("consumer", s.password.as_str()),
        ("producer", bad.as_str()),
    ] {
        for (k, v) in scram_props(&s, "SASL_PLAINTEXT", pw) {
            o.push((format!("kafka.{client}.{k}"), v.to_owned()));
        }
    }
    let svc = service::start(settings_with(&f, &o));
    kafka::produce_events(
        &f.topics.input,
        &[event(
            "OrderPlaced",
            "e-1",
            "o-1",
            json!([{"promotion_id": "none"}]),
        )],
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !svc.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the service still runs 30 s after the producer's login was refused"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    let text = format!("{:#}", result.expect_err("a refused login is fatal"));
    assert!(text.contains("producer"), "{text}");
    assert!(text.contains("Authentication"), "{text}");
    assert!(!text.contains(&bad), "the error shows the password: {text}");
    assert!(kafka::read_all(&f.topics.outcome).await.is_empty());
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_over_sasl_ssl_with_a_private_ca() {
    let f = Fixture::new("sec-tls", 1).await;
    let s = scram();
    let ca = tls_ca();
    assert!(
        std::path::Path::new(&ca).exists(),
        "no CA file {ca}: start the dev-stack (scripts/dev-stack up) or set DEDUCTOR_KAFKA_TLS_CA"
    );
    let mut props = scram_props(&s, "SASL_SSL", &s.password);
    props.push(("ssl.ca.location", ca.as_str()));
    let settings = settings_with(&f, &kafka_overrides(&tls_brokers(), &props));
    assert_eq!(
        settings.kafka.consumer.get("ssl.ca.location"),
        Some(&ca),
        "passed through to librdkafka"
    );
    round_trip(&f, settings).await;
    f.cleanup().await;
}

/// The service's least-privilege ACL rules after `reset on >PW ~PREFIX:*`,
/// as docs/operations.md ("A least-privilege Redis user") gives them: the
/// script calls, `SCRIPT LOAD` for `deductor check`, `PING` for readiness,
/// and the commands the scripts themselves run (Redis checks those against
/// the calling user too).
const SERVICE_ACL: &str = "resetchannels -@all +evalsha +eval +script|load +ping +info \
    +get +set +del +expire +incr +decr +hgetall +hset +hdel +hincrby";

/// The operators' user for `promo set|show` and `audit`, as documented.
const ADMIN_ACL: &str = "resetchannels -@all +evalsha +eval +script|load +ping +info \
    +exists +incr +hset +hdel +del +hgetall +hget +get +type +scan";

fn acl_rules(password: &str, prefix: &str, rules: &str) -> Vec<String> {
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
async fn raw(ledger: &deductor::ledger::Ledger, args: &[&str]) -> Result<(), String> {
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

fn assert_noperm(result: Result<(), String>, what: &str) {
    match result {
        Ok(()) => panic!("{what} was allowed"),
        Err(e) => assert!(e.contains("NOPERM"), "{what}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_redis_user() {
    use fred::prelude::AclInterface;
    let f = Fixture::new("sec-acl", 1).await;
    let admin = f.ledger().await;
    let tag = format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
    let users = [
        (format!("deductor-test-{tag}"), SERVICE_ACL),
        (format!("deductor-admin-test-{tag}"), ADMIN_ACL),
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

async fn acl_checks(f: Fixture, user: String, admin_user: String, password: String) {
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
    let refused = deductor::admin::audit::run(&ledger, &[]).await;
    // (fred turns SCAN's NOPERM into "Expected bulk string array from SCAN".)
    assert!(refused.is_err(), "audit as the service user: {refused:?}");
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
    deductor::admin::audit::run(&admin_ledger, &[])
        .await
        .expect("audit as the admin user");
    assert_noperm(
        raw(&admin_ledger, &["FLUSHALL"]).await,
        "FLUSHALL as the admin user",
    );
    admin_ledger.quit().await;

    // `deductor check` as the service user: passes, password not shown.
    let env = f.env(&[("redis.username", &user), ("redis.password", &password)]);
    let (ok, out) = check(&env);
    assert!(ok, "check as the service user:\n{out}");
    assert!(
        !out.contains(&password),
        "check shows the Redis password:\n{out}"
    );
}

/// A throwaway `redis-server` of this test on a free port; TLS-only, with a
/// CA and a server certificate for 127.0.0.1 made by openssl in a temp dir,
/// when asked. Killed on drop.
struct PrivateRedis {
    child: std::process::Child,
    port: u16,
    ca: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(program: &str, args: &[&str], dir: &std::path::Path) {
    let out = std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn private_redis(tls: bool) -> PrivateRedis {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    run(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=deductor test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
        d,
    );
    run(
        "openssl",
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
        d,
    );
    run(
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ],
        d,
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = std::fs::File::create(d.join("redis.log")).unwrap();
    let mut cmd = std::process::Command::new("redis-server");
    cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
    if tls {
        cmd.args(["--port", "0", "--tls-port"])
            .arg(port.to_string())
            .args([
                "--tls-cert-file",
                "server.pem",
                "--tls-key-file",
                "server.key",
                "--tls-ca-cert-file",
                "ca.pem",
                "--tls-auth-clients",
                "no",
            ]);
    } else {
        cmd.arg("--port").arg(port.to_string());
    }
    let child = cmd
        .current_dir(d)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting redis-server (Debian's is built with TLS)");
    let mut r = PrivateRedis {
        child,
        port,
        ca: d.join("ca.pem"),
        _dir: dir,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !service::listening(&format!("127.0.0.1:{port}")) {
        if let Ok(Some(s)) = r.child.try_wait() {
            panic!(
                "redis-server exited ({s}): {}",
                std::fs::read_to_string(r._dir.path().join("redis.log")).unwrap_or_default()
            );
        }
        assert!(
            std::time::Instant::now() < deadline,
            "redis-server did not listen on {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_a_ca_file() {
    use deductor::ledger::Ledger;
    let server = private_redis(true).await;
    let f = Fixture::new("sec-rtls", 1).await;
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let ca = server.ca.display().to_string();
    let settings = f.settings(&[("redis.url", &url), ("redis.tls_ca_file", &ca)]);

    // The service over TLS: events in, outcomes out, scripts in the TLS Redis.
    let admin = Ledger::connect(&settings.redis)
        .await
        .expect("connecting over TLS with the CA file");
    round_trip_with(&f, &admin, settings.clone()).await;
    let p = deductor::domain::event::Id::parse("sec").unwrap();
    let view = deductor::admin::promo_show(&admin, &p).await.unwrap();
    assert!(view.is_some(), "the promotion lives in the TLS Redis");
    admin.quit().await;

    // Without the CA the server is not trusted: a clear, fatal error.
    let mut untrusted = settings.redis.clone();
    untrusted.tls_ca_file.clear();
    let e = Ledger::connect(&untrusted)
        .await
        .expect_err("a certificate of an unknown CA is refused");
    assert_eq!(e.disposition(), deductor::error::Disposition::Fatal, "{e}");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");

    // Opting out of verification connects (throwaway servers only).
    untrusted.tls_insecure_skip_verify = true;
    let insecure = Ledger::connect(&untrusted)
        .await
        .expect("tls_insecure_skip_verify accepts the certificate");
    insecure.ping().await.unwrap();
    insecure.quit().await;

    // Plain redis:// to the TLS port does not get through.
    let mut plain = settings.redis.clone();
    plain.url = format!("redis://127.0.0.1:{}", server.port);
    plain.tls_ca_file.clear();
    plain.connect_timeout_ms = 500;
    assert!(Ledger::connect(&plain).await.is_err());
    let t = &f.topics;
    kafka::delete_topics(&[&t.input, &t.outcome, &t.dlq]).await;
}

/// The service's Redis work as `rules` allow it, on a private Redis: a
/// two-line placement rejected on its second line (memo, deduct, release), a
/// placement (per-customer count, record, TTL), its refund, `PING` and
/// `SCRIPT LOAD`, after a `SCRIPT FLUSH` so the `EVAL` fallback runs too.
/// Ok when every decision is the one full rights give.
/// Where [`service_ops`] runs.
struct Target<'a> {
    /// Full rights: creates the promotions (and flushes the script cache).
    admin: &'a deductor::ledger::Ledger,
    /// One full-rights connection per node: ACL users are per node.
    nodes: &'a [deductor::ledger::Ledger],
    url: &'a str,
    prefix: &'a str,
    /// `SCRIPT FLUSH` first (a private server only).
    flush: bool,
}

async fn service_ops(t: &Target<'_>, round: usize, rules: &[&str]) -> Result<(), String> {
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

async fn service_ops_as(
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
        ledger.ping().await.map_err(|e| e.to_string())?;
        ledger.load_scripts().await.map_err(|e| e.to_string())
    };
    let result = ops.await;
    ledger.quit().await;
    result
}

/// The documented service ACL is enough, and each of its command rules is
/// needed by some service operation (`+info` only silences a warning).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_of_the_service_acl_is_needed() {
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
        if !rule.starts_with('+') || *rule == "+info" {
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
/// the slot map and the cluster state at connect, and `ASKING` to follow the
/// `ASK` redirects of a slot being migrated (resharding; not exercised here).
const CLUSTER_ACL: &str = "+cluster|slots +cluster|info +asking";

/// The service user on the dev-stack's Redis Cluster (created on every node:
/// ACL users are per node), with the cluster rules of docs/operations.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_acl_on_redis_cluster() {
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
fn cluster_nodes(url: &str) -> Vec<String> {
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
