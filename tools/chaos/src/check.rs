//! The checker: reads the input, outcome and dead-letter topics, the group's
//! committed offsets and Redis, and prints the figures of the run. Every
//! figure marked "must be 0" is a promise of the contract; the check fails
//! when one is not 0.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use deductor::config::RedisSettings;
use deductor::domain::event::{self, Event, Id};
use deductor::domain::keys::Keys;
use deductor::ledger::Ledger;
use deductor_testkit::topics::{self, Read};
use fred::prelude::*;
use futures::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::kafka;
use crate::model::{self, LineState, Order};
use crate::operator;
use crate::workload::{read_marker, Promo};

/// Where a run's data lives (`run.json`), so a run can be checked again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunInfo {
    pub brokers: String,
    pub input_topic: String,
    pub outcome_topic: String,
    pub dlq_topic: String,
    pub group: String,
    pub redis_url: String,
    pub key_prefix: String,
}

/// The figures, in print order: (name, value, promised zero).
#[derive(Debug, Default, Serialize)]
pub struct Figures {
    pub rows: Vec<(String, i64, bool)>,
    pub histogram_per_record: BTreeMap<String, i64>,
    pub histogram_per_event: BTreeMap<String, i64>,
    pub dead_letter_reasons: BTreeMap<String, i64>,
    pub decisions: BTreeMap<String, i64>,
    pub ledger: Vec<LedgerRow>,
    pub offsets: Vec<(i32, i64, i64)>,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct LedgerRow {
    pub promotion: String,
    pub initial: (Option<i64>, Option<i64>),
    pub remaining: (Option<i64>, Option<i64>),
    pub records: (i64, i64),
    pub by_outcomes: (i64, i64),
    pub held: i64,
    pub max_per_customer: i64,
    pub per_customer: Option<i64>,
    pub ok: bool,
}

impl Figures {
    fn row(&mut self, name: &str, v: usize, zero: bool) {
        self.rows.push((name.to_owned(), v as i64, zero));
    }

    pub fn failed(&self) -> Vec<&str> {
        self.rows
            .iter()
            .filter(|(_, v, z)| *z && *v != 0)
            .map(|(n, _, _)| n.as_str())
            .collect()
    }
}

/// Evidence of each broken promise, written to `anomalies.txt`.
#[derive(Default)]
struct Evidence(BTreeMap<String, Vec<String>>);

impl Evidence {
    fn add(&mut self, what: &str, detail: String) {
        let v = self.0.entry(what.to_owned()).or_default();
        if v.len() < 50 {
            v.push(detail);
        }
    }
}

struct Input {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    parsed: Result<Event, event::InvalidEvent>,
    marker: Option<(String, bool)>,
}

fn source_of(v: &Value) -> Option<(String, i32, i64)> {
    let s = &v["source"];
    Some((
        s["topic"].as_str()?.to_owned(),
        i32::try_from(s["partition"].as_i64()?).ok()?,
        s["offset"].as_i64()?,
    ))
}

fn bucket(n: usize) -> String {
    if n >= 4 {
        "4+".to_owned()
    } else {
        n.to_string()
    }
}

/// How long reading one topic back may take.
const READ_WITHIN: Duration = Duration::from_secs(600);

pub async fn check(run: &RunInfo, promos: &[Promo], dir: &Path) -> anyhow::Result<Figures> {
    let (b, t) = (run.brokers.clone(), run.input_topic.clone());
    let inputs =
        tokio::task::spawn_blocking(move || topics::read_all(&b, &t, READ_WITHIN)).await??;
    let (b, t) = (run.brokers.clone(), run.outcome_topic.clone());
    let outcomes =
        tokio::task::spawn_blocking(move || topics::read_all(&b, &t, READ_WITHIN)).await??;
    let (b, t) = (run.brokers.clone(), run.dlq_topic.clone());
    let dlq = tokio::task::spawn_blocking(move || topics::read_all(&b, &t, READ_WITHIN)).await??;
    let (b, t, g) = (
        run.brokers.clone(),
        run.input_topic.clone(),
        run.group.clone(),
    );
    let (ends, committed) = tokio::task::spawn_blocking(move || {
        anyhow::Ok((topics::log_ends(&b, &t)?, kafka::committed(&b, &g, &t)?))
    })
    .await??;

    let mut f = Figures::default();
    let mut ev = Evidence::default();
    // The operator faults' changes: what they allow, and each promotion's
    // initial amounts in its current incarnation.
    let fx = operator::effects(promos, &operator::load(dir)?);
    let promos: HashMap<String, Promo> = promos.iter().map(|p| (p.id.clone(), p.clone())).collect();

    let inputs: Vec<Input> = inputs
        .into_iter()
        .map(|r: Read| Input {
            partition: r.partition,
            offset: r.offset,
            parsed: event::parse(&r.payload),
            marker: read_marker(&r.payload),
            key: r.key,
            payload: r.payload,
        })
        .collect();
    let valid = inputs.iter().filter(|i| i.marker.is_none()).count();
    f.row("input records", inputs.len(), false);
    f.row("  valid events", valid, false);
    f.row("  invalid events", inputs.len() - valid, false);
    f.row("outcome records", outcomes.len(), false);
    f.row("dead-letter records", dlq.len(), false);

    // Outcomes, by source and by event.
    let mut bad_outcomes = 0;
    let mut parsed_outcomes: Vec<Value> = Vec::with_capacity(outcomes.len());
    let mut by_source: HashMap<(i32, i64), Vec<usize>> = HashMap::new();
    for o in &outcomes {
        let v: Value = match serde_json::from_slice(&o.payload) {
            Ok(v) => v,
            Err(e) => {
                bad_outcomes += 1;
                ev.add(
                    "malformed outcomes",
                    format!("outcome p{} o{}: {e}", o.partition, o.offset),
                );
                continue;
            }
        };
        match source_of(&v) {
            Some((topic, p, off)) if topic == run.input_topic => by_source
                .entry((p, off))
                .or_default()
                .push(parsed_outcomes.len()),
            _ => {
                bad_outcomes += 1;
                ev.add(
                    "malformed outcomes",
                    format!("outcome without a source of the input topic: {v}"),
                );
            }
        }
        if v["remaining"].is_object() || v["lines"].is_array() {
            for l in v["lines"].as_array().into_iter().flatten() {
                for k in ["budget", "stock"] {
                    if l["remaining"][k].as_i64().is_some_and(|x| x < 0) {
                        ev.add("negative remaining in outcomes", v.to_string());
                    }
                }
            }
        }
        parsed_outcomes.push(v);
    }
    let negative_in_outcomes =
        ev.0.get("negative remaining in outcomes")
            .map_or(0, Vec::len);
    let mut dlq_by_source: HashMap<(i32, i64), Vec<&Read>> = HashMap::new();
    let mut bad_dlq = 0;
    for d in &dlq {
        let h = &d.headers;
        let src = (
            h.get("deductor.source.topic").map(String::as_str),
            h.get("deductor.source.partition")
                .and_then(|s| s.parse::<i32>().ok()),
            h.get("deductor.source.offset")
                .and_then(|s| s.parse::<i64>().ok()),
        );
        let complete = [
            "deductor.error",
            "deductor.error.kind",
            "deductor.source.timestamp",
            "deductor.consumer.group",
        ]
        .iter()
        .all(|k| h.get(*k).is_some_and(|v| !v.is_empty()));
        match src {
            (Some(t), Some(p), Some(o)) if t == run.input_topic && complete => {
                dlq_by_source.entry((p, o)).or_default().push(d)
            }
            _ => {
                bad_dlq += 1;
                ev.add(
                    "dead letters with missing headers",
                    format!("dlq p{} o{}: {:?}", d.partition, d.offset, h),
                );
            }
        }
    }

    // Lost, stray, dead letters, invalid_event outcomes.
    let (mut lost, mut valid_no_outcome, mut invalid_no_dlq, mut valid_dlq) = (0, 0, 0, 0);
    let (mut kind_mismatch, mut dlq_payload_mismatch) = (0, 0);
    let (mut invalid_outcome_missing, mut invalid_outcome_unexpected) = (0, 0);
    let mut invalid_split = 0;
    let input_sources: BTreeSet<(i32, i64)> =
        inputs.iter().map(|i| (i.partition, i.offset)).collect();
    for i in &inputs {
        let src = (i.partition, i.offset);
        let outs = by_source.get(&src).map_or(&[][..], Vec::as_slice);
        let dls = dlq_by_source.get(&src).map_or(&[][..], Vec::as_slice);
        if i.marker.is_none() {
            *f.histogram_per_record
                .entry(bucket(outs.len()))
                .or_default() += 1;
        }
        if outs.is_empty() && dls.is_empty() {
            lost += 1;
            ev.add(
                "lost",
                format!(
                    "p{} o{}: {}",
                    src.0,
                    src.1,
                    String::from_utf8_lossy(&i.payload[..i.payload.len().min(300)])
                ),
            );
        }
        match &i.marker {
            None => {
                if outs.is_empty() {
                    valid_no_outcome += 1;
                }
                if !dls.is_empty() {
                    valid_dlq += 1;
                    ev.add(
                        "valid events dead-lettered",
                        format!(
                            "p{} o{}: {:?}",
                            src.0,
                            src.1,
                            dls[0].headers.get("deductor.error")
                        ),
                    );
                }
                if let Err(e) = &i.parsed {
                    ev.add(
                        "valid events the parser refuses (generator bug)",
                        format!("p{} o{}: {e}", src.0, src.1),
                    );
                }
                for &k in outs {
                    if parsed_outcomes[k]["reason"] == "invalid_event" {
                        invalid_outcome_unexpected += 1;
                    }
                }
            }
            Some((kind, want_outcome)) => {
                if dls.is_empty() {
                    invalid_no_dlq += 1;
                    ev.add(
                        "invalid events without a dead letter",
                        format!("p{} o{} expected {kind}", src.0, src.1),
                    );
                }
                for d in dls {
                    let got = d
                        .headers
                        .get("deductor.error.kind")
                        .cloned()
                        .unwrap_or_default();
                    *f.dead_letter_reasons.entry(got.clone()).or_default() += 1;
                    if &got != kind {
                        kind_mismatch += 1;
                        ev.add(
                            "dead-letter kind differs from the expected",
                            format!(
                                "p{} o{}: expected {kind}, got {got} ({:?})",
                                src.0,
                                src.1,
                                d.headers.get("deductor.error")
                            ),
                        );
                    }
                    if d.payload != i.payload || d.key != i.key {
                        dlq_payload_mismatch += 1;
                    }
                }
                let sigs: BTreeSet<String> = outs
                    .iter()
                    .map(|&k| model::signature(&parsed_outcomes[k]))
                    .collect();
                if sigs.len() > 1 {
                    invalid_split += 1;
                }
                let wrong_reason = outs
                    .iter()
                    .any(|&k| parsed_outcomes[k]["reason"] != "invalid_event");
                if *want_outcome && outs.is_empty() {
                    invalid_outcome_missing += 1;
                    ev.add(
                        "invalid_event outcome missing",
                        format!("p{} o{} {kind}", src.0, src.1),
                    );
                }
                if (!*want_outcome && !outs.is_empty()) || wrong_reason {
                    invalid_outcome_unexpected += 1;
                    ev.add(
                        "unexpected outcome of an invalid event",
                        format!("p{} o{} {kind}: {}", src.0, src.1, parsed_outcomes[outs[0]]),
                    );
                }
            }
        }
    }
    let stray = by_source
        .keys()
        .filter(|s| !input_sources.contains(s))
        .count()
        + dlq_by_source
            .keys()
            .filter(|s| !input_sources.contains(s))
            .count();

    // One decision per event.
    let mut sigs_by_event: HashMap<String, BTreeSet<String>> = HashMap::new();
    let mut outcome_count_by_event: HashMap<String, usize> = HashMap::new();
    let mut first_outcome: HashMap<String, usize> = HashMap::new();
    let mut mismatched_event = 0;
    for i in &inputs {
        let Ok(e) = &i.parsed else { continue };
        let id = e.header().event_id.as_str();
        for &k in by_source
            .get(&(i.partition, i.offset))
            .map_or(&[][..], Vec::as_slice)
        {
            let v = &parsed_outcomes[k];
            if v["event_id"].as_str() != Some(id)
                || v["order_id"].as_str() != Some(e.header().order_id.as_str())
            {
                mismatched_event += 1;
                ev.add(
                    "outcomes naming another event than their source",
                    v.to_string(),
                );
                continue;
            }
            sigs_by_event
                .entry(id.to_owned())
                .or_default()
                .insert(model::signature(v));
            *outcome_count_by_event.entry(id.to_owned()).or_default() += 1;
            first_outcome.entry(id.to_owned()).or_insert(k);
        }
    }
    let mut split = 0;
    for (id, sigs) in &sigs_by_event {
        if sigs.len() > 1 {
            split += 1;
            ev.add("split decisions", format!("{id}: {sigs:?}"));
        }
    }
    let mut distinct_events: BTreeSet<&str> = BTreeSet::new();
    for i in &inputs {
        if let Ok(e) = &i.parsed {
            distinct_events.insert(e.header().event_id.as_str());
        }
    }
    for id in &distinct_events {
        let n = outcome_count_by_event.get(*id).copied().unwrap_or(0);
        *f.histogram_per_event.entry(bucket(n)).or_default() += 1;
    }
    for v in first_outcome.values().map(|&k| &parsed_outcomes[k]) {
        let key = match v["reason"].as_str() {
            Some(r) => format!("{} {r}", v["type"].as_str().unwrap_or("?")),
            None => v["type"].as_str().unwrap_or("?").to_owned(),
        };
        *f.decisions.entry(key).or_default() += 1;
    }

    // The per-order model.
    let mut orders: BTreeMap<String, Order> = BTreeMap::new();
    let mut order_partition: HashMap<String, i32> = HashMap::new();
    let mut seen_events: BTreeSet<String> = BTreeSet::new();
    let mut model_violations = 0;
    let mut unverifiable: BTreeSet<String> = BTreeSet::new();
    let mut by_order: BTreeMap<String, Vec<&Input>> = BTreeMap::new();
    for i in &inputs {
        if let Ok(e) = &i.parsed {
            by_order
                .entry(e.header().order_id.to_string())
                .or_default()
                .push(i);
        }
    }
    let mut wrong_partition = 0;
    for (o, evs) in &by_order {
        let order = orders.entry(o.clone()).or_default();
        for i in evs {
            let Ok(e) = &i.parsed else { continue };
            if *order_partition.entry(o.clone()).or_insert(i.partition) != i.partition {
                wrong_partition += 1;
            }
            order.customer = e.header().customer_id.to_string();
            let id = e.header().event_id.to_string();
            if !seen_events.insert(id.clone()) {
                continue; // a repeat: one decision per event covers it
            }
            let Some(&k) = first_outcome.get(&id) else {
                unverifiable.insert(o.clone());
                break;
            };
            let v = &parsed_outcomes[k];
            let problem = match e {
                Event::Placed(p) => order.place(p, v, &promos, &fx).err(),
                Event::Refunded(r) => {
                    let want = order.refund(r, v, &fx);
                    let got = model::signature(v);
                    (want != got).then(|| format!("refund expected {want}, got {got}"))
                }
            };
            if let Some(why) = problem {
                model_violations += 1;
                let history: Vec<String> = evs
                    .iter()
                    .map(|x| {
                        let id = x
                            .parsed
                            .as_ref()
                            .map(|e| e.header().event_id.to_string())
                            .unwrap_or_default();
                        let outs: Vec<String> = by_source
                            .get(&(x.partition, x.offset))
                            .map_or(&[][..], Vec::as_slice)
                            .iter()
                            .map(|&k| model::signature(&parsed_outcomes[k]))
                            .collect();
                        format!(
                            "    p{} o{} {id} {} -> {outs:?}",
                            x.partition,
                            x.offset,
                            String::from_utf8_lossy(&x.payload)
                        )
                    })
                    .collect();
                ev.add(
                    "order model violations",
                    format!("order {o}, event {id}: {why}\n{}", history.join("\n")),
                );
                unverifiable.insert(o.clone());
                break;
            }
        }
    }

    // Redis against the model.
    let settings = redis_settings(&run.redis_url, &run.key_prefix);
    let ledger = Ledger::connect(&settings)
        .await
        .context("connecting to Redis for the check")?;
    let keys = Keys::new(run.key_prefix.clone());
    let pool = ledger.pool().clone();
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (o, order) in &orders {
        if unverifiable.contains(o) {
            continue;
        }
        for p in by_order[o]
            .iter()
            .filter_map(|i| i.parsed.as_ref().ok())
            .flat_map(|e| match e {
                Event::Placed(x) => x
                    .lines
                    .iter()
                    .map(|l| l.promotion_id.to_string())
                    .collect::<Vec<_>>(),
                Event::Refunded(x) => x.lines.iter().map(|l| l.promotion_id.to_string()).collect(),
            })
            .collect::<BTreeSet<_>>()
        {
            let _ = order;
            pairs.push((o.clone(), p));
        }
    }
    let fetched: Vec<((String, String), HashMap<String, String>)> = stream::iter(pairs)
        .map(|(o, p)| {
            let pool = pool.clone();
            let key = keys.record(&Id::parse(&p).expect("id"), &Id::parse(&o).expect("id"));
            async move {
                let h: Result<HashMap<String, String>, _> = pool.hgetall(&key).await;
                h.map(|h| ((o, p), h))
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let mut record_mismatch = 0;
    let mut lost_deductions = 0;
    let mut outstanding_redis: HashMap<String, (i64, i64)> = HashMap::new();
    let mut outstanding_model: HashMap<String, (i64, i64)> = HashMap::new();
    let mut outstanding_by_gen: HashMap<(String, Option<String>), (i64, i64)> = HashMap::new();
    let mut held: HashMap<(String, String), i64> = HashMap::new(); // (promotion, customer)
    let mut accepted_by_outcomes: HashMap<String, (i64, i64)> = HashMap::new();
    for ((o, p), h) in &fetched {
        let st = orders[o].lines.get(p).cloned().unwrap_or_default();
        let get = |k: &str| h.get(k).cloned();
        let num = |k: &str| get(k).and_then(|s| s.parse::<i64>().ok()).unwrap_or(0);
        let expect: Option<BTreeMap<&str, String>> = match &st {
            LineState::None => None,
            LineState::Held {
                event,
                budget0,
                stock0,
                budget,
                stock,
            } => Some(BTreeMap::from([
                ("state", "deducted".to_owned()),
                ("event", event.clone()),
                ("budget", budget.to_string()),
                ("stock", stock.to_string()),
                ("budget0", budget0.to_string()),
                ("stock0", stock0.to_string()),
            ])),
            LineState::Reverted {
                event,
                budget0,
                stock0,
            } => {
                let mut m = BTreeMap::from([
                    ("state", "reverted".to_owned()),
                    ("budget", "0".to_owned()),
                    ("stock", "0".to_owned()),
                    ("budget0", budget0.to_string()),
                    ("stock0", stock0.to_string()),
                ]);
                if let Some(e) = event {
                    m.insert("event", e.clone());
                }
                Some(m)
            }
        };
        let got: Option<BTreeMap<&str, String>> = (!h.is_empty()).then(|| {
            h.iter()
                .filter_map(|(k, v)| {
                    ["state", "event", "budget", "stock", "budget0", "stock0"]
                        .into_iter()
                        .find(|x| x == k)
                        .map(|x| (x, v.clone()))
                })
                .collect()
        });
        if got.is_none()
            && matches!(
                st,
                LineState::Held { .. } | LineState::Reverted { event: Some(_), .. }
            )
        {
            // An accepted deduction the outcome topic announced, gone from
            // Redis (what an ungated failover to a lagging replica does).
            lost_deductions += 1;
        }
        if expect != got {
            record_mismatch += 1;
            ev.add(
                "records that differ from the outcomes",
                format!("order {o} promotion {p}: outcomes say {expect:?}, Redis has {got:?}"),
            );
        }
        if get("state").as_deref() == Some("deducted") {
            let e = outstanding_redis.entry(p.clone()).or_default();
            e.0 += num("budget");
            e.1 += num("stock");
            // Per incarnation: a forced re-seed forgets what the records of
            // the old one hold.
            let e = outstanding_by_gen
                .entry((p.clone(), get("gen")))
                .or_default();
            e.0 += num("budget");
            e.1 += num("stock");
            *held
                .entry((p.clone(), orders[o].customer.clone()))
                .or_default() += 1;
        }
        match &st {
            LineState::Held {
                budget,
                stock,
                budget0,
                stock0,
                ..
            } => {
                let e = outstanding_model.entry(p.clone()).or_default();
                e.0 += *budget as i64;
                e.1 += *stock as i64;
                let a = accepted_by_outcomes.entry(p.clone()).or_default();
                a.0 += *budget0 as i64;
                a.1 += *stock0 as i64;
            }
            LineState::Reverted {
                event: Some(_),
                budget0,
                stock0,
            } => {
                let a = accepted_by_outcomes.entry(p.clone()).or_default();
                a.0 += *budget0 as i64;
                a.1 += *stock0 as i64;
            }
            _ => {}
        }
    }
    // Refunds applied, per the outcomes (one per refund event).
    let mut refunded_by_outcomes: HashMap<String, (i64, i64)> = HashMap::new();
    for (id, &k) in &first_outcome {
        let v = &parsed_outcomes[k];
        if v["type"] != "RollbackApplied" {
            continue;
        }
        let _ = id;
        for l in v["lines"].as_array().into_iter().flatten() {
            if l["status"] == "applied" {
                let e = refunded_by_outcomes
                    .entry(s(&l["promotion_id"]))
                    .or_default();
                e.0 += l["budget"].as_i64().unwrap_or(0);
                e.1 += l["stock"].as_i64().unwrap_or(0);
            }
        }
    }

    // Counters and promotions.
    let mut counter_mismatch = 0;
    let mut above_limit = 0;
    let mut ledger_mismatch = 0;
    let mut negative = 0;
    let customers: BTreeSet<String> = orders
        .iter()
        .filter(|(o, _)| !unverifiable.contains(*o))
        .map(|(_, x)| x.customer.clone())
        .collect();
    let mut ids: Vec<&Promo> = promos.values().collect();
    ids.sort_by(|a, b| a.id.cmp(&b.id));
    for promo in ids {
        let pid = Id::parse(&promo.id).map_err(|e| anyhow::anyhow!("{e}"))?;
        let h: HashMap<String, String> = pool.hgetall(keys.promotion(&pid)).await?;
        let int = |k: &str| h.get(k).and_then(|v| v.parse::<i64>().ok());
        let current = outstanding_by_gen
            .get(&(promo.id.clone(), h.get("gen").cloned()))
            .copied()
            .unwrap_or_default();
        let mut row = LedgerRow {
            promotion: promo.id.clone(),
            initial: fx.initial.get(&promo.id).copied().unwrap_or((None, None)),
            remaining: (int("budget"), int("stock")),
            records: outstanding_redis
                .get(&promo.id)
                .copied()
                .unwrap_or_default(),
            per_customer: promo.per_customer.map(|x| x as i64),
            ok: true,
            ..LedgerRow::default()
        };
        let m = outstanding_model
            .get(&promo.id)
            .copied()
            .unwrap_or_default();
        let a = accepted_by_outcomes
            .get(&promo.id)
            .copied()
            .unwrap_or_default();
        let r = refunded_by_outcomes
            .get(&promo.id)
            .copied()
            .unwrap_or_default();
        row.by_outcomes = (a.0 - r.0, a.1 - r.1);
        let mut problems = Vec::new();
        if !promo.seeded {
            if !h.is_empty() {
                problems.push("an unseeded promotion exists".to_owned());
            }
        } else {
            for (name, init, rem, rec, cur, model, out) in [
                (
                    "budget",
                    row.initial.0,
                    row.remaining.0,
                    row.records.0,
                    current.0,
                    m.0,
                    row.by_outcomes.0,
                ),
                (
                    "stock",
                    row.initial.1,
                    row.remaining.1,
                    row.records.1,
                    current.1,
                    m.1,
                    row.by_outcomes.1,
                ),
            ] {
                if rem.is_some_and(|x| x < 0) {
                    negative += 1;
                    problems.push(format!("{name} remaining {rem:?} < 0"));
                }
                if let (Some(i), Some(x)) = (init, rem) {
                    if x > i {
                        problems.push(format!("{name} remaining {x} > initial {i}"));
                    }
                }
                // All records (every incarnation) against the model and the
                // outcomes; the current incarnation's against the promotion.
                match (init, rem) {
                    (Some(i), Some(x)) if i - x != cur || rec != model || rec != out => {
                        problems.push(format!("{name}: initial {i} - remaining {x} = {}, records of this incarnation {cur} (all {rec}), model {model}, outcomes {out}", i - x))
                    }
                    (None, None) if rec != model || rec != out => {
                        problems.push(format!("{name}: records {rec}, model {model}, outcomes {out}"))
                    }
                    (Some(_), None) | (None, Some(_)) => problems.push(format!("{name}: limit appeared or vanished")),
                    _ => {}
                }
            }
        }
        // Per-customer counters.
        let used: Vec<(String, Option<String>)> = stream::iter(customers.iter().cloned())
            .map(|c| {
                let pool = pool.clone();
                let key = keys.used(&pid, &Id::parse(&c).expect("id"));
                async move { pool.get::<Option<String>, _>(&key).await.map(|v| (c, v)) }
            })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()?;
        for (c, v) in used {
            let n = held
                .get(&(promo.id.clone(), c.clone()))
                .copied()
                .unwrap_or(0);
            row.held += n;
            row.max_per_customer = row.max_per_customer.max(n);
            let counted = v.as_deref().map(|s| s.parse::<i64>().unwrap_or(-1));
            let want = if promo.per_customer.is_some() && n > 0 {
                Some(n)
            } else {
                None
            };
            let fine =
                counted == want || (promo.per_customer.is_some() && n == 0 && counted == Some(0));
            if !fine {
                counter_mismatch += 1;
                ev.add(
                    "customer counters that differ from held orders",
                    format!("{}/{c}: counter {counted:?}, holds {n}", promo.id),
                );
            }
            if promo.per_customer.is_some_and(|l| n > l as i64) {
                above_limit += 1;
                ev.add(
                    "customers above per_customer",
                    format!("{}/{c}: holds {n}", promo.id),
                );
            }
        }
        // Records of orders the run never sent.
        let pattern = keys.record_pattern(&pid);
        let known = fetched
            .iter()
            .filter(|((_, p), h)| p == &promo.id && !h.is_empty())
            .count();
        let mut scan = pool.next().scan_buffered(pattern, Some(1000), None);
        let mut total = 0usize;
        while let Some(k) = scan.next().await {
            k?;
            total += 1;
        }
        if total != known && unverifiable.is_empty() {
            problems.push(format!("{total} records in Redis, {known} expected"));
        }
        if !problems.is_empty() {
            ledger_mismatch += 1;
            row.ok = false;
            ev.add(
                "ledger mismatches",
                format!("{}: {}", promo.id, problems.join("; ")),
            );
        }
        f.ledger.push(row);
    }
    // The NOSCRIPT path: a restarted Redis has an empty script cache.
    let info: String = pool
        .info(Some(fred::types::InfoKind::All))
        .await
        .unwrap_or_default();
    let stat = |prefix: &str| -> i64 {
        info.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|rest| rest.split([',', '\r']).next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let noscript = stat("errorstat_NOSCRIPT:count=");
    let evals = stat("cmdstat_eval:calls=");
    ledger.quit().await;

    let mut behind = 0;
    for (p, end) in &ends {
        let c = committed.get(p).copied().unwrap_or(-1);
        if c != *end && !(c == -1 && *end == 0) {
            behind += 1;
        }
        f.offsets.push((*p, c, *end));
    }

    f.row("lost (no outcome, no dead letter)", lost, true);
    f.row("valid events without an outcome", valid_no_outcome, true);
    f.row("split decisions (events)", split, true);
    f.row("split decisions (invalid records)", invalid_split, true);
    f.row(
        "outcomes naming another event than their source",
        mismatched_event,
        true,
    );
    f.row(
        "stray outcomes / dead letters (unknown source)",
        stray,
        true,
    );
    f.row("malformed outcomes", bad_outcomes, true);
    f.row("order model violations", model_violations, true);
    f.row(
        "orders not verifiable (no outcome)",
        unverifiable.len() - model_violations.min(unverifiable.len()),
        true,
    );
    f.row("orders spread over partitions", wrong_partition, true);
    f.row("invalid events without a dead letter", invalid_no_dlq, true);
    f.row("valid events dead-lettered", valid_dlq, true);
    f.row("dead letters with missing headers", bad_dlq, true);
    f.row(
        "dead-letter kind differs from the expected",
        kind_mismatch,
        true,
    );
    f.row(
        "dead letters not byte-identical to the input",
        dlq_payload_mismatch,
        true,
    );
    f.row(
        "invalid_event outcome missing",
        invalid_outcome_missing,
        true,
    );
    f.row(
        "unexpected invalid_event outcomes",
        invalid_outcome_unexpected,
        true,
    );
    f.row(
        "records that differ from the outcomes",
        record_mismatch,
        true,
    );
    f.row(
        "accepted deductions missing from Redis",
        lost_deductions,
        true,
    );
    f.row("ledger mismatches (promotions)", ledger_mismatch, true);
    f.row("negative remaining (Redis)", negative, true);
    f.row("negative remaining (outcomes)", negative_in_outcomes, true);
    f.row("customers above per_customer", above_limit, true);
    f.row(
        "customer counters that differ from held orders",
        counter_mismatch,
        true,
    );
    f.row("partitions with committed offset != log end", behind, true);
    f.row(
        "NOSCRIPT replies since the last Redis start",
        noscript as usize,
        false,
    );
    f.row(
        "EVAL fallbacks since the last Redis start",
        evals as usize,
        false,
    );

    let mut text = String::new();
    for (what, items) in &ev.0 {
        let _ = writeln!(text, "== {what}");
        for i in items {
            let _ = writeln!(text, "  {i}");
        }
    }
    std::fs::write(dir.join("anomalies.txt"), text)?;
    std::fs::write(dir.join("figures.json"), serde_json::to_vec_pretty(&f)?)?;
    Ok(f)
}

/// Redis settings for the run's own tools, independent of any `DEDUCTOR_*`
/// variables (scripts/chaos exports the dev-stack's, which are not settings).
pub fn redis_settings(url: &str, prefix: &str) -> RedisSettings {
    RedisSettings {
        url: url.to_owned(),
        username: String::new(),
        password: String::new(),
        password_file: String::new(),
        tls_ca_file: String::new(),
        tls_insecure_skip_verify: false,
        pool_size: 4,
        command_timeout_ms: 10_000,
        connect_timeout_ms: 5_000,
        key_prefix: prefix.to_owned(),
        record_ttl_secs: 2_592_000,
        refund_ttl_secs: 604_800,
        slow_script_ms: 10_000,
        sentinel_username: String::new(),
        sentinel_password: String::new(),
        sentinel_password_file: String::new(),
        wait_replicas: 0,
        wait_timeout_ms: 1_000,
    }
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or("?").to_owned()
}

fn opt(v: Option<i64>) -> String {
    v.map_or("-".to_owned(), |x| x.to_string())
}

/// The table.
pub fn print(f: &Figures) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{:<52} {:>9}", "figure", "value");
    for (name, v, zero) in &f.rows {
        let mark = if *zero {
            if *v == 0 {
                "  ok (must be 0)"
            } else {
                "  FAIL (must be 0)"
            }
        } else {
            ""
        };
        let _ = writeln!(o, "{name:<52} {v:>9}{mark}");
    }
    let _ = writeln!(
        o,
        "\noutcomes per valid input record: {}",
        hist(&f.histogram_per_record)
    );
    let _ = writeln!(
        o,
        "outcomes per event id:    {}",
        hist(&f.histogram_per_event)
    );
    let _ = writeln!(o, "\ndecisions (first outcome per event):");
    for (k, v) in &f.decisions {
        let _ = writeln!(o, "  {k:<40} {v:>8}");
    }
    let _ = writeln!(o, "\ndead letters by kind:");
    for (k, v) in &f.dead_letter_reasons {
        let _ = writeln!(o, "  {k:<40} {v:>8}");
    }
    let _ = writeln!(
        o,
        "\nledger (budget | stock): initial - remaining == sum of outstanding records \
         == accepted - refunded per the outcomes"
    );
    let _ = writeln!(
        o,
        "  {:<8} {:>21} {:>21} {:>21} {:>21} {:>6} {:>9}  ok",
        "promo", "initial", "remaining", "records", "accepted-refunded", "held", "max/limit"
    );
    for r in &f.ledger {
        let pair = |a: Option<i64>, b: Option<i64>| format!("{} | {}", opt(a), opt(b));
        let _ = writeln!(
            o,
            "  {:<8} {:>21} {:>21} {:>21} {:>21} {:>6} {:>9}  {}",
            r.promotion,
            pair(r.initial.0, r.initial.1),
            pair(r.remaining.0, r.remaining.1),
            pair(Some(r.records.0), Some(r.records.1)),
            pair(Some(r.by_outcomes.0), Some(r.by_outcomes.1)),
            r.held,
            format!("{}/{}", r.max_per_customer, opt(r.per_customer)),
            if r.ok { "yes" } else { "NO" }
        );
    }
    let _ = writeln!(o, "\ncommitted offsets (partition: committed / log end):");
    let parts: Vec<String> = f
        .offsets
        .iter()
        .map(|(p, c, e)| format!("{p}: {c}/{e}"))
        .collect();
    let _ = writeln!(o, "  {}", parts.join("  "));
    o
}

fn hist(h: &BTreeMap<String, i64>) -> String {
    h.iter()
        .map(|(k, v)| format!("{k}x: {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}
