//! The drained check of `pipeline.exit_when_drained`: every assigned
//! partition processed to its end. (Commits are `kafka::commit`'s.)

use std::time::Duration;

use rdkafka::consumer::Consumer;

use crate::kafka::consumer::GroupConsumer;
use crate::kafka::offsets::Offsets;

/// True when partitions are assigned and each is processed to its end
/// (nothing in flight, watermark or committed offset at the high watermark).
/// Only used with `exit_when_drained`. The high watermarks librdkafka cached
/// from its last fetch decide without a round trip; only when a partition
/// has none yet are the broker and the group coordinator asked, with
/// blocking calls that hold up this loop (and so every lane's pulls).
pub(super) fn drained(consumer: &GroupConsumer, offsets: &Offsets, topic: &str) -> bool {
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
    let mut unknown = false;
    for e in &parts {
        let p = e.partition();
        match cached_watermarks(consumer, topic, p) {
            Some((low, high)) => {
                if high != low && offsets.watermark(p).unwrap_or(-1) < high {
                    return false;
                }
            }
            _ => unknown = true,
        }
    }
    if !unknown {
        return true;
    }
    let timeout = Duration::from_secs(2);
    let Ok(committed) = consumer.committed_offsets(assignment.clone(), timeout) else {
        return false;
    };
    parts.iter().all(|e| {
        let p = e.partition();
        let Ok((low, high)) = consumer.fetch_watermarks(topic, p, timeout) else {
            return false;
        };
        let done = offsets.watermark(p).unwrap_or(-1);
        let committed = match committed.find_partition(topic, p).map(|x| x.offset()) {
            Some(rdkafka::Offset::Offset(o)) => o,
            _ => -1,
        };
        high == low || done.max(committed) >= high
    })
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
