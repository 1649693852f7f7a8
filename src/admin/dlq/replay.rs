//! Replay (redrive): each record back to the input topic, with provenance
//! headers; still-invalid records skipped unless asked for.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use crate::config::KafkaSettings;
use crate::kafka::publisher::tool_producer_config;

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
            Verdict::Failed { detail, .. } => format!("{at} key {key}: FAILED: {detail}"),
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        let (ip, io) = match self.verdict {
            Verdict::Redriven { partition, offset } => (Some(partition), Some(offset)),
            _ => (None, None),
        };
        let detail = match &self.verdict {
            Verdict::Skipped(d) | Verdict::Failed { detail: d, .. } => Some(d.clone()),
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

/// Replays `records` to `k.input_topic` (never anywhere else), one at a
/// time and in order, each counted in `deductor_dlq_redrives_total`.
/// Invalid records are skipped unless `include_invalid`, truncated ones
/// always; `dry_run` sends nothing.
pub async fn replay(
    k: &KafkaSettings,
    records: &[DeadLetter],
    dry_run: bool,
    include_invalid: bool,
) -> Result<Vec<Replayed>, KafkaError> {
    let producer: Option<FutureProducer> = if dry_run {
        None
    } else {
        Some(tool_producer_config(k).create()?)
    };
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        let parse = r.parse().map(drop).map_err(|e| e.to_string());
        let verdict = match (&parse, &producer) {
            _ if r.truncated() => Verdict::Skipped(r.truncated_reason()),
            (Err(why), _) if !include_invalid => Verdict::Skipped(why.clone()),
            (_, None) => Verdict::WouldRedrive,
            (_, Some(producer)) => {
                let headers = r.redrive_headers(&k.dlq_topic, &now);
                let mut owned = OwnedHeaders::new_with_capacity(headers.len());
                for (key, value) in &headers {
                    owned = owned.insert(Header {
                        key: key.as_str(),
                        value: value.as_deref(),
                    });
                }
                let mut record: FutureRecord<'_, [u8], [u8]> =
                    FutureRecord::to(&k.input_topic).headers(owned);
                if let Some(key) = &r.key {
                    record = record.key(key.as_slice());
                }
                if let Some(p) = &r.payload {
                    record = record.payload(p.as_slice());
                }
                match producer
                    .send(
                        record,
                        Timeout::After(Duration::from_millis(k.produce_timeout_ms)),
                    )
                    .await
                {
                    Ok(d) => Verdict::Redriven {
                        partition: d.partition,
                        offset: d.offset,
                    },
                    Err((e, _)) => Verdict::Failed {
                        detail: e.to_string(),
                        unreachable: crate::kafka::unreachable(&e),
                    },
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
