//! What the topics say on their own: every input record against the
//! outcomes and dead letters that name it as their source, and one decision
//! per event.

use std::collections::{BTreeSet, HashMap};

use deductor_testkit::topics::Read;
use serde_json::Value;

use super::{bucket, Delivery, Findings, Input};
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

/// An input record: its partition and offset in the input topic.
type Source = (i32, i64);

/// Records beyond the first of each input record.
#[derive(Debug, PartialEq, Eq)]
pub struct Beyond {
    pub total: usize,
    /// The input records with more than one, with how many they have, in
    /// order.
    pub sources: Vec<(Source, usize)>,
}

/// The records beyond the first of each input record in `by_source`, what
/// the outcome or dead-letter topic says of each input record. An input
/// record is its source partition and offset: a record re-sent under the
/// same event id is another input record, with its own outcome.
pub fn beyond_first<V>(by_source: &HashMap<Source, Vec<V>>) -> Beyond {
    let mut sources: Vec<(Source, usize)> = by_source
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(&src, v)| (src, v.len()))
        .collect();
    sources.sort_unstable();
    Beyond {
        total: sources.iter().map(|(_, n)| n - 1).sum(),
        sources,
    }
}

/// The figure names of [`duplicates`].
pub const DUPLICATE_OUTCOMES: &str = "duplicate outcomes (read_committed)";
pub const DUPLICATE_DEAD_LETTERS: &str = "duplicate dead letters (read_committed)";

/// Outcomes and dead letters beyond the first per input record, as a
/// `read_committed` reader sees them (the topics are read so). With
/// `exactly_once` delivery both must be 0 (their sources go to the
/// evidence); with `at_least_once` a redelivery may publish again, and they
/// are information. They count every input record, valid or not (an
/// invalid event's `invalid_event` outcome too); the histogram of outcomes
/// per valid input record shows the same redeliveries by count.
pub fn duplicates(sources: &Sources<'_>, delivery: Delivery, found: &mut Findings) {
    let must_be_zero = delivery == Delivery::ExactlyOnce;
    for (
        name,
        Beyond {
            total,
            sources: over,
        },
    ) in [
        (DUPLICATE_OUTCOMES, beyond_first(&sources.outcomes_of)),
        (
            DUPLICATE_DEAD_LETTERS,
            beyond_first(&sources.dead_letters_of),
        ),
    ] {
        found.figures.row(name, total, must_be_zero);
        if must_be_zero {
            for ((p, o), k) in over {
                found
                    .evidence
                    .add(name, format!("input p{p} o{o}: {k} records"));
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(topic: &str, partition: i32, offset: i64, event: &str, at: i64) -> Read {
        let v = serde_json::json!({
            "type": "DeductAccepted",
            "event_id": event,
            "order_id": "o-1",
            "source": {"topic": topic, "partition": partition, "offset": offset},
        });
        Read {
            partition: 0,
            offset: at,
            key: None,
            payload: v.to_string().into_bytes(),
            headers: Default::default(),
            timestamp: None,
        }
    }

    fn dead_letter(partition: Option<&str>, offset: &str, at: i64) -> Read {
        let mut h: HashMap<String, String> = [
            ("deductor.error", "bad"),
            ("deductor.error.kind", "not_json"),
            ("deductor.source.topic", "in"),
            ("deductor.source.offset", offset),
            ("deductor.source.timestamp", "1"),
            ("deductor.consumer.group", "g"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        if let Some(p) = partition {
            h.insert("deductor.source.partition".into(), p.into());
        }
        Read {
            partition: 0,
            offset: at,
            key: None,
            payload: b"x".to_vec(),
            headers: h,
            timestamp: None,
        }
    }

    fn beyond(total: usize, sources: Vec<(Source, usize)>) -> Beyond {
        Beyond { total, sources }
    }

    fn figure(found: &Findings, name: &str) -> (i64, bool) {
        let (_, v, z) = found
            .figures
            .rows
            .iter()
            .find(|(n, _, _)| n == name)
            .expect("figure present");
        (*v, *z)
    }

    /// What the topics hold: input p0 o5 answered three times, p0 o6 once,
    /// p1 o5 once (the same offset in another partition: another record),
    /// p0 o7 and p0 o8 once each with the same event id (a record re-sent:
    /// two input records, no duplicate), one outcome of another topic
    /// (malformed, not counted); dead letters: p2 o9 twice, p0 o9 once, one
    /// without its partition header (not indexed, not counted).
    fn topics() -> (Vec<Read>, Vec<Read>) {
        let outcomes = vec![
            outcome("in", 0, 5, "e-1", 0),
            outcome("in", 0, 6, "e-2", 1),
            outcome("in", 0, 5, "e-1", 2),
            outcome("in", 1, 5, "e-3", 3),
            outcome("in", 0, 7, "e-4", 4),
            outcome("in", 0, 8, "e-4", 5),
            outcome("other", 0, 6, "e-2", 6),
            outcome("in", 0, 5, "e-1", 7),
        ];
        let dlq = vec![
            dead_letter(Some("2"), "9", 0),
            dead_letter(Some("0"), "9", 1),
            dead_letter(Some("2"), "9", 2),
            dead_letter(None, "9", 3),
        ];
        (outcomes, dlq)
    }

    #[test]
    fn duplicates_are_counted_per_input_record() {
        let (outcomes, dlq) = topics();
        let mut found = Findings::default();
        let sources = Sources::index("in", &outcomes, &dlq, &mut found);
        assert_eq!(found.zeros.malformed_outcomes, 1);
        assert_eq!(found.zeros.bad_dlq, 1);
        assert_eq!(
            beyond_first(&sources.outcomes_of),
            beyond(2, vec![((0, 5), 3)]),
            "p0 o5 has 2 outcomes beyond its first; the re-sent event (o7, o8) and p1 o5 none"
        );
        assert_eq!(
            beyond_first(&sources.dead_letters_of),
            beyond(1, vec![((2, 9), 2)])
        );

        duplicates(&sources, Delivery::ExactlyOnce, &mut found);
        assert_eq!(figure(&found, DUPLICATE_OUTCOMES), (2, true));
        assert_eq!(figure(&found, DUPLICATE_DEAD_LETTERS), (1, true));
        assert_eq!(
            found.figures.failed(),
            vec![DUPLICATE_OUTCOMES, DUPLICATE_DEAD_LETTERS]
        );
        assert_eq!(
            found.evidence.0[DUPLICATE_OUTCOMES],
            vec!["input p0 o5: 3 records".to_owned()]
        );
    }

    #[test]
    fn duplicates_are_information_at_least_once() {
        let (outcomes, dlq) = topics();
        let mut found = Findings::default();
        let sources = Sources::index("in", &outcomes, &dlq, &mut found);
        duplicates(&sources, Delivery::AtLeastOnce, &mut found);
        assert_eq!(figure(&found, DUPLICATE_OUTCOMES), (2, false));
        assert_eq!(figure(&found, DUPLICATE_DEAD_LETTERS), (1, false));
        assert!(found.figures.failed().is_empty());
        assert!(!found.evidence.0.contains_key(DUPLICATE_OUTCOMES));
    }

    #[test]
    fn one_record_each_is_no_duplicate() {
        let mut by: HashMap<(i32, i64), Vec<u8>> = HashMap::new();
        assert_eq!(beyond_first(&by), beyond(0, vec![]));
        by.insert((0, 1), vec![1]);
        by.insert((1, 1), vec![1]);
        by.insert((0, 2), vec![]);
        assert_eq!(beyond_first(&by), beyond(0, vec![]));
        by.insert((3, 4), vec![1, 2, 3, 4]);
        assert_eq!(beyond_first(&by), beyond(3, vec![((3, 4), 4)]));
    }
}
