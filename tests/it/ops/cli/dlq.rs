//! The commands that write to Kafka: `publish`, and `dlq list/show/replay`.

use std::time::Duration;

use super::*;
use crate::common::kafka;
use crate::common::service::{self, Fixture};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_produces_each_line_keyed_by_order_id() {
    let f = Fixture::new("publish", 3).await;
    let lines = [
        r#"{"type":"OrderPlaced","event_id":"e1","order_id":"o-1","customer_id":"c","occurred_at":"2026-11-29T10:00:00Z","lines":[{"promotion_id":"p"}]}"#,
        r#"{"type":"OrderRefunded","event_id":"e2","order_id":"o-2","customer_id":"c","occurred_at":"2026-11-29T10:00:00Z","lines":[{"promotion_id":"p"}]}"#,
        "not json, sent as it is",
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    std::fs::write(
        &file,
        format!("{}\n\n{}\n{}\n", lines[0], lines[1], lines[2]),
    )
    .unwrap();
    let o = deductor(&f.env(&[]), &["publish", file.to_str().unwrap()]).await;
    assert!(o.status.success(), "publish: {}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("published 3 events to {}", f.topics.input)),
        "{}",
        stdout(&o)
    );

    let got = kafka::read_n(&f.topics.input, 3, Duration::from_secs(30)).await;
    let mut got: Vec<(Option<String>, String)> = got
        .iter()
        .map(|r| {
            (
                r.key_str(),
                String::from_utf8(r.payload.clone().unwrap()).unwrap(),
            )
        })
        .collect();
    got.sort_by(|a, b| a.1.cmp(&b.1));
    let mut want = vec![
        (Some("o-1".to_owned()), lines[0].to_owned()),
        (Some("o-2".to_owned()), lines[1].to_owned()),
        (None, lines[2].to_owned()),
    ];
    want.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(got, want, "each line, unchanged, keyed by its order_id");

    // --topic names another topic.
    let o = deductor(
        &f.env(&[]),
        &["publish", file.to_str().unwrap(), "--topic", &f.topics.dlq],
    )
    .await;
    assert!(o.status.success(), "publish --topic: {}", stderr(&o));
    kafka::read_n(&f.topics.dlq, 3, Duration::from_secs(30)).await;
    f.cleanup().await;
}

/// Produces one record with headers to `partition` of `topic`.
async fn produce_with_headers(
    topic: &str,
    partition: i32,
    key: &str,
    payload: &str,
    headers: &[(&str, &str)],
) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::FutureRecord;
    let mut h = OwnedHeaders::new();
    for (k, v) in headers {
        h = h.insert(Header {
            key: k,
            value: Some(v.as_bytes()),
        });
    }
    let record = FutureRecord::to(topic)
        .partition(partition)
        .key(key)
        .payload(payload)
        .headers(h);
    kafka::producer()
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .expect("producing a dead letter");
}

/// Issue 11: `dlq list | show | replay`. A dead letter that parses now is
/// redriven to the input topic (key and headers kept, provenance added,
/// counted in a metric) and then decided by the running service; a still
/// invalid one is skipped; --dry-run sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_redriven_with_provenance_and_then_decided() {
    let f = Fixture::new("redrive", 2).await;
    let ledger = f.ledger().await;
    f.promo(
        &ledger,
        "rd",
        deductor::admin::PromoSpec {
            stock: Some(5),
            ..Default::default()
        },
    )
    .await;
    let valid = serde_json::json!({"type": "OrderPlaced", "event_id": "e-rd", "order_id": "o-rd",
        "customer_id": "c-1", "occurred_at": "2026-11-29T10:00:00Z",
        "lines": [{"promotion_id": "rd", "stock": 1}]})
    .to_string();
    let input = f.topics.input.clone();
    let dead = |kind: &'static str| {
        vec![
            ("deductor.error", kind),
            ("deductor.error.kind", kind),
            ("deductor.source.topic", input.as_str()),
            ("deductor.source.partition", "0"),
            ("deductor.source.offset", "41"),
            ("x-original", "keep-me"),
        ]
    };
    // Dead-lettered by an older, stricter parser: it parses now.
    produce_with_headers(&f.topics.dlq, 0, "o-rd", &valid, &dead("missing_field")).await;
    produce_with_headers(&f.topics.dlq, 0, "o-bad", "not json", &dead("not_json")).await;

    let o = deductor(&f.env(&[]), &["dlq", "list", "--output", "json"]).await;
    assert_exit(&o, 0, "dlq list");
    let all = json_of(&o);
    assert_eq!(all.as_array().unwrap().len(), 2, "{all:#}");
    assert_eq!(all[0]["offset"], 0);
    assert_eq!(all[0]["parse"]["valid"], true, "{all:#}");
    assert_eq!(all[1]["kind"], "not_json");
    let o = deductor(&f.env(&[]), &["dlq", "list", "--kind", "not_json"]).await;
    let out = stdout(&o);
    assert!(out.contains("0@1") && !out.contains("0@0"), "{out}");
    let o = deductor(
        &f.env(&[]),
        &[
            "dlq",
            "list",
            "--partition",
            "0",
            "--from-offset",
            "1",
            "--to-offset",
            "1",
            "--output",
            "json",
        ],
    )
    .await;
    assert_eq!(json_of(&o).as_array().unwrap().len(), 1);
    let o = deductor(
        &f.env(&[]),
        &[
            "dlq",
            "list",
            "--since",
            "2000-01-01T00:00:00Z",
            "--until",
            "2001-01-01T00:00:00Z",
            "--output",
            "json",
        ],
    )
    .await;
    assert_eq!(
        json_of(&o).as_array().unwrap().len(),
        0,
        "a time range before the records"
    );
    let hour_ago = (chrono::Utc::now().timestamp() - 3600).to_string();
    let o = deductor(
        &f.env(&[]),
        &["dlq", "list", "--since", &hour_ago, "--output", "json"],
    )
    .await;
    assert_eq!(
        json_of(&o).as_array().unwrap().len(),
        2,
        "a time range around the records"
    );
    let o = deductor(
        &f.env(&[]),
        &["dlq", "show", "--partition", "0", "--offset", "0"],
    )
    .await;
    assert_exit(&o, 0, "dlq show");
    assert!(
        stdout(&o).contains("parses now: OrderPlaced e-rd of order o-rd"),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("header x-original: keep-me"),
        "{}",
        stdout(&o)
    );

    let o = deductor(&f.env(&[]), &["dlq", "replay"]).await;
    assert_exit(&o, 2, "replay without a filter or --all");
    let o = deductor(
        &f.env(&[]),
        &["dlq", "replay", "--all", "--dry-run", "--output", "json"],
    )
    .await;
    assert_exit(&o, 0, "dry run");
    let v = json_of(&o);
    assert_eq!(
        (
            v["would_redrive"].as_u64(),
            v["skipped"].as_u64(),
            v["redriven"].as_u64()
        ),
        (Some(1), Some(1), Some(0)),
        "{v:#}"
    );
    assert!(
        kafka::end_offsets(&f.topics.input)
            .await
            .values()
            .all(|o| *o == 0),
        "a dry run sends nothing"
    );

    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("dlq.prom");
    let o = deductor(
        &f.env(&[]),
        &[
            "dlq",
            "replay",
            "--all",
            "--metrics-file",
            metrics.to_str().unwrap(),
        ],
    )
    .await;
    assert_exit(&o, 0, "replay");
    let out = stdout(&o);
    assert!(out.contains("0@0 key o-rd: redriven to"), "{out}");
    assert!(
        out.contains("0@1 key o-bad: skipped, still invalid: not_json"),
        "{out}"
    );
    let prom = std::fs::read_to_string(&metrics).unwrap();
    for line in [
        "deductor_dlq_redrives_total{result=\"redriven\"} 1",
        "deductor_dlq_redrives_total{result=\"skipped\"} 1",
    ] {
        assert!(prom.contains(line), "{line} in {prom}");
    }
    let redriven = kafka::read_n(&f.topics.input, 1, Duration::from_secs(30)).await;
    let r = &redriven[0];
    assert_eq!(r.key_str().as_deref(), Some("o-rd"));
    assert_eq!(r.json()["event_id"], "e-rd");
    for (k, v) in [
        ("x-original", "keep-me"),
        ("deductor.error.kind", "missing_field"),
        ("deductor.redrive.topic", f.topics.dlq.as_str()),
        ("deductor.redrive.partition", "0"),
        ("deductor.redrive.offset", "0"),
    ] {
        assert_eq!(
            r.headers.get(k).map(String::as_str),
            Some(v),
            "header {k}: {:?}",
            r.headers
        );
    }
    assert!(
        r.headers.contains_key("deductor.redrive.time"),
        "{:?}",
        r.headers
    );

    // The running service decides it.
    let svc = service::start(f.settings(&[]));
    let out = kafka::read_n(&f.topics.outcome, 1, Duration::from_secs(60)).await;
    assert_eq!(
        out[0].json()["type"],
        "DeductAccepted",
        "{:?}",
        out[0].json()
    );
    assert_eq!(out[0].json()["event_id"], "e-rd");
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");
    assert_eq!(
        deductor::admin::promo_show(&ledger, &deductor::domain::event::Id::parse("rd").unwrap())
            .await
            .unwrap()
            .unwrap()
            .stock,
        Some(4)
    );
    f.cleanup().await;
}
