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
    assert!(
        !r.headers.contains_key("deductor.error.kind"),
        "the dead-lettering's own headers stay on the dead letter: {:?}",
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

/// The headers a dead letter of the service carries, for a record read from
/// `input` at 0@`offset`, after `original` (the producer's own).
fn dead_letter_headers<'a>(
    input: &'a str,
    offset: &'a str,
    original: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut h = original.to_vec();
    h.extend([
        ("deductor.error", "missing field `lines`"),
        ("deductor.error.kind", "missing_field"),
        ("deductor.source.topic", input),
        ("deductor.source.partition", "0"),
        ("deductor.source.offset", offset),
        ("deductor.source.timestamp", "1764410400000"),
        ("deductor.consumer.group", "deductor"),
    ]);
    h
}

/// A placement event of order `order` that parses.
fn placement(event: &str, order: &str) -> String {
    serde_json::json!({"type": "OrderPlaced", "event_id": event, "order_id": order,
        "customer_id": "c-1", "occurred_at": "2026-11-29T10:00:00Z",
        "lines": [{"promotion_id": "rd", "stock": 1}]})
    .to_string()
}

/// Issue 23: `dlq replay` run twice sent every dead letter twice. Each
/// replay is now remembered (in Redis, beside the ledger): a second run
/// reports the dead letter as already redriven and sends nothing, a dry run
/// says so too, and `--again` sends it anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_sends_each_dead_letter_once_unless_asked_again() {
    let f = Fixture::new("redrive-once", 1).await;
    let input = f.topics.input.clone();
    let valid = placement("e-once", "o-once");
    let headers = dead_letter_headers(&input, "3", &[("x-original", "keep-me")]);
    produce_with_headers(&f.topics.dlq, 0, "o-once", &valid, &headers).await;
    let sent = || async { kafka::end_offsets(&f.topics.input).await[&0] };

    let o = deductor(&f.env(&[]), &["dlq", "replay", "--all"]).await;
    assert_exit(&o, 0, "first replay");
    assert!(
        stdout(&o).contains("0@0 key o-once: redriven to"),
        "{}",
        stdout(&o)
    );
    assert_eq!(sent().await, 1, "the first replay sends it");

    let o = deductor(&f.env(&[]), &["dlq", "replay", "--all", "--output", "json"]).await;
    assert_exit(&o, 0, "second replay");
    let v = json_of(&o);
    assert_eq!(
        (v["redriven"].as_u64(), v["already_redriven"].as_u64()),
        (Some(0), Some(1)),
        "{v:#}"
    );
    assert_eq!(v["records"][0]["result"], "already_redriven", "{v:#}");
    let note = v["records"][0]["detail"].as_str().unwrap_or_default();
    assert!(
        note.contains(&format!("{input} 0@0")),
        "the note names where it went: {v:#}"
    );
    assert_eq!(sent().await, 1, "a second replay sends nothing");

    let o = deductor(&f.env(&[]), &["dlq", "replay", "--all", "--dry-run"]).await;
    assert_exit(&o, 0, "dry run");
    assert!(
        stdout(&o).contains("0@0 key o-once: already redriven"),
        "{}",
        stdout(&o)
    );

    let o = deductor(&f.env(&[]), &["dlq", "replay", "--all", "--again"]).await;
    assert_exit(&o, 0, "replay --again");
    assert!(stdout(&o).contains("1 redriven to"), "{}", stdout(&o));
    assert_eq!(sent().await, 2, "--again sends it once more");
    let o = deductor(&f.env(&[]), &["dlq", "replay", "--all"]).await;
    assert_exit(&o, 0, "replay after --again");
    assert_eq!(sent().await, 2);
    f.cleanup().await;
}

/// Issue 23: a redriven record kept the `deductor.*` headers of its
/// dead-lettering, so a record dead-lettered again carried two sets (two
/// `deductor.error.kind`, two `deductor.source.offset`, ...). A replay now
/// keeps the producer's headers only, plus one `deductor.redrive.*` set:
/// dead-lettered twice, a record carries one set of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_dead_lettered_twice_carries_one_set_of_deductor_headers() {
    let f = Fixture::new("redrive-headers", 1).await;
    let input = f.topics.input.clone();
    // Dead-lettered once already, after an earlier redrive of another dead letter.
    let mut original = vec![
        ("x-original", "keep-me"),
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
    ];
    original.extend([
        ("deductor.redrive.topic", "older.dlq"),
        ("deductor.redrive.partition", "4"),
        ("deductor.redrive.offset", "44"),
        ("deductor.redrive.time", "2026-11-28T10:00:00.000Z"),
    ]);
    let headers = dead_letter_headers(&input, "7", &original);
    produce_with_headers(&f.topics.dlq, 0, "o-twice", "not json", &headers).await;

    let o = deductor(
        &f.env(&[]),
        &["dlq", "replay", "--all", "--include-invalid"],
    )
    .await;
    assert_exit(&o, 0, "replay");
    let redriven = kafka::read_n(&f.topics.input, 1, Duration::from_secs(30)).await;
    let names: Vec<&str> = redriven[0]
        .header_list
        .iter()
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "x-original",
            "traceparent",
            "deductor.redrive.topic",
            "deductor.redrive.partition",
            "deductor.redrive.offset",
            "deductor.redrive.time"
        ],
        "the producer's headers, then one provenance set: {:?}",
        redriven[0].header_list
    );
    assert_eq!(redriven[0].headers["deductor.redrive.topic"], f.topics.dlq);
    assert_eq!(redriven[0].headers["deductor.redrive.offset"], "0");

    // The service dead-letters it again: one set of deductor.* headers.
    let svc = service::start(f.settings(&[]));
    let dead = kafka::read_n(&f.topics.dlq, 2, Duration::from_secs(60)).await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.expect("the service stops cleanly");
    let again = dead
        .iter()
        .find(|r| r.offset == 1)
        .expect("a second dead letter");
    let mut seen = std::collections::BTreeMap::new();
    for (k, _) in &again.header_list {
        *seen.entry(k.as_str()).or_insert(0) += 1;
    }
    assert!(
        seen.values().all(|n| *n == 1),
        "every header once: {:?}",
        again.header_list
    );
    assert_eq!(again.headers["deductor.source.topic"], input);
    assert_eq!(again.headers["deductor.redrive.offset"], "0");
    assert_eq!(again.headers["x-original"], "keep-me");

    // Redriven again from there: still one set, naming the second dead letter.
    let o = deductor(
        &f.env(&[]),
        &["dlq", "replay", "--from-offset", "1", "--include-invalid"],
    )
    .await;
    assert_exit(&o, 0, "second replay");
    let all = kafka::read_n(&f.topics.input, 2, Duration::from_secs(30)).await;
    let second = all.iter().find(|r| r.offset == 1).unwrap();
    let deductor_headers: Vec<&(String, String)> = second
        .header_list
        .iter()
        .filter(|(k, _)| k.starts_with("deductor."))
        .collect();
    assert_eq!(deductor_headers.len(), 4, "{:?}", second.header_list);
    assert_eq!(second.headers["deductor.redrive.offset"], "1");
    assert_eq!(second.headers["x-original"], "keep-me");
    f.cleanup().await;
}

/// Runs `deductor <args>` to its end; returns its output and its peak
/// resident memory in KiB, read from `VmHWM` in /proc while it runs (its
/// own since its exec; `wait4`'s `ru_maxrss` would count the test
/// process's memory, which the child had until its exec).
async fn deductor_peak_kib(env: &[(String, String)], args: &[&str]) -> (Output, u64) {
    let mut c = service::command(env);
    c.args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    tokio::task::spawn_blocking(move || {
        let child = c.spawn().expect("running deductor");
        let status = format!("/proc/{}/status", child.id());
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = done.clone();
        let watcher = std::thread::spawn(move || {
            let mut peak = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let hwm = std::fs::read_to_string(&status).ok().and_then(|s| {
                    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?.to_owned();
                    line.split_whitespace().nth(1)?.parse::<u64>().ok()
                });
                match hwm {
                    Some(kib) => peak = peak.max(kib),
                    // Exited: its memory is gone.
                    None if peak > 0 => break,
                    None => {}
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            peak
        });
        let o = child.wait_with_output().expect("running deductor");
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (o, watcher.join().unwrap())
    })
    .await
    .unwrap()
}

/// Issue 23: `dlq list --limit N` read the whole topic (every record held
/// in memory) before it kept the first N. Here the first two dead letters
/// are small and 60 records of 900 kB follow them: `--limit 2` must cost
/// what `--to-offset 1` costs, which reads the same two records and
/// nothing more, not the 54 MB behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_with_a_limit_stops_reading_once_it_has_enough() {
    let f = Fixture::new("dlq-limit", 1).await;
    let input = f.topics.input.clone();
    for (i, key) in ["o-1", "o-2"].iter().enumerate() {
        let offset = i.to_string();
        let headers = dead_letter_headers(&input, &offset, &[]);
        produce_with_headers(&f.topics.dlq, 0, key, "not json", &headers).await;
    }
    let big: Vec<kafka::Raw> = (0..60)
        .map(|i| kafka::Raw {
            key: Some(format!("o-big-{i}").into_bytes()),
            payload: Some(vec![b'x'; 900_000]),
            partition: Some(0),
            headers: vec![("deductor.error.kind".into(), "not_json".into())],
            ..kafka::Raw::default()
        })
        .collect();
    kafka::produce_raw_with(&kafka::large_producer(), &f.topics.dlq, &big).await;

    let env = f.env(&[]);
    let (bounded, bounded_kib) = deductor_peak_kib(
        &env,
        &["dlq", "list", "--to-offset", "1", "--output", "json"],
    )
    .await;
    assert_exit(&bounded, 0, "dlq list --to-offset 1");
    let (limited, limited_kib) =
        deductor_peak_kib(&env, &["dlq", "list", "--limit", "2", "--output", "json"]).await;
    assert_exit(&limited, 0, "dlq list --limit 2");
    let listed = json_of(&limited);
    let at: Vec<i64> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["offset"].as_i64().unwrap())
        .collect();
    assert_eq!(at, [0, 1], "the first two: {listed:#}");
    assert_eq!(listed, json_of(&bounded), "the same two records");
    // The 54 MB behind them stay unread (librdkafka prefetches at most
    // about 1 MiB per partition, and one fetch of a 900 kB record).
    assert!(
        limited_kib < bounded_kib + 20 * 1024,
        "--limit 2 peaked at {limited_kib} KiB, --to-offset 1 at {bounded_kib} KiB"
    );
    f.cleanup().await;
}

/// Replay keeps its notes in Redis: without Redis it sends nothing and
/// exits 3 (a dependency out of reach), naming Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_without_redis_sends_nothing_and_exits_3() {
    let f = Fixture::new("redrive-noredis", 1).await;
    let headers = dead_letter_headers(&f.topics.input, "0", &[]);
    produce_with_headers(
        &f.topics.dlq,
        0,
        "o-nr",
        &placement("e-nr", "o-nr"),
        &headers,
    )
    .await;
    let url = format!("redis://127.0.0.1:{}", free_port());
    let o = deductor(
        &f.env(&[("redis.url", &url), ("redis.connect_timeout_ms", "500")]),
        &["dlq", "replay", "--all"],
    )
    .await;
    assert_exit(&o, 3, "replay without Redis");
    assert!(stderr(&o).contains("redis"), "{}", stderr(&o));
    assert_eq!(
        kafka::end_offsets(&f.topics.input).await[&0],
        0,
        "nothing sent"
    );
    f.cleanup().await;
}
