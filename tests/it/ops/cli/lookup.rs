//! `order show` and `event show`: why an order was accepted or rejected.

use super::*;

/// Issue 11: support staff answer "why was order O rejected?" with `order
/// show` and `event show`, in words and in JSON, with or without
/// `--promotion`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_and_event_show_print_records_memos_and_refund_results() {
    use crate::common::redis::{placed, refunded};
    let r = crate::common::redis::standalone().await;
    for (p, budget) in [("p1", "1000"), ("p2", "1000"), ("tight", "10")] {
        let o = admin(
            &r,
            &["promo", "set", p, "--budget", budget, "--stock", "10"],
        )
        .await;
        assert_exit(&o, 0, "promo set");
    }
    let t = 1_800_000_000;
    r.ledger
        .place(&placed(
            "e1",
            "o1",
            "c1",
            t,
            &[("p1", 100, 1), ("p2", 50, 2)],
        ))
        .await
        .unwrap();
    r.ledger
        .refund(&refunded("r1", "o1", "c1", &[("p1", Some(40), Some(0))]))
        .await
        .unwrap();
    // Rejected on its second line: the first line is released.
    r.ledger
        .place(&placed(
            "e2",
            "o2",
            "c2",
            t,
            &[("p1", 5, 1), ("tight", 500, 1)],
        ))
        .await
        .unwrap();

    let o = admin(&r, &["order", "show", "o1"]).await;
    assert_exit(&o, 0, "order show");
    let out = stdout(&o);
    assert!(out.contains("p1: deducted by event e1"), "{out}");
    assert!(
        out.contains("holds budget 60 of 100, stock 1 of 1"),
        "{out}"
    );
    assert!(out.contains("p2: deducted by event e1"), "{out}");
    let o = admin(
        &r,
        &[
            "order",
            "show",
            "o1",
            "--promotion",
            "p2",
            "--output",
            "json",
        ],
    )
    .await;
    let v = json_of(&o);
    let recs = v["records"].as_array().unwrap();
    assert_eq!(recs.len(), 1, "{v:#}");
    assert_eq!(
        (recs[0]["promotion_id"].as_str(), recs[0]["stock"].as_u64()),
        (Some("p2"), Some(2))
    );

    let o = admin(&r, &["order", "show", "o2"]).await;
    assert!(stdout(&o).contains("no record"), "{}", stdout(&o));

    let o = admin(&r, &["event", "show", "e2"]).await;
    assert_exit(&o, 0, "event show");
    let out = stdout(&o);
    assert!(out.contains("tight: rejected: budget_exceeded"), "{out}");
    assert!(out.contains("p1: rejected on another promotion"), "{out}");
    let v = json_of(&admin(&r, &["event", "show", "e2", "--output", "json"]).await);
    let reasons: Vec<_> = v["placements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["promotion_id"].as_str().unwrap(),
                m["decision"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [("p1", "released"), ("tight", "rejected")],
        "{v:#}"
    );

    // A refund's result, wherever the ledger keeps it (record field or memo key).
    let v = json_of(&admin(&r, &["event", "show", "r1", "--output", "json"]).await);
    let refunds = v["refunds"].as_array().unwrap();
    assert_eq!(refunds.len(), 1, "{v:#}");
    assert_eq!(refunds[0]["promotion_id"], "p1");
    assert_eq!(refunds[0]["result"], "applied");
    assert_eq!(
        (refunds[0]["budget"].as_u64(), refunds[0]["stock"].as_u64()),
        (Some(40), Some(0))
    );

    let v = json_of(
        &admin(
            &r,
            &[
                "event",
                "show",
                "e1",
                "--promotion",
                "p1",
                "--output",
                "json",
            ],
        )
        .await,
    );
    assert_eq!(v["records"][0]["order_id"], "o1", "{v:#}");
    // A forced replace starts a new incarnation: the order's record is from the old one.
    let o = admin(
        &r,
        &[
            "promo",
            "set",
            "p2",
            "--stock",
            "10",
            "--force",
            "--discard-outstanding",
        ],
    )
    .await;
    assert_exit(&o, 0, "promo set --force --discard-outstanding");
    let o = admin(&r, &["order", "show", "o1", "--promotion", "p2"]).await;
    assert!(
        stdout(&o).contains("taken from a replaced incarnation"),
        "{}",
        stdout(&o)
    );
    let o = admin(&r, &["event", "show", "never-seen"]).await;
    assert!(stdout(&o).contains("nothing stored"), "{}", stdout(&o));
    assert_exit(
        &admin(&r, &["order", "show", "bad:id"]).await,
        2,
        "an invalid order id",
    );
}
