//! A zombie's transaction must not commit: KIP-447 fences its offsets by
//! the group membership sent with them, but the broker skips that check
//! for the "no member" sentinel (member id "", generation -1) that
//! librdkafka's metadata carries once its membership is lost. This test
//! shows the broker's rule on the real broker, and that the boundary's
//! guard (`kafka::membership::fenceable_metadata`) refuses exactly the
//! metadata that would slip through and accepts a live member's.

use std::time::{Duration, Instant};

use deductor::kafka::membership::{current, fenceable_metadata};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::Producer;

use crate::common::kafka::{committed, fresh_topics, group_member, offsets_in_a_transaction};

/// Sends `offset` for partition 0 of `topic` in one committed transaction
/// with the metadata of `by`.
async fn commit_in_a_transaction(topic: &str, by: &StreamConsumer, offset: i64) {
    let metadata = by.group_metadata().expect("a group consumer has metadata");
    let producer = offsets_in_a_transaction("fence-tx", topic, metadata, offset).await;
    tokio::task::spawn_blocking(move || {
        producer
            .commit_transaction(Duration::from_secs(30))
            .expect("commit_transaction");
    })
    .await
    .expect("transaction task");
}

/// The group's committed offset of partition 0 of `topic`.
async fn committed_offset(group: &str, topic: &str) -> Option<i64> {
    committed(group, topic, 1).await.get(&0).copied().flatten()
}

#[tokio::test]
async fn offsets_go_only_with_a_live_membership() {
    let topics = fresh_topics("fence", 1).await;
    let group = topics.group.clone();

    // A live member that owns the partition.
    let live = group_member(&group, 10_000);
    live.subscribe(&[&topics.input]).expect("subscribe");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !current(&live).is_some_and(|m| m.fences())
        || live.assignment().map(|a| a.count()).unwrap_or(0) == 0
    {
        assert!(Instant::now() < deadline, "the live member joins in 60 s");
        let _ = tokio::time::timeout(Duration::from_millis(200), live.recv()).await;
    }

    // A consumer of the same group that holds no membership: the sentinel
    // a lost membership leaves.
    let gone = group_member(&group, 10_000);
    let m = current(&gone).expect("a group consumer has membership data");
    assert!(
        m.id.is_empty() && m.generation < 0,
        "not joined: the sentinel: {m:?}"
    );

    // The broker's rule: the sentinel's offsets commit, unfenced, although
    // the partition's owner is a live member. (If a broker ever fences
    // them, the guard below is merely redundant.)
    commit_in_a_transaction(&topics.input, &gone, 7).await;
    assert_eq!(
        committed_offset(&group, &topics.input).await,
        Some(7),
        "the broker commits the sentinel's transactional offsets unfenced"
    );

    // The guard: no metadata for the sentinel; a live member's passes and
    // its offsets commit, fenced by its generation.
    let Err(refused) = fenceable_metadata(&gone) else {
        panic!("the sentinel's metadata must be refused");
    };
    assert!(refused.contains("not a live group member"), "{refused}");
    fenceable_metadata(&live).expect("a live member's metadata");
    commit_in_a_transaction(&topics.input, &live, 9).await;
    assert_eq!(committed_offset(&group, &topics.input).await, Some(9));
}
