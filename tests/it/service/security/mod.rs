//! Security against the real services: the pipeline over Kafka SASL/SCRAM
//! (SASL_PLAINTEXT on the dev-stack's 9094) and SASL_SSL (9095, the
//! dev-stack's own CA), configured only through the `kafka.consumer.*` /
//! `kafka.producer.*` pass-through; a wrong password is a fatal, clear error
//! that never shows the password; a least-privilege Redis ACL user the
//! service works with; Redis over TLS with a CA file.
//!
//! - `kafka_sasl`: SASL/SCRAM and SASL_SSL, and wrong passwords;
//! - `redis_acl`: the least-privilege Redis user, rule by rule, also on
//!   the Cluster;
//! - `redis_tls`: a private Redis (TLS or not) and the service over TLS;
//! - here: the round trip through the service that each of them runs.

mod hardening;
mod kafka_sasl;
mod redis_acl;
mod redis_tls;

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

/// A password that is not the listener's and that no log would contain by
/// chance.
fn wrong_password() -> String {
    format!("not-the-secret-{:016x}", rand::random::<u64>())
}
