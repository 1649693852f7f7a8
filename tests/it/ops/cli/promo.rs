//! `promo set/show/pause/resume/adjust/limit/list/delete`, and the promo_*
//! scripts behind them refusing bad arguments and corrupt data.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promo_set_refuses_to_overwrite_without_force_and_show_reads_it() {
    // A prefix of its own, whose keys are deleted when the test passes.
    let r = crate::common::redis::standalone().await;
    let e = env(&[
        ("DEDUCTOR_REDIS_URL", &r.url),
        ("DEDUCTOR_REDIS_KEY_PREFIX", &r.prefix),
        ("DEDUCTOR_LOG_LEVEL", "warn"),
    ]);
    let set = [
        "promo",
        "set",
        "flash-1",
        "--budget",
        "1500",
        "--stock",
        "10",
        "--per-customer",
        "1",
    ];
    let o = deductor(&e, &set).await;
    assert!(o.status.success(), "first promo set: {}", stderr(&o));
    assert!(
        stdout(&o).contains("promotion flash-1 created"),
        "{}",
        stdout(&o)
    );

    let o = deductor(&e, &set).await;
    assert_one_line_error(&o, "--force", "promo set of an existing promotion");

    let o = deductor(
        &e,
        &["promo", "set", "flash-1", "--budget", "900", "--force"],
    )
    .await;
    assert!(o.status.success(), "promo set --force: {}", stderr(&o));
    assert!(
        stdout(&o).contains("promotion flash-1 replaced"),
        "{}",
        stdout(&o)
    );

    let o = deductor(&e, &["promo", "show", "flash-1"]).await;
    assert!(o.status.success(), "promo show: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("budget: 900 remaining of 900"), "{out}");
    assert!(
        out.contains("stock: unlimited"),
        "--force replaced the whole promotion: {out}"
    );

    let o = deductor(&e, &["promo", "show", "no-such-promo"]).await;
    assert_one_line_error(&o, "no-such-promo", "promo show of a missing promotion");

    let o = deductor(&e, &["promo", "show", "bad:id"]).await;
    assert_one_line_error(&o, "bad:id", "promo show of an invalid id");
    assert_eq!(
        r.promo_field("flash-1", "budget").await.as_deref(),
        Some("900")
    );
}

/// Issue 11: pause, resume, adjust, limit, list and delete change a promotion
/// in place; deductions made in between are kept and `audit` stays clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promo_pause_resume_adjust_limit_list_and_delete_change_it_in_place() {
    use crate::common::redis::{placed, refunded};
    use deductor::domain::decision::{PlaceDecision, Reason};
    let r = crate::common::redis::standalone().await;
    let o = admin(
        &r,
        &[
            "promo",
            "set",
            "flash",
            "--stock",
            "10",
            "--budget",
            "1000",
            "--per-customer",
            "1",
        ],
    )
    .await;
    assert_exit(&o, 0, "promo set");
    let t = 1_800_000_000;
    let accepted = |d: &PlaceDecision| matches!(d, PlaceDecision::Accepted { .. });
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c1", t, &[("flash", 100, 1)]))
        .await
        .unwrap();
    assert!(accepted(&d), "{d:?}");

    // pause / resume: only the status changes.
    assert_exit(&admin(&r, &["promo", "pause", "flash"]).await, 0, "pause");
    let o = admin(&r, &["promo", "show", "flash", "--output", "json"]).await;
    assert_exit(&o, 0, "promo show --output json");
    let v = json_of(&o);
    assert_eq!(v["status"], "paused", "{v}");
    assert_eq!(
        (v["stock"].as_u64(), v["initial_stock"].as_u64()),
        (Some(9), Some(10)),
        "{v}"
    );
    let d = r
        .ledger
        .place(&placed("e2", "o2", "c2", t, &[("flash", 100, 1)]))
        .await
        .unwrap();
    assert!(
        matches!(
            d,
            PlaceDecision::Rejected {
                reason: Reason::PromotionInactive,
                ..
            }
        ),
        "{d:?}"
    );
    let o = admin(&r, &["promo", "pause", "flash"]).await;
    assert_exit(&o, 0, "pause again");
    assert!(stdout(&o).contains("already paused"), "{}", stdout(&o));
    assert_exit(&admin(&r, &["promo", "resume", "flash"]).await, 0, "resume");
    let d = r
        .ledger
        .place(&placed("e3", "o3", "c3", t, &[("flash", 100, 1)]))
        .await
        .unwrap();
    assert!(accepted(&d), "{d:?}");

    // adjust: remaining and initial move together.
    let o = admin(
        &r,
        &[
            "promo", "adjust", "flash", "--stock", "+5", "--budget", "-100",
        ],
    )
    .await;
    assert_exit(&o, 0, "adjust");
    assert_eq!(r.promo_field("flash", "stock").await.as_deref(), Some("13"));
    assert_eq!(
        r.promo_field("flash", "initial_stock").await.as_deref(),
        Some("15")
    );
    assert_eq!(
        r.promo_field("flash", "budget").await.as_deref(),
        Some("700")
    );
    assert_eq!(
        r.promo_field("flash", "initial_budget").await.as_deref(),
        Some("900")
    );
    let o = admin(
        &r,
        &[
            "promo", "adjust", "flash", "--stock", "-14", "--budget", "+1",
        ],
    )
    .await;
    assert_exit(&o, 1, "adjust below zero");
    assert_one_line_error(&o, "below 0", "adjust below zero");
    let o = admin(
        &r,
        &["promo", "adjust", "flash", "--budget", "+999999999999999"],
    )
    .await;
    assert_exit(&o, 1, "adjust above the bound");
    assert_one_line_error(&o, "999999999999999", "adjust above the bound");
    assert_eq!(
        r.promo_field("flash", "stock").await.as_deref(),
        Some("13"),
        "nothing written"
    );
    assert_eq!(
        r.promo_field("flash", "budget").await.as_deref(),
        Some("700"),
        "nothing written"
    );
    assert_exit(
        &admin(&r, &["promo", "adjust", "flash"]).await,
        2,
        "adjust with no delta",
    );

    // limit: set and remove per_customer only.
    assert_exit(
        &admin(&r, &["promo", "limit", "flash", "--per-customer", "none"]).await,
        0,
        "limit none",
    );
    assert_eq!(r.promo_field("flash", "per_customer").await, None);
    assert_exit(
        &admin(&r, &["promo", "limit", "flash", "--per-customer", "3"]).await,
        0,
        "limit 3",
    );
    assert_eq!(
        r.promo_field("flash", "per_customer").await.as_deref(),
        Some("3")
    );
    // Lowering a limit below what customers hold is done, with a note.
    let o = admin(&r, &["promo", "limit", "flash", "--per-customer", "0"]).await;
    assert_exit(&o, 0, "limit 0");
    assert!(
        stdout(&o).contains("2 customer(s) already hold more than 0 counted order(s)"),
        "{}",
        stdout(&o)
    );
    assert_exit(
        &admin(&r, &["promo", "limit", "flash", "--per-customer", "3"]).await,
        0,
        "limit 3 again",
    );
    assert_eq!(r.promo_field("flash", "stock").await.as_deref(), Some("13"));

    let o = admin(&r, &["audit", "flash"]).await;
    assert_exit(&o, 0, "audit after the changes");

    // An unlimited dimension cannot be adjusted.
    assert_exit(
        &admin(&r, &["promo", "set", "open", "--budget", "50"]).await,
        0,
        "promo set open",
    );
    let o = admin(&r, &["promo", "adjust", "open", "--stock", "+1"]).await;
    assert_one_line_error(&o, "unlimited", "adjust an unlimited stock");
    assert_exit(&o, 1, "adjust an unlimited stock");

    // list: pages sorted by id, JSON.
    let o = admin(&r, &["promo", "list", "--output", "json"]).await;
    assert_exit(&o, 0, "promo list");
    let ids: Vec<String> = json_of(&o)
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["promotion_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["flash", "open"]);
    let o = admin(&r, &["promo", "list", "--limit", "1"]).await;
    assert!(stdout(&o).contains("--after flash"), "{}", stdout(&o));
    let o = admin(&r, &["promo", "list", "--after", "flash"]).await;
    let out = stdout(&o);
    assert!(out.starts_with("open  active"), "{out}");
    assert!(!out.contains("flash "), "{out}");

    // delete and set --force refuse while orders hold deductions.
    let o = admin(&r, &["promo", "delete", "flash"]).await;
    assert_one_line_error(&o, "outstanding", "delete with outstanding orders");
    assert_exit(&o, 1, "delete with outstanding orders");
    assert!(stderr(&o).contains("stock 2"), "{}", stderr(&o));
    let o = admin(&r, &["promo", "set", "flash", "--stock", "5", "--force"]).await;
    assert_one_line_error(
        &o,
        "--discard-outstanding",
        "set --force with outstanding orders",
    );
    assert_eq!(
        r.promo_field("flash", "stock").await.as_deref(),
        Some("13"),
        "not replaced"
    );
    for (e, order, c) in [("r1", "o1", "c1"), ("r3", "o3", "c3")] {
        r.ledger
            .refund(&refunded(e, order, c, &[("flash", None, None)]))
            .await
            .unwrap();
    }
    assert_exit(
        &admin(&r, &["audit", "flash"]).await,
        0,
        "audit after refunds",
    );
    assert_exit(
        &admin(&r, &["promo", "delete", "flash"]).await,
        0,
        "delete once refunded",
    );
    assert_eq!(r.promo_field("flash", "stock").await, None);
    let o = admin(&r, &["promo", "delete", "flash"]).await;
    assert_exit(&o, 1, "delete a missing promotion");
    assert_one_line_error(&o, "does not exist", "delete a missing promotion");

    // Without initial_* the records are counted; --force deletes anyway.
    r.seed("legacy", &[("stock", "4")]).await;
    let d = r
        .ledger
        .place(&placed("e9", "o9", "c9", t, &[("legacy", 0, 1)]))
        .await
        .unwrap();
    assert!(accepted(&d), "{d:?}");
    let o = admin(&r, &["promo", "delete", "legacy"]).await;
    assert_one_line_error(&o, "1 order(s) still deducted", "delete a legacy promotion");
    let o = admin(
        &r,
        &[
            "promo",
            "set",
            "legacy",
            "--stock",
            "4",
            "--force",
            "--discard-outstanding",
        ],
    )
    .await;
    assert_exit(&o, 0, "set --force --discard-outstanding");
    assert_exit(
        &admin(&r, &["promo", "delete", "legacy", "--force"]).await,
        0,
        "delete --force",
    );

    // Exit codes: usage 2, unreachable 3.
    assert_exit(
        &admin(&r, &["promo", "pause", "bad:id"]).await,
        2,
        "an invalid id",
    );
    assert_exit(
        &admin(&r, &["promo", "limit", "x", "--per-customer", "many"]).await,
        2,
        "a bad flag",
    );
    let down = env(&[
        ("DEDUCTOR_REDIS_URL", "redis://127.0.0.1:1"),
        ("DEDUCTOR_LOG_LEVEL", "error"),
    ]);
    let o = deductor(&down, &["promo", "show", "flash"]).await;
    assert_exit(&o, 3, "Redis unreachable");
}

/// The promo_* scripts validate before they write: a malformed argument
/// (BADARG) or corrupt stored data (CORRUPT) is an error reply and nothing
/// changes; `adjust` refuses both dimensions when one fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promo_scripts_refuse_bad_arguments_and_corrupt_data_writing_nothing() {
    use deductor::admin::promo::{self, Adjustment};
    use deductor::admin::AdminError;
    use deductor::ledger::scripts;
    let r = crate::common::redis::standalone().await;
    let key = r.keys().promotion(&crate::common::redis::id("p"));
    r.seed(
        "p",
        &[
            ("stock", "5"),
            ("initial_stock", "9"),
            ("budget", "10"),
            ("initial_budget", "10"),
        ],
    )
    .await;
    let before = r.dump().await;
    for (script, args) in [
        (&scripts::PROMO_STATUS, vec!["stopped"]),
        (&scripts::PROMO_ADJUST, vec!["", ""]),
        (&scripts::PROMO_ADJUST, vec!["+1", ""]),
        (&scripts::PROMO_ADJUST, vec!["-0", ""]),
        (&scripts::PROMO_ADJUST, vec!["1e3", ""]),
        (&scripts::PROMO_LIMIT, vec!["-1"]),
        (&scripts::PROMO_LIMIT, vec!["01"]),
        (&scripts::PROMO_DELETE, vec!["maybe"]),
    ] {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let e = r
            .eval(script.body, vec![key.clone()], args.clone())
            .await
            .expect_err("a BADARG error reply");
        assert!(
            e.details().starts_with("BADARG"),
            "{} {args:?}: {e}",
            script.name
        );
    }
    // A refusal of one dimension writes neither.
    let p = crate::common::redis::id("p");
    let e = promo::adjust(
        &r.ledger,
        &p,
        Adjustment {
            budget: Some(5),
            stock: Some(-6),
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(e, AdminError::Refused(_)), "{e}");
    assert!(e.to_string().contains("below 0"), "{e}");
    r.assert_unchanged(&before, "nothing written").await;

    // Corrupt data is named, not overwritten.
    r.seed(
        "p",
        &[
            ("stock", "5x"),
            ("status", "sleeping"),
            ("per_customer", "-1"),
        ],
    )
    .await;
    let before = r.dump().await;
    for result in [
        promo::adjust(
            &r.ledger,
            &p,
            Adjustment {
                budget: None,
                stock: Some(1),
            },
        )
        .await
        .map(drop),
        promo::set_paused(&r.ledger, &p, true).await.map(drop),
        promo::limit(&r.ledger, &p, Some(2)).await.map(drop),
    ] {
        let e = result.unwrap_err();
        assert!(e.to_string().contains("CORRUPT"), "{e}");
    }
    r.assert_unchanged(&before, "nothing written").await;
    // promo list names an unreadable promotion and goes on.
    let o = admin(&r, &["promo", "list"]).await;
    assert_exit(&o, 0, "promo list with a corrupt promotion");
    assert!(
        stdout(&o).contains("p  UNREADABLE: field "),
        "{}",
        stdout(&o)
    );
    // delete --force removes even a corrupt hash.
    promo::delete(&r.ledger, &p, true).await.unwrap();
    assert_eq!(r.promo_field("p", "stock").await, None);
}
