//! The group membership that fences a transaction's offsets (KIP-447).
//!
//! A transaction's offsets are sent with the consumer's group metadata (its
//! member id and generation), and the group coordinator refuses them when
//! that member is gone or its generation is old: this is what fences a
//! zombie. But the coordinator skips the check altogether for a
//! transactional commit with a negative generation and an empty member id
//! (the classic protocol's "no group member" sentinel, kept for producers
//! older than KIP-447), even while the group has other members. librdkafka's
//! metadata carries that sentinel from the moment it learns that its
//! membership is gone (a zombie's heartbeat answered `UNKNOWN_MEMBER_ID`)
//! until it joins again, while the lost partitions are revoked only in the
//! application's next poll. A boundary in that window committed a zombie's
//! outcomes and stale offsets unfenced, after the partitions' new owner had
//! begun from the committed offsets: every event in between was answered
//! twice under `read_committed` (the chaos suite's every-fault run once saw
//! a partition's first 125 events answered twice).
//!
//! So a boundary sends offsets only with the metadata of a live membership,
//! read with the membership before and after it: [`fenceable_metadata`].

use std::ffi::CStr;

use rdkafka::consumer::{Consumer, ConsumerContext, ConsumerGroupMetadata, StreamConsumer};

/// The consumer's group membership at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: String,
    pub generation: i32,
}

impl Member {
    /// A membership the coordinator checks a commit against: a member id
    /// and a generation (the sentinel skips the check).
    pub fn fences(&self) -> bool {
        !self.id.is_empty() && self.generation >= 0
    }
}

/// The membership librdkafka holds now; `None` when the client has no group.
pub fn current<C: ConsumerContext>(consumer: &StreamConsumer<C>) -> Option<Member> {
    use rdkafka::bindings as rd;
    let client = consumer.client().native_ptr();
    // SAFETY: the client handle lives as long as `consumer`.
    // rd_kafka_consumer_group_metadata returns a new object (or NULL) that
    // we own: its member id is a NUL-terminated string inside it, copied
    // before the object is destroyed, once, here.
    unsafe {
        let m = rd::rd_kafka_consumer_group_metadata(client);
        if m.is_null() {
            return None;
        }
        let generation = rd::rd_kafka_consumer_group_metadata_generation_id(m);
        let id = rd::rd_kafka_consumer_group_metadata_member_id(m);
        let id = if id.is_null() {
            String::new()
        } else {
            CStr::from_ptr(id).to_string_lossy().into_owned()
        };
        rd::rd_kafka_consumer_group_metadata_destroy(m);
        Some(Member { id, generation })
    }
}

/// Whether metadata read between `before` and `after` is of a membership
/// that fences: both the same live membership. A member id is never given
/// back once reset (a new join gets a new one) and a generation only grows,
/// so a membership seen on both sides was the one in between.
pub fn judge(before: Option<&Member>, after: Option<&Member>) -> Result<(), String> {
    match (before, after) {
        (Some(b), Some(a)) if b == a && b.fences() => Ok(()),
        (Some(b), Some(a)) if b == a => Err(format!(
            "the consumer is not a live group member (member id {:?}, generation {}): offsets \
             sent now would not be fenced",
            b.id, b.generation
        )),
        (Some(_), Some(_)) => {
            Err("the consumer's group membership changed while it was read".to_owned())
        }
        _ => Err("the consumer has no group membership".to_owned()),
    }
}

/// The group metadata to send a transaction's offsets with, or why there
/// is none that would fence them (the boundary then aborts and rewinds).
pub fn fenceable_metadata<C: ConsumerContext>(
    consumer: &StreamConsumer<C>,
) -> Result<ConsumerGroupMetadata, String> {
    let before = current(consumer);
    let metadata = consumer.group_metadata();
    let after = current(consumer);
    #[cfg(feature = "mutants")] // TEST-ONLY mutant: commits with any membership.
    if crate::mutants::mutant("commit-unfenced") {
        return metadata.ok_or_else(|| "no group metadata".to_owned());
    }
    judge(before.as_ref(), after.as_ref())?;
    metadata.ok_or_else(|| "the consumer has no group metadata".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: &str, generation: i32) -> Member {
        Member {
            id: id.to_owned(),
            generation,
        }
    }

    #[test]
    fn only_one_live_membership_on_both_sides_fences() {
        let live = m("rdkafka-1", 7);
        assert_eq!(judge(Some(&live), Some(&live)), Ok(()));
        // The sentinel a lost membership leaves, and its halves.
        for gone in [m("", -1), m("", 7), m("rdkafka-1", -1)] {
            let e = judge(Some(&gone), Some(&gone)).expect_err("not fenced");
            assert!(e.contains("not a live group member"), "{e}");
        }
        // Lost, or joined again, while the metadata was read.
        for (b, a) in [
            (live.clone(), m("", -1)),
            (m("", -1), live.clone()),
            (live.clone(), m("rdkafka-1", 8)),
            (live.clone(), m("rdkafka-2", 7)),
        ] {
            let e = judge(Some(&b), Some(&a)).expect_err("changed");
            assert!(e.contains("changed"), "{e}");
        }
        assert!(judge(None, Some(&live)).is_err());
        assert!(judge(Some(&live), None).is_err());
        assert!(judge(None, None).is_err());
    }
}
