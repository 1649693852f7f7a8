//! What the topics say on their own: every input record against the
//! outcomes and dead letters that name it as their source, and one decision
//! per event.

use std::collections::{BTreeSet, HashMap};

use deductor_testkit::topics::Read;
use serde_json::Value;

use super::{bucket, Findings, Input};
use crate::model;

/// The outcomes and dead letters, each under the input record it names as
/// its source.
pub struct Sources<'a> {
    /// The outcomes that are JSON, in the order read.
    pub outcomes: Vec<Value>,
    /// Input record (partition, offset) -> its outcomes (in `outcomes`).
    outcomes_of: HashMap<(i32, i64), Vec<usize>>,
    dead_letters_of: HashMap<(i32, i64), Vec<&'a Read>>,
}

impl<'a> Sources<'a> {
    /// Indexes the outcome and dead-letter records; those that are malformed
    /// or name no record of `input_topic` are counted and left out.
    pub fn index(
        input_topic: &str,
        outcomes: &[Read],
        dlq: &'a [Read],
        found: &mut Findings,
    ) -> Sources<'a> {
        let ev = &mut found.evidence;
        let mut parsed: Vec<Value> = Vec::with_capacity(outcomes.len());
        let mut outcomes_of: HashMap<(i32, i64), Vec<usize>> = HashMap::new();
        for o in outcomes {
            let v: Value = match serde_json::from_slice(&o.payload) {
                Ok(v) => v,
                Err(e) => {
                    found.zeros.malformed_outcomes += 1;
                    ev.add(
                        "malformed outcomes",
                        format!("outcome p{} o{}: {e}", o.partition, o.offset),
                    );
                    continue;
                }
            };
            match source_of(&v) {
                Some((topic, p, off)) if topic == input_topic => {
                    outcomes_of.entry((p, off)).or_default().push(parsed.len())
                }
                _ => {
                    found.zeros.malformed_outcomes += 1;
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
            parsed.push(v);
        }
        // What the evidence holds of it (at most 50).
        found.zeros.negative_in_outcomes =
            ev.0.get("negative remaining in outcomes")
                .map_or(0, Vec::len);
        let mut dead_letters_of: HashMap<(i32, i64), Vec<&Read>> = HashMap::new();
        for d in dlq {
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
                (Some(t), Some(p), Some(o)) if t == input_topic && complete => {
                    dead_letters_of.entry((p, o)).or_default().push(d)
                }
                _ => {
                    found.zeros.bad_dlq += 1;
                    ev.add(
                        "dead letters with missing headers",
                        format!("dlq p{} o{}: {:?}", d.partition, d.offset, h),
                    );
                }
            }
        }
        Sources {
            outcomes: parsed,
            outcomes_of,
            dead_letters_of,
        }
    }

    /// The outcomes of the input record at `src`, as indices in `outcomes`.
    pub fn outcomes_at(&self, src: (i32, i64)) -> &[usize] {
        self.outcomes_of.get(&src).map_or(&[][..], Vec::as_slice)
    }

    fn dead_letters_at(&self, src: (i32, i64)) -> &[&'a Read] {
        self.dead_letters_of
            .get(&src)
            .map_or(&[][..], Vec::as_slice)
    }
}

fn source_of(v: &Value) -> Option<(String, i32, i64)> {
    let s = &v["source"];
    Some((
        s["topic"].as_str()?.to_owned(),
        i32::try_from(s["partition"].as_i64()?).ok()?,
        s["offset"].as_i64()?,
    ))
}

/// Every input record against its outcomes and dead letters: lost records,
/// valid events without an outcome or dead-lettered, invalid events without
/// their dead letter or with the wrong one, invalid_event outcomes; then the
/// outcomes and dead letters of records that do not exist (stray).
pub fn match_inputs(inputs: &[Input], sources: &Sources<'_>, found: &mut Findings) {
    let (f, z, ev) = (&mut found.figures, &mut found.zeros, &mut found.evidence);
    let outcome = |k: usize| &sources.outcomes[k];
    for i in inputs {
        let src = (i.partition, i.offset);
        let outs = sources.outcomes_at(src);
        let dls = sources.dead_letters_at(src);
        if i.marker.is_none() {
            *f.histogram_per_record
                .entry(bucket(outs.len()))
                .or_default() += 1;
        }
        if outs.is_empty() && dls.is_empty() {
            z.lost += 1;
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
                    z.valid_no_outcome += 1;
                }
                if !dls.is_empty() {
                    z.valid_dlq += 1;
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
                    if outcome(k)["reason"] == "invalid_event" {
                        z.invalid_outcome_unexpected += 1;
                    }
                }
            }
            Some((kind, want_outcome)) => {
                if dls.is_empty() {
                    z.invalid_no_dlq += 1;
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
                        z.kind_mismatch += 1;
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
                        z.dlq_payload_mismatch += 1;
                    }
                }
                let sigs: BTreeSet<String> =
                    outs.iter().map(|&k| model::signature(outcome(k))).collect();
                if sigs.len() > 1 {
                    z.invalid_split += 1;
                }
                let wrong_reason = outs
                    .iter()
                    .any(|&k| outcome(k)["reason"] != "invalid_event");
                if *want_outcome && outs.is_empty() {
                    z.invalid_outcome_missing += 1;
                    ev.add(
                        "invalid_event outcome missing",
                        format!("p{} o{} {kind}", src.0, src.1),
                    );
                }
                if (!*want_outcome && !outs.is_empty()) || wrong_reason {
                    z.invalid_outcome_unexpected += 1;
                    ev.add(
                        "unexpected outcome of an invalid event",
                        format!("p{} o{} {kind}: {}", src.0, src.1, outcome(outs[0])),
                    );
                }
            }
        }
    }
    let input_sources: BTreeSet<(i32, i64)> =
        inputs.iter().map(|i| (i.partition, i.offset)).collect();
    z.stray = sources
        .outcomes_of
        .keys()
        .filter(|s| !input_sources.contains(s))
        .count()
        + sources
            .dead_letters_of
            .keys()
            .filter(|s| !input_sources.contains(s))
            .count();
}

/// One decision per event: the outcomes of all deliveries of an event state
/// the same decision. Returns each event's first outcome (in `outcomes`),
/// the decision the model replays.
pub fn decisions(
    inputs: &[Input],
    sources: &Sources<'_>,
    found: &mut Findings,
) -> HashMap<String, usize> {
    let (f, z, ev) = (&mut found.figures, &mut found.zeros, &mut found.evidence);
    let mut sigs_by_event: HashMap<String, BTreeSet<String>> = HashMap::new();
    let mut outcome_count_by_event: HashMap<String, usize> = HashMap::new();
    let mut first_outcome: HashMap<String, usize> = HashMap::new();
    for i in inputs {
        let Ok(e) = &i.parsed else { continue };
        let id = e.header().event_id.as_str();
        for &k in sources.outcomes_at((i.partition, i.offset)) {
            let v = &sources.outcomes[k];
            if v["event_id"].as_str() != Some(id)
                || v["order_id"].as_str() != Some(e.header().order_id.as_str())
            {
                z.mismatched_event += 1;
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
    for (id, sigs) in &sigs_by_event {
        if sigs.len() > 1 {
            z.split += 1;
            ev.add("split decisions", format!("{id}: {sigs:?}"));
        }
    }
    let mut distinct_events: BTreeSet<&str> = BTreeSet::new();
    for i in inputs {
        if let Ok(e) = &i.parsed {
            distinct_events.insert(e.header().event_id.as_str());
        }
    }
    for id in &distinct_events {
        let n = outcome_count_by_event.get(*id).copied().unwrap_or(0);
        *f.histogram_per_event.entry(bucket(n)).or_default() += 1;
    }
    for v in first_outcome.values().map(|&k| &sources.outcomes[k]) {
        let key = match v["reason"].as_str() {
            Some(r) => format!("{} {r}", v["type"].as_str().unwrap_or("?")),
            None => v["type"].as_str().unwrap_or("?").to_owned(),
        };
        *f.decisions.entry(key).or_default() += 1;
    }
    first_outcome
}
