//! Replay (redrive): each record back to the input topic, with provenance
//! headers; still-invalid records skipped unless asked for.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use crate::config::KafkaSettings;
use crate::kafka::publisher::tool_producer_config;
use crate::ledger::{Ledger, LedgerError};

use super::*;

/// What happened to one record of a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Sent to the input topic (partition, offset).
    Redriven { partition: i32, offset: i64 },
    /// Dry run: it parses and would be sent.
    WouldRedrive,
    /// Still invalid; not sent.
    Skipped(String),
    /// An earlier replay sent it (its note says where, or `sending ...`
    /// when that replay stopped mid-send); not sent again.
    AlreadyRedriven(String),
    /// The send failed; `unreachable` when Kafka could not be reached.
    Failed { detail: String, unreachable: bool },
}

impl Verdict {
    /// The `result` label of the metric and of the JSON.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Redriven { .. } => "redriven",
            Verdict::WouldRedrive => "would_redrive",
            Verdict::Skipped(_) => "skipped",
            Verdict::AlreadyRedriven(_) => "already_redriven",
            Verdict::Failed { .. } => "failed",
        }
    }
}

/// One record's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    /// What the parser says now: `Ok` or the invalid-event text.
    pub parse: Result<(), String>,
    pub verdict: Verdict,
}

impl Replayed {
    pub fn line(&self, input: &str) -> String {
        let at = format!("{}@{}", self.partition, self.offset);
        let key = self.key.as_deref().unwrap_or("-");
        match &self.verdict {
            Verdict::Redriven { partition, offset } => {
                format!("{at} key {key}: redriven to {input} {partition}@{offset}")
            }
            Verdict::WouldRedrive => {
                format!("{at} key {key}: parses; would be redriven to {input}")
            }
            Verdict::Skipped(why) => format!("{at} key {key}: skipped, still invalid: {why}"),
            Verdict::AlreadyRedriven(note) => format!(
                "{at} key {key}: already redriven ({note}); not sent again (--again sends it)"
            ),
            Verdict::Failed { detail, .. } => format!("{at} key {key}: FAILED: {detail}"),
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        let (ip, io) = match self.verdict {
            Verdict::Redriven { partition, offset } => (Some(partition), Some(offset)),
            _ => (None, None),
        };
        let detail = match &self.verdict {
            Verdict::Skipped(d)
            | Verdict::AlreadyRedriven(d)
            | Verdict::Failed { detail: d, .. } => Some(d.clone()),
            _ => None,
        };
        serde_json::json!({
            "partition": self.partition,
            "offset": self.offset,
            "key": self.key,
            "valid": self.parse.is_ok(),
            "result": self.verdict.as_str(),
            "detail": detail,
            "input_partition": ip,
            "input_offset": io,
        })
    }
}

/// How a replay runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Parse and report; send nothing.
    pub dry_run: bool,
    /// Send records the parser still refuses.
    pub include_invalid: bool,
    /// Send dead letters an earlier replay already sent.
    pub again: bool,
}

/// Why a replay stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The redrive note of one dead letter could not be read or written.
    #[error("the redrive note of dead letter {at} (redis)")]
    Notes {
        at: String,
        #[source]
        source: LedgerError,
    },
}

/// The verdict of a record that is never sent, whatever Redis says: a
/// truncated dead letter, or a still invalid one unless `include_invalid`.
fn unsendable(
    r: &DeadLetter,
    parse: &Result<(), String>,
    include_invalid: bool,
) -> Option<Verdict> {
    match parse {
        _ if r.truncated() => Some(Verdict::Skipped(r.truncated_reason())),
        Err(why) if !include_invalid => Some(Verdict::Skipped(why.clone())),
        _ => None,
    }
}

/// Replays `records` to `k.input_topic` (never anywhere else), one at a
/// time and in order, each counted in `deductor_dlq_redrives_total`.
/// Invalid records are skipped unless `include_invalid`, truncated ones
/// always; `dry_run` sends nothing.
///
/// Each dead letter is sent at most once over any number of replays
/// (issue 23: a second run sent everything again): before sending, the
/// replay claims the dead letter's note in `notes` (`SET NX`, `sending
/// <unix ms>`), and once the broker acknowledged it the note names where
/// it went; a failed send gives the claim back. A dead letter with a note
/// is reported `already_redriven` and not sent, unless `again`. A replay
/// stopped between the send and the note leaves `sending ...`: the record
/// may or may not be in the input topic, and `again` sends it.
pub async fn replay(
    k: &KafkaSettings,
    notes: &Ledger,
    records: &[DeadLetter],
    how: Options,
) -> Result<Vec<Replayed>, ReplayError> {
    let producer: Option<FutureProducer> = if how.dry_run {
        None
    } else {
        Some(tool_producer_config(k).create()?)
    };
    let clock = chrono::Utc::now();
    let now = clock.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let claim = format!("sending {}", clock.timestamp_millis());
    let dlq = k.dlq_topic.as_str();
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        let at = |source| ReplayError::Notes {
            at: format!("{dlq} {}@{}", r.partition, r.offset),
            source,
        };
        let parse = r.parse().map(drop).map_err(|e| e.to_string());
        let verdict = match (unsendable(r, &parse, how.include_invalid), &producer) {
            (Some(v), _) => v,
            (None, None) => match notes.redrive_note(dlq, r.partition, r.offset).await {
                Ok(Some(note)) if !how.again => Verdict::AlreadyRedriven(note),
                Ok(_) => Verdict::WouldRedrive,
                Err(e) => return Err(at(e)),
            },
            (None, Some(producer)) => {
                let claimed = notes
                    .set_redrive_note(dlq, r.partition, r.offset, &claim, !how.again)
                    .await
                    .map_err(at)?;
                if !claimed {
                    let note = notes
                        .redrive_note(dlq, r.partition, r.offset)
                        .await
                        .map_err(at)?;
                    // (A note that expired in between reads as none.)
                    Verdict::AlreadyRedriven(note.unwrap_or_else(|| "just now".to_owned()))
                } else {
                    match send(k, producer, r, &now).await {
                        Ok((partition, offset)) => {
                            let note = format!("{} {partition}@{offset} {now}", k.input_topic);
                            notes
                                .set_redrive_note(dlq, r.partition, r.offset, &note, false)
                                .await
                                .map_err(at)?;
                            Verdict::Redriven { partition, offset }
                        }
                        Err(e) => {
                            notes
                                .clear_redrive_note(dlq, r.partition, r.offset)
                                .await
                                .map_err(at)?;
                            Verdict::Failed {
                                detail: e.to_string(),
                                unreachable: crate::kafka::unreachable(&e),
                            }
                        }
                    }
                }
            }
        };
        crate::metrics::dlq_redrive(verdict.as_str());
        out.push(Replayed {
            partition: r.partition,
            offset: r.offset,
            key: r.key.as_deref().map(lossy),
            parse,
            verdict,
        });
    }
    Ok(out)
}

/// Sends one dead letter to the input topic: its key, its value, the
/// headers of [`DeadLetter::redrive_headers`]. Returns where it landed.
async fn send(
    k: &KafkaSettings,
    producer: &FutureProducer,
    r: &DeadLetter,
    now: &str,
) -> Result<(i32, i64), KafkaError> {
    let headers = r.redrive_headers(&k.dlq_topic, now);
    let mut owned = OwnedHeaders::new_with_capacity(headers.len());
    for (key, value) in &headers {
        owned = owned.insert(Header {
            key: key.as_str(),
            value: value.as_deref(),
        });
    }
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&k.input_topic).headers(owned);
    if let Some(key) = &r.key {
        record = record.key(key.as_slice());
    }
    if let Some(p) = &r.payload {
        record = record.payload(p.as_slice());
    }
    producer
        .send(
            record,
            Timeout::After(Duration::from_millis(k.produce_timeout_ms)),
        )
        .await
        .map(|d| (d.partition, d.offset))
        .map_err(|(e, _)| e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(payload: &str) -> DeadLetter {
        DeadLetter {
            partition: 0,
            offset: 3,
            timestamp_ms: Some(0),
            key: None,
            payload: Some(payload.as_bytes().to_vec()),
            headers: vec![(KIND_HEADER.to_owned(), Some(b"too_large".to_vec()))],
        }
    }

    #[test]
    fn truncated_dead_letters_are_never_sent() {
        let mut cut = letter("{\"type\":");
        cut.headers
            .push((TRUNCATED_HEADER.to_owned(), Some(b"true".to_vec())));
        let parse = cut.parse().map(drop).map_err(|e| e.to_string());
        // include_invalid does not override it.
        assert!(
            matches!(unsendable(&cut, &parse, true), Some(Verdict::Skipped(why)) if why.starts_with("truncated")),
        );
        let bad = letter("not json");
        let parse = bad.parse().map(drop).map_err(|e| e.to_string());
        assert!(matches!(
            unsendable(&bad, &parse, false),
            Some(Verdict::Skipped(_))
        ));
        assert_eq!(
            unsendable(&bad, &parse, true),
            None,
            "--include-invalid sends it"
        );
    }
}
