//! Per-partition watermarks: the highest offset with every offset before it
//! done. Only a watermark is ever committed (G1, G5).
//!
//! Pure bookkeeping behind a mutex shared by the lanes (which mark offsets
//! begun and done), the commit timer and the rebalance callback (which
//! forgets revoked partitions so a late `done` from a revoked lane is ignored).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// The most done offsets per partition whose wait for a commit is timed.
const MAX_TIMED: usize = 4096;

#[derive(Debug, Default)]
struct Partition {
    /// Lane generation: a `done` of an older generation is ignored.
    generation: u64,
    /// Offsets begun and not yet done.
    in_flight: BTreeSet<i64>,
    /// One past the highest offset begun.
    next: Option<i64>,
    /// The last watermark committed (or handed to a commit).
    committed: Option<i64>,
    /// When each offset done and not yet handed to a commit was done (the
    /// `commit` stage of `deductor_event_stage_seconds`).
    done_at: BTreeMap<i64, Instant>,
}

impl Partition {
    fn watermark(&self) -> Option<i64> {
        self.in_flight.first().copied().or(self.next)
    }
}

/// Watermarks of every partition this process owns.
#[derive(Debug, Clone, Default)]
pub struct Offsets {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    generation: u64,
    partitions: HashMap<i32, Partition>,
    /// The ledger marker id of the Redis dataset the events are decided
    /// against, committed with every offset (docs/contract.md section 2).
    ledger: Option<String>,
}

/// The committed offsets' metadata naming ledger marker `id`.
pub fn ledger_metadata(id: &str) -> String {
    format!("ledger={id}")
}

/// The marker id a committed offset's metadata names, if any.
pub fn ledger_of(metadata: &str) -> Option<&str> {
    metadata.strip_prefix("ledger=").filter(|id| !id.is_empty())
}

impl Offsets {
    pub fn new() -> Offsets {
        Offsets::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The data stays consistent even if a holder panicked: every method
        // leaves it valid after each statement.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The Redis dataset's ledger marker (read at start and every 30 s).
    pub fn set_ledger_marker(&self, id: &str) {
        self.lock().ledger = Some(id.to_owned());
    }

    /// The metadata every commit carries: `ledger=<marker id>`, or empty
    /// before the dataset has a marker.
    pub fn commit_metadata(&self) -> String {
        self.lock()
            .ledger
            .as_deref()
            .map(ledger_metadata)
            .unwrap_or_default()
    }

    /// Starts tracking `partition` for a new lane; returns the lane's generation.
    pub fn open(&self, partition: i32) -> u64 {
        let mut g = self.lock();
        g.generation += 1;
        let generation = g.generation;
        g.partitions.insert(
            partition,
            Partition {
                generation,
                ..Partition::default()
            },
        );
        generation
    }

    /// Forgets `partition` (revoked or lost): nothing more of it is committed.
    pub fn close(&self, partition: i32) {
        self.lock().partitions.remove(&partition);
    }

    /// An event at `offset` was started (offsets begin in increasing order).
    pub fn begin(&self, partition: i32, generation: u64, offset: i64) {
        let mut g = self.lock();
        if let Some(p) = g.partitions.get_mut(&partition) {
            if p.generation == generation {
                p.in_flight.insert(offset);
                p.next = Some(p.next.map_or(offset + 1, |n| n.max(offset + 1)));
            }
        }
    }

    /// The event at `offset` is done: Redis replied and its outcome or dead
    /// letter was acknowledged.
    pub fn done(&self, partition: i32, generation: u64, offset: i64) {
        let mut g = self.lock();
        if let Some(p) = g.partitions.get_mut(&partition) {
            // (Bounded: behind an event that stays unfinished long, later
            // ones go unmeasured rather than held.)
            if p.generation == generation
                && p.in_flight.remove(&offset)
                && p.done_at.len() < MAX_TIMED
            {
                p.done_at.insert(offset, Instant::now());
            }
        }
    }

    /// True while the lane of `generation` still owns `partition` (not
    /// revoked, not closed for a rewind).
    pub fn owns(&self, partition: i32, generation: u64) -> bool {
        self.lock()
            .partitions
            .get(&partition)
            .is_some_and(|p| p.generation == generation)
    }

    /// The watermark of one partition: the offset to resume from.
    pub fn watermark(&self, partition: i32) -> Option<i64> {
        self.lock()
            .partitions
            .get(&partition)
            .and_then(Partition::watermark)
    }

    /// Watermarks that moved since the last call, marked as committed.
    /// `only` limits it to some partitions (for a revoke).
    pub fn take_commits(&self, only: Option<&[i32]>) -> Vec<(i32, i64)> {
        let mut g = self.lock();
        let mut out = Vec::new();
        for (&id, p) in g.partitions.iter_mut() {
            if only.is_some_and(|o| !o.contains(&id)) {
                continue;
            }
            if let Some(w) = p.watermark() {
                if p.committed.is_none_or(|c| w > c) {
                    p.committed = Some(w);
                    out.push((id, w));
                    let later = p.done_at.split_off(&w);
                    for at in std::mem::replace(&mut p.done_at, later).into_values() {
                        crate::metrics::stage("commit", at.elapsed().as_secs_f64());
                    }
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// A commit of these watermarks failed: offer them again next time.
    pub fn commit_failed(&self, failed: &[(i32, i64)]) {
        let mut g = self.lock();
        for (id, w) in failed {
            if let Some(p) = g.partitions.get_mut(id) {
                if p.committed == Some(*w) {
                    p.committed = None;
                }
            }
        }
    }

    /// Events in flight over all partitions.
    pub fn in_flight(&self) -> usize {
        self.lock()
            .partitions
            .values()
            .map(|p| p.in_flight.len())
            .sum()
    }

    /// Partitions currently tracked.
    pub fn partitions(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.lock().partitions.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn watermark_waits_for_the_oldest_in_flight_event() {
        let o = Offsets::new();
        let g = o.open(0);
        assert_eq!(o.watermark(0), None);
        for off in 10..15 {
            o.begin(0, g, off);
        }
        assert_eq!(o.watermark(0), Some(10));
        o.done(0, g, 12);
        o.done(0, g, 11);
        assert_eq!(o.watermark(0), Some(10), "10 is still in flight");
        o.done(0, g, 10);
        assert_eq!(o.watermark(0), Some(13));
        o.done(0, g, 14);
        o.done(0, g, 13);
        assert_eq!(o.watermark(0), Some(15));
    }

    #[test]
    fn commits_only_what_moved() {
        let o = Offsets::new();
        let g = o.open(1);
        o.begin(1, g, 0);
        assert_eq!(o.take_commits(None), vec![(1, 0)]);
        assert_eq!(o.take_commits(None), vec![]);
        o.done(1, g, 0);
        assert_eq!(o.take_commits(None), vec![(1, 1)]);
        o.commit_failed(&[(1, 1)]);
        assert_eq!(
            o.take_commits(None),
            vec![(1, 1)],
            "offered again after a failure"
        );
    }

    #[test]
    fn a_revoked_lane_cannot_move_the_new_lane() {
        let o = Offsets::new();
        let old = o.open(2);
        o.begin(2, old, 5);
        o.close(2);
        let new = o.open(2);
        o.begin(2, new, 5);
        o.done(2, old, 5);
        assert_eq!(o.watermark(2), Some(5), "old generation ignored");
        o.done(2, new, 5);
        assert_eq!(o.watermark(2), Some(6));
    }

    #[test]
    fn revoke_commits_only_the_named_partitions() {
        let o = Offsets::new();
        let a = o.open(0);
        let b = o.open(1);
        o.begin(0, a, 3);
        o.begin(1, b, 7);
        assert_eq!(o.take_commits(Some(&[1])), vec![(1, 7)]);
        assert_eq!(o.take_commits(None), vec![(0, 3)]);
    }

    proptest! {
        /// Whatever the completion order, the watermark never passes an
        /// offset that is not done, and reaches the end when all are done.
        #[test]
        fn never_passes_an_unfinished_offset(order in Just((0..40i64).collect::<Vec<_>>()).prop_shuffle()) {
            let o = Offsets::new();
            let g = o.open(0);
            for off in 0..40 {
                o.begin(0, g, off);
            }
            let mut done = BTreeSet::new();
            for off in order {
                o.done(0, g, off);
                done.insert(off);
                let w = o.watermark(0).unwrap();
                prop_assert!((0..w).all(|x| done.contains(&x)));
                prop_assert!(!done.contains(&w) || w == 40);
            }
            prop_assert_eq!(o.watermark(0), Some(40));
        }
    }
}
