//! Records at the input topic's size limit (issue 23): whatever the input
//! topic accepts gets an outcome or a dead letter, and the service never
//! exits. A generator of records up to the broker's default
//! `max.message.bytes` (1 MiB + 12) with large and many headers, a huge
//! `tracestate` and propagated header, null and empty keys and values, and
//! transactional control records; and the records of issue 23 that stopped
//! the service (defects 1 and 2), in both delivery modes.

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use crate::common::kafka::{self, Record};
use crate::common::service::{self, Fixture};
use deductor::admin::PromoSpec;
use deductor_testkit::rng::Rng;

/// The broker's default `max.message.bytes` (1 MiB + 12): the largest
/// record batch the input topic accepts.
const TOPIC_LIMIT: usize = 1_048_588;

/// One generated record: key, value, headers (name, value or null).
#[derive(Debug, Clone, Default)]
struct Gen {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Gen {
    fn size(&self) -> usize {
        let h: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len) + 8)
            .sum();
        self.key.as_ref().map_or(0, Vec::len) + self.value.as_ref().map_or(0, Vec::len) + h
    }
}

fn valid_event(n: usize) -> Vec<u8> {
    serde_json::json!({"type": "OrderPlaced", "event_id": format!("e-{n}"),
        "order_id": format!("o-{n}"), "customer_id": format!("c-{n}"),
        "occurred_at": "2026-11-29T10:00:00Z",
        "lines": [{"promotion_id": "big", "stock": 1}]})
    .to_string()
    .into_bytes()
}

fn filler(len: usize, byte: u8) -> Vec<u8> {
    vec![byte; len]
}

/// Room left for one big part of a record of `fixed` bytes, near the limit
/// (a margin for the record's and the batch's own framing).
fn room(rng: &mut Rng, fixed: usize) -> usize {
    let top = TOPIC_LIMIT - 400 - fixed;
    top - rng.below(top / 4)
}

/// The generator: `n` records of shapes drawn at random, each alone at or
/// near the input topic's limit, or many headers, or empty parts.
fn generate(seed: u64, n: usize) -> Vec<Gen> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let valid = rng.percent(50);
            let value = valid.then(|| valid_event(i));
            let mut g = Gen {
                key: Some(format!("o-{i}").into_bytes()),
                value,
                headers: Vec::new(),
            };
            match rng.below(9) {
                // A huge tracestate.
                0 => {
                    let len = room(&mut rng, g.size() + 10);
                    g.headers
                        .push(("tracestate".into(), Some(filler(len, b'a'))));
                }
                // A huge propagated header.
                1 => {
                    let len = room(&mut rng, g.size() + 16);
                    g.headers
                        .push(("x-correlation-id".into(), Some(filler(len, b'c'))));
                }
                // Any huge header.
                2 => {
                    let len = room(&mut rng, g.size() + 5);
                    g.headers.push(("x-big".into(), Some(filler(len, b'b'))));
                }
                // Many headers (thousands), small ones, with a tracestate,
                // propagated ones and nulls among them.
                3 => {
                    let count = 1_000 + rng.below(9_000);
                    for h in 0..count {
                        let name = match h % 50 {
                            0 => "tracestate".to_owned(),
                            1 => "x-correlation-id".to_owned(),
                            _ => format!("x-h{h}"),
                        };
                        let v = (h % 7 != 0).then(|| filler(rng.below(64), b'v'));
                        g.headers.push((name, v));
                    }
                }
                // A huge key.
                4 => {
                    let len = room(&mut rng, g.size());
                    g.key = Some(filler(len, b'k'));
                }
                // A huge value (invalid: far above the event limit).
                5 => {
                    let len = room(&mut rng, g.size());
                    g.value = Some(filler(len, b'{'));
                }
                // Null or empty key and value.
                6 => {
                    g.key = [None, Some(Vec::new())][rng.below(2)].clone();
                    if !valid {
                        g.value = [None, Some(Vec::new())][rng.below(2)].clone();
                    }
                }
                // A huge header name.
                7 => {
                    let len = room(&mut rng, g.size()).min(60_000);
                    let name = "n".repeat(len);
                    g.headers.push((name, Some(b"1".to_vec())));
                }
                // Everything big at once, split between key, headers, value.
                _ => {
                    let third = room(&mut rng, g.size() + 40) / 3;
                    g.key = Some(filler(third, b'k'));
                    g.headers
                        .push(("tracestate".into(), Some(filler(third / 2, b't'))));
                    g.headers
                        .push(("x-correlation-id".into(), Some(filler(third / 2, b'c'))));
                    if !valid {
                        g.value = Some(filler(third, b'x'));
                    }
                }
            }
            g
        })
        .collect()
}

fn producer(transactional: bool) -> FutureProducer {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", kafka::brokers())
        .set("message.max.bytes", "10000000")
        .set("message.timeout.ms", "60000")
        .set("linger.ms", "0");
    if transactional {
        c.set("transactional.id", kafka::unique("size-limit-writer"));
    }
    c.create().expect("creating a Kafka producer")
}

/// Produces `records` one by one to partition 0 (a transactional producer
/// commits after every few, so control records sit between them); returns
/// the offsets the topic accepted. A record the broker refuses for its size
/// is not the service's to handle and is left out.
async fn produce(topic: &str, records: &[Gen], transactional: bool) -> BTreeSet<i64> {
    let p = producer(transactional);
    let t = Duration::from_secs(30);
    if transactional {
        p.init_transactions(t).expect("init_transactions");
        p.begin_transaction().expect("begin_transaction");
    }
    let mut accepted = BTreeSet::new();
    for (i, g) in records.iter().enumerate() {
        let mut h = OwnedHeaders::new_with_capacity(g.headers.len());
        for (k, v) in &g.headers {
            h = h.insert(Header {
                key: k.as_str(),
                value: v.as_deref(),
            });
        }
        let mut r: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).partition(0).headers(h);
        if let Some(k) = &g.key {
            r = r.key(k.as_slice());
        }
        if let Some(v) = &g.value {
            r = r.payload(v.as_slice());
        }
        match p.send(r, t).await {
            Ok(d) => {
                accepted.insert(d.offset);
            }
            Err((e, _)) if deductor::kafka::publisher::too_large(&e) && !transactional => {
                eprintln!("record {i} ({} bytes) refused by the broker: {e}", g.size());
            }
            Err((e, _)) => panic!("record {i} ({} bytes): {e}", g.size()),
        }
        if transactional && i % 3 == 2 {
            let p2 = p.clone();
            tokio::task::spawn_blocking(move || p2.commit_transaction(t))
                .await
                .unwrap()
                .expect("commit_transaction");
            p.begin_transaction().expect("begin_transaction");
        }
    }
    if transactional {
        let p2 = p.clone();
        tokio::task::spawn_blocking(move || p2.commit_transaction(t))
            .await
            .unwrap()
            .expect("commit_transaction");
    }
    accepted
}

/// The input offsets an outcome or a dead letter names.
fn answered(outcomes: &[Record], dead: &[Record]) -> BTreeSet<i64> {
    let mut got: BTreeSet<i64> = kafka::sources(outcomes)
        .into_iter()
        .map(|(_, o)| o)
        .collect();
    for d in dead {
        if let Some(o) = d.headers.get("deductor.source.offset") {
            got.insert(o.parse().expect("deductor.source.offset is a number"));
        }
    }
    got
}

/// Runs the service in `mode` over `records` (produced before it starts,
/// transactionally or not) and checks that every record the topic accepted
/// is answered while the service keeps running.
async fn every_record_is_answered(
    label: &str,
    mode: &str,
    records: &[Gen],
    transactional: bool,
) -> (Vec<Record>, Vec<Record>) {
    let f = Fixture::new(label, 1).await;
    let ledger = f.ledger().await;
    let spec = PromoSpec {
        stock: Some(1_000),
        ..PromoSpec::default()
    };
    f.promo(&ledger, "big", spec).await;
    let accepted = produce(&f.topics.input, records, transactional).await;
    assert!(!accepted.is_empty(), "{label}: the topic accepted nothing");

    let mut svc = service::start(f.settings(&[
        ("kafka.delivery", mode),
        ("kafka.propagate_headers", "x-correlation-id"),
        ("kafka.transaction_interval_ms", "300"),
    ]));
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let (outcomes, dead) = loop {
        svc.assert_running().await;
        let outcomes = kafka::read_all(&f.topics.outcome).await;
        let dead = kafka::read_all(&f.topics.dlq).await;
        let got = answered(&outcomes, &dead);
        if accepted.is_subset(&got) {
            break (outcomes, dead);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{label}: offsets without an outcome or a dead letter: {:?}",
            accepted.difference(&got).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Committed past every record (a transaction's commit marker at the
    // end is never delivered, so the committed offset may stop before it).
    let last = accepted.last().copied().unwrap_or(0);
    loop {
        let c = kafka::committed(&f.topics.group, &f.topics.input, 1).await;
        if c.get(&0).copied().flatten().is_some_and(|o| o > last) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{label}: committed {c:?}, last record at {last}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    svc.assert_running().await;
    let (result, _) = svc.stop(Duration::from_secs(30)).await;
    result.unwrap_or_else(|e| panic!("{label}: the service stops cleanly: {e:#}"));

    // What deductor wrote stays bounded (docs/contract.md section 4): a
    // tracestate of at most 512 bytes, propagated values of at most 4 KiB.
    for o in &outcomes {
        let ts = o.headers.get("tracestate").map_or(0, String::len);
        let corr = o.headers.get("x-correlation-id").map_or(0, String::len);
        assert!(ts <= 512, "{label}: tracestate of {ts} bytes");
        assert!(corr <= 4096, "{label}: propagated header of {corr} bytes");
    }
    ledger.quit().await;
    f.cleanup().await;
    (outcomes, dead)
}

/// A normal event behind the huge records, in the same partition.
fn normal(n: usize) -> Gen {
    Gen {
        key: Some(format!("o-{n}").into_bytes()),
        value: Some(valid_event(n)),
        headers: vec![],
    }
}

/// Issue 23 defect 1, as it was found, in both modes: a valid event with a
/// ~1 MB `tracestate`, one with a ~1 MB propagated header, and a normal
/// event behind them in the same partition. Each gets its outcome, the huge
/// header left out and named; the service keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_event_with_a_huge_header_gets_its_outcome() {
    // The input record just fits the topic; its outcome, with deductor's
    // own headers and payload on top of a whole copy, would not.
    let big = TOPIC_LIMIT - 600;
    let records = vec![
        Gen {
            key: Some(b"o-0".to_vec()),
            value: Some(valid_event(0)),
            headers: vec![(
                "tracestate".into(),
                Some(filler(big - valid_event(0).len(), b'a')),
            )],
        },
        Gen {
            key: Some(b"o-1".to_vec()),
            value: Some(valid_event(1)),
            headers: vec![(
                "x-correlation-id".into(),
                Some(filler(big - valid_event(1).len() - 16, b'c')),
            )],
        },
        normal(2),
    ];
    for mode in ["at_least_once", "exactly_once"] {
        let label = format!("huge-valid-{mode}");
        let (outcomes, _) = every_record_is_answered(&label, mode, &records, false).await;
        for (event, header) in [("e-0", "tracestate"), ("e-1", "x-correlation-id")] {
            let o = outcomes
                .iter()
                .find(|o| o.json()["event_id"] == event)
                .unwrap_or_else(|| panic!("{label}: no outcome of {event}"));
            let noted = o.headers.get("deductor.dropped.headers");
            assert_eq!(noted.map(String::as_str), Some(header), "{label}: {event}");
            assert!(
                !o.headers.contains_key(header),
                "{label}: {event} keeps {header}"
            );
        }
    }
}

/// Issue 23 defect 2, as it was found, in both modes: the value `not json`
/// with a 1,048,400-byte header, and a normal event behind it. The dead
/// letter is sent truncated (the header cut, counted), the service keeps
/// running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_record_with_a_huge_header_is_dead_lettered() {
    let records = vec![
        Gen {
            key: None,
            value: Some(b"not json".to_vec()),
            headers: vec![("x-big".into(), Some(filler(1_048_400, b'b')))],
        },
        normal(1),
    ];
    for mode in ["at_least_once", "exactly_once"] {
        let label = format!("huge-invalid-{mode}");
        let (_, dead) = every_record_is_answered(&label, mode, &records, false).await;
        let d = dead
            .iter()
            .find(|d| d.headers.get("deductor.source.offset").map(String::as_str) == Some("0"))
            .unwrap_or_else(|| panic!("{label}: no dead letter of offset 0"));
        assert_eq!(
            d.payload.as_deref(),
            Some(b"not json".as_slice()),
            "{label}"
        );
        for (h, v) in [
            ("deductor.truncated", "true"),
            ("deductor.original.headers.dropped", "1"),
        ] {
            assert_eq!(
                d.headers.get(h).map(String::as_str),
                Some(v),
                "{label}: {h}"
            );
        }
        assert!(
            !d.headers.contains_key("x-big"),
            "{label}: the huge header is cut"
        );
    }
}

/// The class: generated records up to the input topic's limit, plain and
/// written transactionally (commit markers between them), in both modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_the_topic_accepts_is_answered() {
    let seed = std::env::var("DEDUCTOR_SIZE_LIMIT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(23);
    let records = generate(seed, 24);
    for (mode, transactional) in [("at_least_once", false), ("exactly_once", true)] {
        let label = format!("size-limit-{mode}-{seed}");
        every_record_is_answered(&label, mode, &records, transactional).await;
    }
}
