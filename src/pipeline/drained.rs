//! The drained check of `pipeline.exit_when_drained`: every assigned
//! partition processed to its end. (Commits are `kafka::commit`'s.)

use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

use crate::kafka::consumer::GroupConsumer;
use crate::kafka::offsets::Offsets;

/// True when partitions are assigned and each is processed to its end:
/// nothing in flight, and each partition's high watermark reached by one of
///
/// - the watermark of what this process did;
/// - the consumer's position, when the partition's lane holds nothing
///   (`idle`): the position moves past control records (the commit marker
///   that ends a transactional producer's writes), which are never
///   delivered and so never reach the watermark;
/// - the group's committed offset, for a partition this process took
///   nothing from (a group already at the end).
///
/// The high watermarks librdkafka cached from its last fetch decide without
/// a round trip; the broker is asked only for a partition with none cached,
/// and the group coordinator only for a partition this process took
/// nothing from: blocking calls that hold up this loop (and so every
/// lane's pulls), made only with `exit_when_drained`. The caller asks
/// twice in a row before it stops, so a message pulled from a partition
/// queue but not yet handed to its lane is never missed.
pub(super) fn drained(
    consumer: &GroupConsumer,
    offsets: &Offsets,
    topic: &str,
    idle: impl Fn(i32) -> bool,
) -> bool {
    if offsets.in_flight() > 0 {
        return false;
    }
    let Ok(assignment) = consumer.assignment() else {
        return false;
    };
    let parts = assignment.elements_for_topic(topic);
    if parts.is_empty() {
        return false;
    }
    let timeout = Duration::from_secs(2);
    let position = consumer.position().ok();
    let mut untouched = TopicPartitionList::new();
    let mut ends = Vec::new();
    for e in &parts {
        let p = e.partition();
        let Some((low, high)) = cached_watermarks(consumer, topic, p)
            .or_else(|| consumer.fetch_watermarks(topic, p, timeout).ok())
        else {
            return false;
        };
        if high == low {
            continue;
        }
        let done = offsets.watermark(p);
        let at = position
            .as_ref()
            .and_then(|l| l.find_partition(topic, p))
            .and_then(|x| offset(x.offset()));
        let reached = done
            .unwrap_or(-1)
            .max(if idle(p) { at.unwrap_or(-1) } else { -1 });
        if reached >= high {
            continue;
        }
        if done.is_some() || at.is_some() {
            return false;
        }
        untouched.add_partition(topic, p);
        ends.push((p, high));
    }
    if ends.is_empty() {
        return true;
    }
    let Ok(committed) = consumer.committed_offsets(untouched, timeout) else {
        return false;
    };
    ends.iter().all(|(p, high)| {
        committed
            .find_partition(topic, *p)
            .and_then(|x| offset(x.offset()))
            .is_some_and(|c| c >= *high)
    })
}

fn offset(o: Offset) -> Option<i64> {
    match o {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// The (low, high) watermarks librdkafka last saw for a partition, if any.
pub(super) fn cached_watermarks(
    consumer: &GroupConsumer,
    topic: &str,
    p: i32,
) -> Option<(i64, i64)> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client handle lives as long as `consumer`; librdkafka
    // only reads the NUL-terminated `topic` and writes the two integers
    // (rd_kafka_get_watermark_offsets, which rust-rdkafka does not wrap).
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            p,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
        .then_some((low, high))
}
