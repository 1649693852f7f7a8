//! Reading dead letters: an assigned consumer that never commits.

use std::collections::HashMap;
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
    let mut config = consumer_config(k, None);
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
    let mut wanted: Vec<i32> = partitions
        .into_iter()
        .filter(|p| filter.partition.is_none_or(|w| w == *p))
        .collect();
    wanted.sort_unstable();
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
    let order: Vec<i32> = plan.iter().map(|(p, _, _)| *p).collect();
    let limit = filter.limit.unwrap_or(usize::MAX);
    let mut matched: HashMap<i32, usize> = HashMap::new();
    let mut out = Vec::new();
    let mut last_progress = Instant::now();
    // With a limit, reading stops once the first `limit` records are known
    // (issue 23: it used to read, and hold, the whole topic first).
    while !open.is_empty() && !enough(&order, &open, &matched, limit) {
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
                    let n = matched.entry(m.partition()).or_insert(0);
                    *n += 1;
                    if *n >= limit {
                        // Any later record of this partition comes after these.
                        open.retain(|(q, _)| *q != m.partition());
                    }
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
    out.truncate(limit);
    Ok(out)
}

/// True once the first `limit` matching records by partition and offset
/// are all read: the partitions of `order` before the first one still
/// `open` hold at least `limit` matches between them.
fn enough(order: &[i32], open: &[(i32, i64)], matched: &HashMap<i32, usize>, limit: usize) -> bool {
    let mut total = 0usize;
    for p in order {
        if total >= limit {
            return true;
        }
        if open.iter().any(|(q, _)| q == p) {
            return false;
        }
        total = total.saturating_add(matched.get(p).copied().unwrap_or(0));
    }
    total >= limit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_stops_once_the_first_records_are_known() {
        let order = [0, 1, 2];
        let m = |v: &[(i32, usize)]| v.iter().copied().collect::<HashMap<_, _>>();
        // Partition 0 still open: its records come first, whatever 1 holds.
        assert!(!enough(&order, &[(0, 9)], &m(&[(1, 5)]), 2));
        // Partition 0 done with 2: partitions 1 and 2 are not needed.
        assert!(enough(&order, &[(1, 9), (2, 9)], &m(&[(0, 2)]), 2));
        // Partition 0 done with 1, partition 1 still open: read on.
        assert!(!enough(&order, &[(1, 9), (2, 9)], &m(&[(0, 1)]), 2));
        assert!(enough(&order, &[(2, 9)], &m(&[(0, 1), (1, 1)]), 2));
        assert!(
            enough(&order, &[(0, 9)], &m(&[]), 0),
            "a limit of 0 reads nothing"
        );
        // No limit: only the end of every partition stops it.
        assert!(!enough(&order, &[(2, 9)], &m(&[(0, 7)]), usize::MAX));
    }
}
