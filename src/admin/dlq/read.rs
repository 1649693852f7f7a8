//! Reading dead letters: an assigned consumer that never commits.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::KafkaSettings;
use crate::kafka::consumer::consumer_config;

use super::*;

/// Reads the dead letters `filter` selects, sorted by partition and offset.
/// Blocking: call it on the blocking pool.
pub fn read(k: &KafkaSettings, filter: &Filter) -> Result<Vec<DeadLetter>, KafkaError> {
    let mut config = consumer_config(k);
    config
        .set("statistics.interval.ms", "0")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    let consumer: BaseConsumer = config.create()?;
    let topic = &k.dlq_topic;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions: Vec<i32> = md
        .topics()
        .iter()
        .find(|t| t.name() == topic.as_str())
        .filter(|t| t.error().is_none())
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if partitions.is_empty() {
        return Err(KafkaError::MetadataFetch(
            rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition,
        ));
    }
    let wanted: Vec<i32> = partitions
        .into_iter()
        .filter(|p| filter.partition.is_none_or(|w| w == *p))
        .collect();
    // Per partition: the first offset to read and the last one wanted.
    let mut starts = TopicPartitionList::new();
    if let Some(since) = filter.since_ms {
        for p in &wanted {
            starts.add_partition_offset(topic, *p, Offset::Offset(since))?;
        }
        starts = consumer.offsets_for_times(starts, Duration::from_secs(10))?;
    }
    let mut plan = Vec::new();
    for p in wanted {
        let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        let by_time = match starts.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            // No record at or after `since`.
            Some(Offset::End) => high,
            _ => low,
        };
        let first = low.max(filter.from_offset.unwrap_or(0)).max(by_time);
        let last = (high - 1).min(filter.to_offset.unwrap_or(i64::MAX));
        if first <= last {
            plan.push((p, first, last));
        }
    }
    let mut tpl = TopicPartitionList::new();
    for (p, first, _) in &plan {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*first))?;
    }
    consumer.assign(&tpl)?;
    let mut open: Vec<(i32, i64)> = plan.iter().map(|(p, _, last)| (*p, *last)).collect();
    let mut out = Vec::new();
    let mut last_progress = Instant::now();
    while !open.is_empty() {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                last_progress = Instant::now();
                let Some(i) = open.iter().position(|(p, _)| *p == m.partition()) else {
                    continue;
                };
                if m.offset() > open[i].1 {
                    open.swap_remove(i);
                    continue;
                }
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|x| (x.key.to_owned(), x.value.map(<[u8]>::to_vec)))
                            .collect()
                    })
                    .unwrap_or_default();
                let r = DeadLetter {
                    partition: m.partition(),
                    offset: m.offset(),
                    timestamp_ms: m.timestamp().to_millis(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().map(<[u8]>::to_vec),
                    headers,
                };
                if m.offset() >= open[i].1 {
                    open.swap_remove(i);
                }
                if filter.matches(&r) {
                    out.push(r);
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => open.retain(|(q, _)| *q != p),
            Some(Err(e)) => return Err(e),
            None => {
                if last_progress.elapsed() > IDLE {
                    tracing::warn!(
                        partitions = ?open,
                        "dead-letter topic: no more records arrived; listing what was read"
                    );
                    break;
                }
            }
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    out.truncate(filter.limit.unwrap_or(usize::MAX));
    Ok(out)
}
