//! Error replies and errors on the way to Redis: BADARG for bad
//! arguments, NOSCRIPT answered with EVAL, and how connection errors are
//! classified.

use super::*;
use crate::common::redis::*;
use deductor::error::Disposition;
use deductor::ledger::{scripts, ErrorClass, Ledger};
use fred::prelude::*;

/// Bad arguments: an error reply with code BADARG and nothing written.
#[tokio::test]
async fn bad_arguments_are_badarg_error_replies() {
    let r = standalone().await;
    seed_limited(&r, "p", "3").await;
    let k = r
        .keys()
        .deduct_line(&id("p"), &id("o1"), &id("c"), &id("e1"));
    let good = ["1", "1", "1800000000", "e1", "1000", "1000", "c"];
    let before = r.dump().await;
    let bad_numbers = [
        "-3",
        "1e3",
        "007",
        "abc",
        " 5 ",
        "nan",
        "inf",
        "0x10",
        "-0",
        "9007199254740993",
        "",
    ];
    let mut cases: Vec<Vec<String>> = Vec::new();
    for i in [0usize, 1, 2, 4, 5] {
        for v in bad_numbers {
            if i == 2 && v == "-3" {
                continue; // a negative business time is valid
            }
            let mut args = good.map(String::from).to_vec();
            args[i] = v.into();
            cases.push(args);
        }
    }
    for v in ["", "a:b", "{x}", "e 1"] {
        for i in [3, 6] {
            let mut args = good.map(String::from).to_vec();
            args[i] = v.into();
            cases.push(args);
        }
    }
    let mut zero_ttl = good.map(String::from).to_vec();
    zero_ttl[4] = "0".into();
    cases.push(zero_ttl);
    cases.push(good[..6].iter().map(|s| s.to_string()).collect());
    for args in cases {
        let e = r
            .eval(scripts::DEDUCT.body, k.as_vec(), args.clone())
            .await
            .unwrap_err();
        assert_eq!(classify_code(&e), ErrorClass::BadArg, "{args:?}: {e}");
    }
    let e = r
        .eval(
            scripts::DEDUCT.body,
            k.as_vec()[..3].to_vec(),
            good.map(String::from).to_vec(),
        )
        .await
        .unwrap_err();
    assert_eq!(classify_code(&e), ErrorClass::BadArg, "{e}");

    let rk = r
        .keys()
        .rollback_line(&id("p"), &id("o1"), &id("c"), &id("r1"));
    for args in [
        ["x", "", "1000", "1000", "r1", "c"],
        ["", "-1", "1000", "1000", "r1", "c"],
        ["", "", "0", "1000", "r1", "c"],
        ["", "", "1000", "1e3", "r1", "c"],
        ["", "", "1000", "1000", "r:1", "c"],
        ["", "", "1000", "1000", "r1", ""],
    ] {
        let e = r
            .eval(
                scripts::ROLLBACK.body,
                rk.as_vec(),
                args.map(String::from).to_vec(),
            )
            .await
            .unwrap_err();
        assert_eq!(classify_code(&e), ErrorClass::BadArg, "{args:?}: {e}");
    }
    let rel = k.as_vec();
    let s3 = |a: &str, b: &str, c: &str| vec![a.to_owned(), b.to_owned(), c.to_owned()];
    for args in [
        vec![],
        vec!["".to_string()],
        vec!["e1".into(), "x".into()],
        s3("", "1000", "c"),
        s3("e1", "0", "c"),
        s3("e1", "1000", "c d"),
    ] {
        let e = r
            .eval(scripts::RELEASE.body, rel.clone(), args.clone())
            .await
            .unwrap_err();
        assert_eq!(classify_code(&e), ErrorClass::BadArg, "{args:?}: {e}");
    }
    let e = r
        .eval(scripts::MEMO.body, vec![k.memo.clone()], vec!["x".into()])
        .await
        .unwrap_err();
    assert_eq!(classify_code(&e), ErrorClass::BadArg, "{e}");
    r.assert_unchanged(&before, "bad arguments").await;
}

fn classify_code(e: &fred::error::Error) -> ErrorClass {
    deductor::ledger::classify(e)
}

#[tokio::test]
async fn noscript_falls_back_to_eval() {
    let r = standalone().await;
    r.seed("p", &[("budget", "100")]).await;
    let _: () = r.pool().next().script_flush(false).await.unwrap();
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c", T, &[("p", 1, 0)]))
        .await
        .unwrap();
    accepted(&d);
    let cached: Vec<bool> = r
        .pool()
        .next()
        .script_exists(vec![scripts::DEDUCT.sha1.clone()])
        .await
        .unwrap();
    assert_eq!(cached, vec![true], "EVAL cached the script");
    let _: () = r.pool().next().script_flush(false).await.unwrap();
    let d = r
        .ledger
        .refund(&refunded("r1", "o1", "c", &[("p", None, None)]))
        .await
        .unwrap();
    assert_eq!(line(&d, 0).0, Ok(()));
    r.ledger.load_scripts().await.unwrap();
    let cached: Vec<bool> = r
        .pool()
        .next()
        .script_exists(
            scripts::all()
                .iter()
                .map(|s| s.sha1.clone())
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    assert!(cached.iter().all(|c| *c), "{cached:?}");
    r.ledger.ping().await.unwrap();
}

#[tokio::test]
async fn connection_errors_are_classified() {
    let mut s = settings("redis://127.0.0.1:1", &unique_prefix());
    s.connect_timeout_ms = 500;
    let e = Ledger::connect(&s).await.unwrap_err();
    assert_eq!(e.disposition(), Disposition::Retry, "{e}");

    let mut s = settings(&redis_url(), &unique_prefix());
    s.username = format!("nobody-{}", unique_prefix());
    s.password = "wrong".into();
    let e = Ledger::connect(&s).await.unwrap_err();
    assert_eq!(
        (e.class(), e.disposition()),
        (ErrorClass::Auth, Disposition::Fatal),
        "{e}"
    );

    let s = settings("not a url", &unique_prefix());
    let e = Ledger::connect(&s).await.unwrap_err();
    assert_eq!(e.disposition(), Disposition::Fatal, "{e}");
}

/// Issue 25, item 2: a Redis out of memory (`maxmemory` with `noeviction`)
/// refuses the scripts' writes with `OOM`. Each script must reply with that
/// code, not with Redis's `ERR ... script: ...` wrapping of a re-raised Lua
/// error, and the ledger must class it `busy` (retried): deduct.lua alone
/// and in deduct_batch.lua, rollback.lua, release.lua. Before the fix a
/// refund's and a single placement line's OOM came back as a fatal
/// `ERR OOM ...` (`other`). A redis-server of the test's own, so that the
/// shared one never runs out of memory under the other tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_is_busy_from_every_script() {
    use crate::common::replication::{cli, free_port, redis};
    use deductor::admin::{self, PromoSpec};

    let dir = tempfile::tempdir().unwrap();
    let node = redis(
        dir.path(),
        free_port(),
        &["--maxmemory-policy", "noeviction"],
    );
    let url = format!("redis://127.0.0.1:{}", node.port);
    crate::common::replication::eventually(20, "redis answers", || {
        cli(node.port, &["PING"]).ends_with("PONG")
    })
    .await;
    let prefix = unique_prefix();
    let plain = Ledger::connect(&settings(&url, &prefix)).await.unwrap();
    let mut s = settings(&url, &prefix);
    s.batch_max_lines = 32;
    let batched = Ledger::connect(&s).await.unwrap();
    let spec = PromoSpec {
        budget: Some(100),
        stock: Some(10),
        per_customer: Some(2),
        ..PromoSpec::default()
    };
    for p in ["a", "b"] {
        admin::promo_set(&plain, &id(p), spec.clone(), false)
            .await
            .unwrap();
    }
    // o1 holds a; o2 holds a, and its release (b rejects below) must write.
    let d = plain
        .place(&placed("e1", "o1", "c1", T, &[("a", 5, 1)]))
        .await
        .unwrap();
    assert!(matches!(d, PlaceDecision::Accepted { .. }), "{d:?}");

    assert_eq!(cli(node.port, &["CONFIG", "SET", "maxmemory", "1"]), "OK");
    let busy = |what: &str, e: deductor::ledger::LedgerError| {
        assert_eq!(e.class(), ErrorClass::Busy, "{what}: {e}");
        assert_eq!(e.disposition(), Disposition::Retry, "{what}: {e}");
        // The reply itself starts with the code (lua/lib.lua's run()), not
        // with Redis's `ERR` wrapping of a re-raised Lua error.
        match &e {
            deductor::ledger::LedgerError::Redis { cause, .. } => {
                assert!(cause.details().starts_with("OOM "), "{what}: {e}")
            }
            other => panic!("{what}: {other}"),
        }
    };
    let e2 = placed("e2", "o2", "c2", T, &[("a", 5, 1)]);
    busy("deduct.lua", plain.place(&e2).await.unwrap_err());
    busy("deduct_batch.lua", batched.place(&e2).await.unwrap_err());
    let r3 = refunded("e3", "o1", "c1", &[("a", None, None)]);
    busy("rollback.lua", plain.refund(&r3).await.unwrap_err());
    // release.lua: a rejection read back on b releases a (whose memo write OOMs).
    let k = plain.keys();
    assert_eq!(cli(node.port, &["CONFIG", "SET", "maxmemory", "0"]), "OK");
    let _: () = plain
        .pool()
        .set(
            k.rejected(&id("b"), &id("e4")),
            "stock_insufficient",
            None,
            None,
            false,
        )
        .await
        .unwrap();
    assert_eq!(cli(node.port, &["CONFIG", "SET", "maxmemory", "1"]), "OK");
    let e4 = placed("e4", "o1", "c1", T, &[("a", 5, 1), ("b", 0, 1)]);
    busy("release.lua", plain.place(&e4).await.unwrap_err());

    // Memory released: every one of them decides as it would have.
    assert_eq!(cli(node.port, &["CONFIG", "SET", "maxmemory", "0"]), "OK");
    let d = plain.place(&e2).await.unwrap();
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
    let d = plain.refund(&r3).await.unwrap();
    assert_eq!(d.lines[0].status, Ok(()), "{d:?}");
    plain.quit().await;
    batched.quit().await;
}
