//! Where a newly assigned partition starts: never below the group's
//! committed offset.
//!
//! librdkafka reads a partition's committed offset itself when it is
//! assigned. Under `read_committed` (which `exactly_once` requires) it asks
//! for stable offsets (KIP-447), and while a transaction holds pending
//! offsets for the partition (a process killed inside a transaction
//! boundary leaves one open until `transaction.timeout.ms` aborts it) the
//! broker answers `UNSTABLE_OFFSET_COMMIT` with no offset. librdkafka
//! retries that request, but when the assignment changes while it is
//! retrying (a rebalance that hands the partition back to the same
//! consumer), it takes the answer's "no offset" as the partition's start
//! and lets `auto.offset.reset` (earliest) apply: the partition is read
//! again from its first record (librdkafka 2.12.1,
//! `rd_kafka_assignment_apply_offsets`; its stale-member-epoch branch resets
//! the offset to be read again, the unstable one does not). The chaos
//! suite's every-fault run saw it: a partition's first 8,805 events were
//! answered a second time, in committed transactions (the ledger absorbed
//! them as duplicates; the outcome topic did not).
//!
//! So a lane reads the committed offset itself before its first event
//! ([`committed_floor`], stable, retried until the broker answers) and
//! skips every record below it: those were decided, and their outcomes
//! committed with that offset.

use std::time::Duration;

use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};

/// The group's committed offset of `partition` of `topic`: `Some` to start
/// from, `None` when nothing is committed (or the committed offset lies past
/// the log's end, which only a deleted and recreated topic leaves: then
/// librdkafka's own reset is the start). `Err` when the broker gave no
/// stable answer within `timeout` (the caller asks again).
pub fn committed_floor<C: ConsumerContext>(
    consumer: &StreamConsumer<C>,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<Option<i64>, String> {
    let mut asked = TopicPartitionList::new();
    asked.add_partition(topic, partition);
    let answer = consumer
        .committed_offsets(asked, timeout)
        .map_err(|e| format!("reading the committed offset: {e}"))?;
    let Some(entry) = answer.find_partition(topic, partition) else {
        return Err("the committed offset's answer does not name the partition".to_owned());
    };
    entry
        .error()
        .map_err(|e| format!("reading the committed offset: {e}"))?;
    let Offset::Offset(committed) = entry.offset() else {
        return Ok(None);
    };
    let (_, end) = consumer
        .fetch_watermarks(topic, partition, timeout)
        .map_err(|e| format!("reading the partition's end: {e}"))?;
    Ok(below_end(committed, end))
}

/// A committed offset past the log's end names another log (the topic was
/// deleted and created again under its name): it is no floor.
fn below_end(committed: i64, end: i64) -> Option<i64> {
    (committed <= end).then_some(committed)
}

/// Whether the record at `offset` is decided already: below the floor.
pub fn below_floor(floor: Option<i64>, offset: i64) -> bool {
    floor.is_some_and(|f| offset < f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_below_the_committed_offset_are_skipped_and_none_else() {
        assert!(below_floor(Some(8805), 0));
        assert!(below_floor(Some(8805), 8804));
        assert!(!below_floor(Some(8805), 8805));
        assert!(!below_floor(Some(8805), 9000));
        assert!(!below_floor(None, 0), "nothing committed: nothing skipped");
    }

    #[test]
    fn a_committed_offset_past_the_end_is_no_floor() {
        assert_eq!(below_end(10, 10), Some(10), "committed to the end");
        assert_eq!(below_end(3, 10), Some(3));
        assert_eq!(below_end(11, 10), None, "another log's offset");
    }
}
