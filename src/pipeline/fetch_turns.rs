//! Fetch turns: one prefetch budget over every partition held, kept by
//! pausing partitions in turn (issue 27 item 6).
//!
//! `kafka.prefetch_budget_kib` is shared among the input topic's partitions
//! as librdkafka's per-partition bounds (`kafka::consumer::prefetch_share`).
//! Those bounds cannot hold below one floor: a broker returns a partition's
//! first record batch whole, however large (KIP-74), so every partition
//! being fetched holds one of its producers' batches (up to 1 MB from a
//! librdkafka producer). At full lag that is one batch per partition held,
//! whatever the budget. The partitions fetched at once are what bounds it:
//! this planner lets fetch only as many as the budget covers and rotates
//! the others in, a turn at a time.
//!
//! The plan is pure: the pipeline feeds it librdkafka's statistics (each
//! partition's queued bytes and whether more waits on the broker) and
//! applies its pauses and resumes. A pause drops the partition's queue
//! (librdkafka purges it and refetches from the application's position on
//! resume), so the planner pauses the partitions with the least queued, and
//! rotates only partitions whose turn is over.

use std::collections::BTreeMap;

/// What one partition may hold before its producers' batch size is seen:
/// a broker's default `message.max.bytes`, the largest batch it accepts.
pub(super) const UNSEEN_BATCH: u64 = 1024 * 1024;
/// Statistics ticks a partition fetches before another that waits may take
/// its place.
pub(super) const TURN_TICKS: u64 = 5;

pub(super) use crate::kafka::consumer::QueueSample as Sample;

/// Partitions to pause and resume, and the bytes the pauses drop (they are
/// fetched again on resume).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Plan {
    pub pause: Vec<i32>,
    pub resume: Vec<i32>,
    pub dropped: u64,
}

impl Plan {
    pub(super) fn is_empty(&self) -> bool {
        self.pause.is_empty() && self.resume.is_empty()
    }
}

#[derive(Debug, Clone, Copy)]
struct Part {
    paused: bool,
    /// The tick of its last pause or resume (or its assignment).
    since: u64,
    /// The most it was seen to queue: its producers' batch, or its share.
    batch: Option<u64>,
    queued: u64,
    behind: Option<bool>,
}

#[derive(Debug)]
pub(super) struct FetchTurns {
    budget: u64,
    /// A partition's own bounds (queue plus one fetch), the least a
    /// partition that is behind may hold.
    share: u64,
    tick: u64,
    parts: BTreeMap<i32, Part>,
}

impl FetchTurns {
    /// `budget` and `share` in bytes.
    pub(super) fn new(budget: u64, share: u64) -> FetchTurns {
        FetchTurns {
            budget,
            share,
            tick: 0,
            parts: BTreeMap::new(),
        }
    }

    pub(super) fn is_paused(&self, p: i32) -> bool {
        self.parts.get(&p).is_some_and(|x| x.paused)
    }

    pub(super) fn paused(&self) -> usize {
        self.parts.values().filter(|x| x.paused).count()
    }

    /// What a partition not seen yet is taken to hold: the largest batch
    /// seen on any partition, else [`UNSEEN_BATCH`].
    fn guess(&self) -> u64 {
        self.parts
            .values()
            .filter_map(|x| x.batch)
            .max()
            .unwrap_or(UNSEEN_BATCH)
            .max(self.share)
    }

    /// What `x` holds, or may hold before the next report, while fetched.
    fn need(&self, x: &Part) -> u64 {
        let batch = x.batch.unwrap_or_else(|| self.guess()).max(self.share);
        if x.paused || x.behind != Some(false) {
            batch.max(x.queued)
        } else {
            x.queued
        }
    }

    fn fetched(&self) -> u64 {
        self.parts
            .values()
            .filter(|x| !x.paused)
            .map(|x| self.need(x))
            .sum()
    }

    /// Newly assigned partitions (librdkafka fetches them all): those the
    /// budget does not cover are to be paused at once.
    pub(super) fn assigned(&mut self, parts: &[i32]) -> Plan {
        let since = self.tick;
        for &p in parts {
            self.parts.insert(
                p,
                Part {
                    paused: false,
                    since,
                    batch: None,
                    queued: 0,
                    behind: None,
                },
            );
        }
        let mut plan = Plan::default();
        let mut total = self.fetched();
        for &p in parts.iter().rev() {
            if total <= self.budget || self.active() <= 1 {
                break;
            }
            total -= self.pause(p, &mut plan);
        }
        plan
    }

    pub(super) fn revoked(&mut self, parts: &[i32]) {
        for p in parts {
            self.parts.remove(p);
        }
    }

    fn active(&self) -> usize {
        self.parts.values().filter(|x| !x.paused).count()
    }

    /// Pauses `p`; returns what it stops counting against the budget.
    fn pause(&mut self, p: i32, plan: &mut Plan) -> u64 {
        let Some(x) = self.parts.get(&p).copied() else {
            return 0;
        };
        let need = self.need(&x);
        plan.pause.push(p);
        plan.dropped += x.queued;
        if let Some(x) = self.parts.get_mut(&p) {
            x.paused = true;
            x.since = self.tick;
            x.queued = 0;
        }
        need
    }

    /// Resumes `p`; returns what it counts against the budget from now on.
    fn resume(&mut self, p: i32, plan: &mut Plan) -> u64 {
        plan.resume.push(p);
        let tick = self.tick;
        if let Some(x) = self.parts.get_mut(&p) {
            x.paused = false;
            x.since = tick;
        }
        self.parts.get(&p).map_or(0, |x| self.need(x))
    }

    /// One statistics report: the plan that keeps the partitions fetched
    /// within the budget and gives the waiting ones their turn.
    pub(super) fn observe(&mut self, samples: &BTreeMap<i32, Sample>) -> Plan {
        self.tick += 1;
        for (p, s) in samples {
            if let Some(x) = self.parts.get_mut(p) {
                // A paused partition's queue was purged, and its high
                // watermark is not fetched: it keeps what it had.
                if !x.paused {
                    x.queued = s.queued;
                    x.behind = s.behind;
                    if s.queued > 0 {
                        x.batch = Some(x.batch.unwrap_or(0).max(s.queued));
                    }
                }
            }
        }
        let mut plan = Plan::default();
        let mut total = self.fetched();
        // Over the budget (a batch larger than guessed): the partitions
        // with the least queued go first (the least to fetch again).
        while total > self.budget && self.active() > 1 {
            let Some(p) = self.least_queued() else {
                break;
            };
            total -= self.pause(p, &mut plan);
        }
        // The waiting partitions, longest waiting first, each resumed when
        // the budget covers it, or when partitions whose turn is over make
        // room for it. Those paused in this report wait for the next one.
        let mut waiting: Vec<(u64, i32)> = self
            .parts
            .iter()
            .filter(|(_, x)| x.paused && x.since < self.tick)
            .map(|(p, x)| (x.since, *p))
            .collect();
        waiting.sort_unstable();
        for (_, w) in waiting {
            let cost = self.parts.get(&w).map_or(self.guess(), |x| self.need(x));
            if self.active() == 0 || total + cost <= self.budget {
                total += self.resume(w, &mut plan);
                continue;
            }
            let tick = self.tick;
            let turn_over = |x: &Part| !x.paused && tick.saturating_sub(x.since) >= TURN_TICKS;
            let mut expired: Vec<(u64, i32, u64)> = self
                .parts
                .iter()
                .filter(|(_, x)| turn_over(x))
                .map(|(p, x)| (x.queued, *p, self.need(x)))
                .collect();
            expired.sort_unstable();
            let mut room = self.budget.saturating_sub(total);
            let mut take = Vec::new();
            for (_, p, need) in expired {
                if room >= cost {
                    break;
                }
                room += need;
                take.push(p);
            }
            if room < cost {
                // Not even the partitions whose turn is over make room.
                break;
            }
            for p in take {
                total -= self.pause(p, &mut plan);
            }
            total += self.resume(w, &mut plan);
        }
        plan
    }

    fn least_queued(&self) -> Option<i32> {
        self.parts
            .iter()
            .filter(|(_, x)| !x.paused)
            .min_by_key(|(p, x)| (x.queued, x.since, **p))
            .map(|(p, _)| *p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;

    fn behind(queued: u64) -> Sample {
        Sample {
            queued,
            behind: Some(true),
        }
    }

    fn caught_up(queued: u64) -> Sample {
        Sample {
            queued,
            behind: Some(false),
        }
    }

    fn all(parts: impl IntoIterator<Item = i32>, s: Sample) -> BTreeMap<i32, Sample> {
        parts.into_iter().map(|p| (p, s)).collect()
    }

    /// The partitions fetched now.
    fn fetched(t: &FetchTurns) -> Vec<i32> {
        t.parts
            .iter()
            .filter(|(_, x)| !x.paused)
            .map(|(p, _)| *p)
            .collect()
    }

    #[test]
    fn few_partitions_are_never_paused() {
        let mut t = FetchTurns::new(16 * MIB, 1280 * KIB);
        let parts: Vec<i32> = (0..6).collect();
        assert!(t.assigned(&parts).is_empty());
        for _ in 0..20 {
            assert!(t.observe(&all(0..6, behind(MIB))).is_empty());
        }
        assert_eq!(t.paused(), 0);
    }

    #[test]
    fn many_partitions_start_within_the_budget() {
        let mut t = FetchTurns::new(16 * MIB, 80 * KIB);
        let parts: Vec<i32> = (0..200).collect();
        let plan = t.assigned(&parts);
        assert_eq!(
            plan.pause.len(),
            184,
            "16 partitions of 1 MiB fit in 16 MiB"
        );
        assert_eq!(fetched(&t).len(), 16);
        assert_eq!(plan.dropped, 0);
    }

    /// With batches of 1 MiB on every partition and a budget of 8 MiB, at
    /// most 8 partitions are fetched at once, every partition gets its
    /// turns, and the bytes dropped by pauses are a small share of what
    /// the fetched partitions hold.
    #[test]
    fn large_batches_take_turns_within_the_budget() {
        let mut t = FetchTurns::new(8 * MIB, 80 * KIB);
        let parts: Vec<i32> = (0..48).collect();
        t.assigned(&parts);
        let mut turns: BTreeMap<i32, u32> = BTreeMap::new();
        for tick in 0..400u64 {
            let held: BTreeMap<i32, Sample> = fetched(&t)
                .into_iter()
                .map(|p| (p, behind(MIB - (tick * 37 + p as u64 * 101) % MIB)))
                .collect();
            let queued: u64 = held.values().map(|s| s.queued).sum();
            assert!(queued <= 8 * MIB, "tick {tick}: {queued} B fetched at once");
            let plan = t.observe(&held);
            for p in &plan.resume {
                *turns.entry(*p).or_default() += 1;
            }
            assert!(fetched(&t).len() <= 8, "tick {tick}");
            assert!(!fetched(&t).is_empty());
        }
        for p in 0..48 {
            assert!(
                turns.get(&p).copied().unwrap_or(0) >= 5,
                "partition {p} had turns {:?}",
                turns.get(&p)
            );
        }
    }

    #[test]
    fn caught_up_partitions_all_fetch_once_their_batches_are_seen() {
        let mut t = FetchTurns::new(4 * MIB, 20 * KIB);
        let parts: Vec<i32> = (0..64).collect();
        assert_eq!(t.assigned(&parts).pause.len(), 60);
        for _ in 0..4 {
            let held: BTreeMap<i32, Sample> = fetched(&t)
                .into_iter()
                .map(|p| (p, caught_up(2 * KIB)))
                .collect();
            t.observe(&held);
        }
        assert_eq!(t.paused(), 0, "small caught-up queues all fit in 4 MiB");
    }

    #[test]
    fn a_batch_larger_than_guessed_pauses_the_least_queued_first() {
        let mut t = FetchTurns::new(4 * MIB, 64 * KIB);
        t.assigned(&[0, 1, 2, 3]);
        let mut s = all(0..4, behind(MIB));
        s.insert(0, behind(3 * MIB));
        s.insert(2, behind(200 * KIB));
        let plan = t.observe(&s);
        // Needs 3 + 1 + 0.2 + 1 MiB, over 4 MiB: p2 (the least queued)
        // goes, and then p1 (of the two 1 MiB ones, the lower id).
        assert_eq!(plan.pause, vec![2, 1]);
        assert_eq!(plan.dropped, 200 * KIB + MIB);
        assert!(
            plan.resume.is_empty(),
            "those paused now wait for the next report"
        );
        assert_eq!(fetched(&t), vec![0, 3]);
    }

    #[test]
    fn one_partition_always_fetches() {
        let mut t = FetchTurns::new(64 * KIB, 16 * KIB);
        t.assigned(&[0, 1, 2]);
        assert_eq!(fetched(&t).len(), 1);
        for _ in 0..30 {
            let held: BTreeMap<i32, Sample> =
                fetched(&t).into_iter().map(|p| (p, behind(MIB))).collect();
            t.observe(&held);
            assert_eq!(fetched(&t).len(), 1);
        }
    }

    #[test]
    fn revoked_partitions_are_forgotten() {
        let mut t = FetchTurns::new(2 * MIB, 16 * KIB);
        t.assigned(&[0, 1, 2, 3]);
        assert!(t.is_paused(3));
        t.revoked(&[3]);
        assert!(!t.is_paused(3));
        assert_eq!(t.parts.len(), 3);
    }
}
