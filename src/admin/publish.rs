//! `deductor publish`: produce events from JSON lines, keyed by `order_id`,
//! for demos, tests, replays and redriving dead letters. Lines are sent as
//! they are (even invalid ones: the service's dead-letter path is part of
//! what a demo shows).

use std::io::BufRead;
use std::time::Duration;

use anyhow::Context as _;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use crate::config::KafkaSettings;
use crate::kafka::publisher::tool_producer_config;

/// Most sends awaiting their ack at once.
const WINDOW: usize = 2048;

/// The Kafka key of one line: its `order_id` when it can be read.
pub fn key_of(line: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    v.get("order_id")?.as_str().map(str::to_owned)
}

/// Publishes every non-empty line of `input` to `topic`; returns the count.
pub async fn publish(k: &KafkaSettings, topic: &str, input: impl BufRead) -> anyhow::Result<usize> {
    let producer: FutureProducer = tool_producer_config(k)
        .create()
        .context("creating the Kafka producer")?;
    let mut pending = FuturesUnordered::new();
    let mut sent = 0usize;
    for (n, line) in input.lines().enumerate() {
        let line = line.with_context(|| format!("reading line {}", n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let producer = producer.clone();
        let topic = topic.to_owned();
        pending.push(async move {
            let key = key_of(&line);
            let mut record: FutureRecord<'_, str, str> = FutureRecord::to(&topic).payload(&line);
            if let Some(k) = &key {
                record = record.key(k);
            }
            producer
                .send(record, Timeout::After(Duration::from_secs(30)))
                .await
                .map(|_| ())
                // The KafkaError stays in the chain: a broker that cannot
                // be reached (the record timed out) exits 3.
                .map_err(|(e, _)| anyhow::Error::from(e).context(format!("line {}", n + 1)))
        });
        sent += 1;
        if pending.len() >= WINDOW {
            if let Some(r) = pending.next().await {
                r?;
            }
        }
    }
    while let Some(r) = pending.next().await {
        r?;
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_the_order_id_when_readable() {
        assert_eq!(
            key_of(r#"{"order_id":"o-1","x":2}"#).as_deref(),
            Some("o-1")
        );
        assert_eq!(key_of(r#"{"order_id":7}"#), None);
        assert_eq!(key_of("not json"), None);
    }
}
