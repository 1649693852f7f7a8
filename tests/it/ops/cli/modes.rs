//! Every command in every delivery mode (issue 23): `run --until-drained`
//! on an empty topic, on a transactional input (its last offset a commit
//! marker) and on a group already at the end; `publish`, `dlq replay`,
//! `check` and `audit` with `kafka.delivery` set to each value.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use super::*;
use crate::common::kafka;
use crate::common::service::{self, Fixture};

const MODES: [&str; 2] = ["at_least_once", "exactly_once"];

/// How long a `run --until-drained` with nothing (or a few events) to do
/// may take: start-up, the group join and a rebalance, with room to spare.
const DRAINED_WITHIN: Duration = Duration::from_secs(60);

fn event(id: &str, order: &str) -> String {
    serde_json::json!({"type": "OrderPlaced", "event_id": id, "order_id": order,
        "customer_id": "c-1", "occurred_at": "2026-11-29T10:00:00Z",
        "lines": [{"promotion_id": "md", "stock": 1}]})
    .to_string()
}

/// `deductor run --until-drained` exits 0 within [`DRAINED_WITHIN`]
/// (killed and failed otherwise); returns its log.
async fn run_until_drained(env: &[(String, String)], what: &str) -> String {
    let mut child = service::spawn(env, &["run", "--until-drained"]);
    let status = tokio::task::spawn_blocking(move || {
        let s = child.wait(DRAINED_WITHIN);
        let log = child.log_tail(30);
        (s, log, child)
    })
    .await
    .unwrap();
    let (status, log, _child) = status;
    let status = status.unwrap_or_else(|| {
        panic!("{what}: run --until-drained still running after {DRAINED_WITHIN:?}; log:\n{log}")
    });
    assert!(status.success(), "{what}: exit {status}; log:\n{log}");
    log
}

/// Writes `lines` to `topic` with a transactional producer, one
/// transaction: the partition's last offset is the commit marker.
async fn produce_transactionally(topic: &str, lines: &[(String, String)]) {
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka::brokers())
        .set("transactional.id", kafka::unique("txn-writer"))
        .create()
        .expect("a transactional producer");
    let t = Duration::from_secs(30);
    p.init_transactions(t).expect("init_transactions");
    p.begin_transaction().expect("begin_transaction");
    for (key, value) in lines {
        let r = FutureRecord::to(topic).partition(0).key(key).payload(value);
        p.send(r, t).await.map_err(|(e, _)| e).expect("produce");
    }
    let p2 = p.clone();
    tokio::task::spawn_blocking(move || p2.commit_transaction(t))
        .await
        .unwrap()
        .expect("commit_transaction");
}

/// Issue 23 defect 3: `run --until-drained` exits when nothing is left, in
/// both modes: on an empty topic, on a transactional input whose last
/// offset is a commit marker (a first run, which decides the events), and
/// again on the group already at the end of that input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_drained_exits_on_empty_transactional_and_caught_up_inputs() {
    for mode in MODES {
        let f = Fixture::new(&format!("drained-{mode}"), 1).await;
        let ledger = f.ledger().await;
        f.promo(
            &ledger,
            "md",
            deductor::admin::PromoSpec {
                stock: Some(10),
                ..Default::default()
            },
        )
        .await;
        let env = f.env(&[("kafka.delivery", mode)]);

        // An empty topic: nothing to do.
        run_until_drained(&env, &format!("{mode}: empty topic")).await;

        // A transactional input: the last offset is a control record.
        let lines: Vec<(String, String)> = (0..3)
            .map(|i| {
                (
                    format!("o-{i}"),
                    event(&format!("e-{i}"), &format!("o-{i}")),
                )
            })
            .collect();
        produce_transactionally(&f.topics.input, &lines).await;
        run_until_drained(&env, &format!("{mode}: transactional input")).await;
        let out = kafka::read_n(&f.topics.outcome, 3, Duration::from_secs(30)).await;
        assert!(
            out.iter().all(|r| r.json()["type"] == "DeductAccepted"),
            "{mode}: three accepted outcomes"
        );

        // The same group again, already at the end.
        run_until_drained(&env, &format!("{mode}: caught-up group")).await;
        assert_eq!(
            kafka::read_all(&f.topics.outcome).await.len(),
            3,
            "{mode}: nothing decided twice"
        );
        ledger.quit().await;
        f.cleanup().await;
    }
}

/// Issue 23 defect 4: `publish` and `dlq replay` work with
/// `kafka.delivery = "exactly_once"` (and `at_least_once`), and so do
/// `check` and `audit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_replay_check_and_audit_work_in_every_delivery_mode() {
    for mode in MODES {
        let f = Fixture::new(&format!("cmd-{mode}"), 1).await;
        let env = f.env(&[("kafka.delivery", mode)]);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("events.jsonl");
        std::fs::write(&file, format!("{}\n", event("e-p", "o-p"))).unwrap();
        let o = deductor(&env, &["publish", file.to_str().unwrap()]).await;
        assert_exit(&o, 0, &format!("{mode}: publish"));
        kafka::read_n(&f.topics.input, 1, Duration::from_secs(30)).await;

        // A dead letter that parses now, redriven.
        let headers = vec![
            ("deductor.error.kind".to_owned(), "missing_field".to_owned()),
            ("deductor.source.topic".to_owned(), f.topics.input.clone()),
            ("deductor.source.partition".to_owned(), "0".to_owned()),
            ("deductor.source.offset".to_owned(), "7".to_owned()),
        ];
        kafka::produce_raw(
            &f.topics.dlq,
            &[kafka::Raw {
                key: Some(b"o-r".to_vec()),
                payload: Some(event("e-r", "o-r").into_bytes()),
                partition: Some(0),
                headers,
                ..kafka::Raw::default()
            }],
        )
        .await;
        let o = deductor(&env, &["dlq", "replay", "--all"]).await;
        assert_exit(&o, 0, &format!("{mode}: dlq replay"));
        assert!(stdout(&o).contains("redriven to"), "{mode}: {}", stdout(&o));
        kafka::read_n(&f.topics.input, 2, Duration::from_secs(30)).await;

        let o = deductor(&env, &["check"]).await;
        assert_exit(&o, 0, &format!("{mode}: check"));
        let o = deductor(&env, &["audit"]).await;
        assert_exit(&o, 0, &format!("{mode}: audit"));
        f.cleanup().await;
    }
}
