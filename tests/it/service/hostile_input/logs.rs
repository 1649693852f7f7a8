//! Issue 23 defect 7: the log never echoes producer input without bound.
//! Huge `type`, `occurred_at` and keys give lines of a bounded length; an
//! invalid-event flood is sampled (a few lines per second, the rest
//! counted in a "suppressed" line); an invalid event's span names its
//! `event_id` when it can be read.

use std::time::Duration;

use crate::common::kafka::{self, Raw};
use crate::common::service::{self, Fixture};

/// The longest log line these records may cause: the fixed text of a line
/// and its fields, with every producer-controlled string capped.
const MAX_LINE: usize = 4_096;

fn event(kind: &str, occurred_at: &str, event_id: &str) -> Vec<u8> {
    serde_json::json!({"type": kind, "event_id": event_id, "order_id": "o-log",
        "customer_id": "c-1", "occurred_at": occurred_at,
        "lines": [{"promotion_id": "p", "stock": 1}]})
    .to_string()
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_bounded_and_invalid_event_warnings_are_sampled() {
    let f = Fixture::new("logs", 1).await;
    let t = "T".repeat(60_000);
    let at = "9".repeat(60_000);
    let mut raws = vec![
        Raw {
            key: Some(b"o-log".to_vec()),
            payload: Some(event(&t, "2026-11-29T10:00:00Z", "e-type")),
            ..Raw::default()
        },
        Raw {
            key: Some(b"o-log".to_vec()),
            payload: Some(event("OrderPlaced", &at, "e-time")),
            ..Raw::default()
        },
        Raw {
            key: Some(vec![b'k'; 500_000]),
            payload: Some(b"not json".to_vec()),
            ..Raw::default()
        },
    ];
    // A flood of one kind.
    raws.extend((0..400).map(|i| Raw {
        key: Some(format!("o-{i}").into_bytes()),
        payload: Some(b"not json".to_vec()),
        ..Raw::default()
    }));
    kafka::produce_raw_with(&kafka::large_producer(), &f.topics.input, &raws).await;

    let env = f.env(&[("log.format", "json")]);
    let mut child = service::spawn(&env, &["run"]);
    kafka::read_until(&f.topics.dlq, Duration::from_secs(90), |r| {
        r.len() >= raws.len()
    })
    .await;
    // One more after the flood's second: the count of what was suppressed
    // is logged with it.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    kafka::produce_raw(
        &f.topics.input,
        &[Raw {
            key: Some(b"o-last".to_vec()),
            payload: Some(b"not json".to_vec()),
            ..Raw::default()
        }],
    )
    .await;
    kafka::wait_committed_to_end(&f.topics.group, &f.topics.input, 1, Duration::from_secs(60))
        .await;
    child.assert_running();
    let status = tokio::task::block_in_place(|| child.terminate(Duration::from_secs(30)));
    assert!(status.success(), "exit 0 on SIGTERM: {status}");

    let log = std::fs::read_to_string(&child.log).unwrap();
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    assert!(
        longest <= MAX_LINE,
        "a log line of {longest} bytes: {}",
        log.lines()
            .find(|l| l.len() == longest)
            .unwrap_or("")
            .chars()
            .take(300)
            .collect::<String>()
    );
    let warned = log.matches("invalid event: dead-lettered").count();
    assert!(
        warned < 100,
        "{warned} invalid-event lines for {} invalid events: not sampled",
        raws.len() + 1
    );
    // What was left out is counted: in a line of its own, or on the next
    // line of the kind.
    let counted: u64 = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == "not_json")
        .map(|v| {
            v["suppressed"].as_u64().unwrap_or(0) + v["suppressed_before"].as_u64().unwrap_or(0)
        })
        .sum();
    // The 400 of the flood, the huge key's and the last one.
    let not_json = 402u64;
    assert!(
        counted > 0 && counted + warned as u64 >= not_json,
        "{counted} suppressed + {warned} logged of {not_json}; log:\n{}",
        child.log_tail(20)
    );
    // The span of an invalid event names its event id when it is readable.
    let kind = deductor::domain::event::parse(raws[0].payload.as_deref().unwrap())
        .unwrap_err()
        .kind
        .as_str();
    let typed = log
        .lines()
        .find(|l| l.contains(&format!("\"kind\":\"{kind}\"")))
        .unwrap_or_else(|| panic!("no line about the {kind} event"));
    assert!(
        typed.contains("\"event_id\":\"e-type\""),
        "{}",
        typed.chars().take(600).collect::<String>()
    );
    f.cleanup().await;
}
