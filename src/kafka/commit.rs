//! The one home of offset commits. Only watermarks are committed (G1, G5):
//! the pipeline's timer and its shutdown call [`watermarks`], the rebalance
//! callback calls [`revoked`] for the partitions it gives up, and a failed
//! asynchronous commit comes back through [`failed`] so that its offsets
//! are offered again on the next tick.

use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::{Offset, TopicPartitionList};

use super::offsets::Offsets;
use crate::metrics;

/// The watermarks as a commit list of the input topic, each with
/// `metadata` (the ledger marker, [`Offsets::commit_metadata`]).
pub fn commit_list(
    topic: &str,
    commits: &[(i32, i64)],
    metadata: &str,
) -> KafkaResult<TopicPartitionList> {
    let mut list = TopicPartitionList::with_capacity(commits.len());
    for (p, o) in commits {
        let mut e = list.add_partition(topic, *p);
        e.set_offset(Offset::Offset(*o))?;
        if !metadata.is_empty() {
            e.set_metadata(metadata);
        }
    }
    Ok(list)
}

/// Commits the watermarks that moved since the last commit: on the timer
/// (`Async`) and at shutdown (`Sync`).
pub fn watermarks<C, K>(consumer: &K, offsets: &Offsets, topic: &str, mode: CommitMode)
where
    C: ConsumerContext,
    K: Consumer<C>,
{
    let commits = offsets.take_commits(None);
    if commits.is_empty() {
        return;
    }
    let result = commit_list(topic, &commits, &offsets.commit_metadata())
        .and_then(|list| consumer.commit(&list, mode));
    match result {
        Ok(()) => {
            metrics::commit(true);
            tracing::debug!(?commits, "offsets committed");
        }
        Err(e) => {
            metrics::commit(false);
            offsets.commit_failed(&commits);
            tracing::warn!(error = %e, "offset commit failed; retried on the next tick");
        }
    }
}

/// Commits the watermarks of partitions being revoked, synchronously (the
/// next owner starts from them), unless the assignment was lost (another
/// member may own them already). Returns what was committed.
pub fn revoked<C, K>(
    consumer: &K,
    offsets: &Offsets,
    topic: &str,
    parts: &[i32],
    lost: bool,
) -> Vec<(i32, i64)>
where
    C: ConsumerContext,
    K: Consumer<C>,
{
    let commits = offsets.take_commits(Some(parts));
    if !lost && !commits.is_empty() {
        match commit_list(topic, &commits, &offsets.commit_metadata()) {
            Ok(list) => {
                if let Err(e) = consumer.commit(&list, CommitMode::Sync) {
                    tracing::warn!(error = %e, "commit on revoke failed; the next owner redoes those events (absorbed by idempotency)");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot build commit list"),
        }
    }
    commits
}

/// The result of an asynchronous commit: the offsets of a failed one are
/// offered again.
pub fn failed(offsets: &Offsets, topic: &str, list: &TopicPartitionList, error: &KafkaError) {
    let failed: Vec<(i32, i64)> = list
        .elements_for_topic(topic)
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect();
    offsets.commit_failed(&failed);
    tracing::debug!(%error, ?failed, "offset commit failed; offered again next time");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_list_names_the_watermarks() {
        let l = commit_list("orders", &[(0, 5), (3, 9)], "ledger=abc").unwrap();
        let e = l.elements_for_topic("orders");
        assert_eq!(e.len(), 2);
        assert_eq!(e[1].partition(), 3);
        assert_eq!(e[1].offset(), Offset::Offset(9));
        assert_eq!(e[1].metadata(), "ledger=abc");
        let bare = commit_list("orders", &[(0, 5)], "").unwrap();
        assert_eq!(bare.elements_for_topic("orders")[0].metadata(), "");
    }
}
