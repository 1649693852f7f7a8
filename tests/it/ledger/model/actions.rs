//! The steps of a case, as proptest strategies: placements, refunds,
//! replays, zombie deliveries and operator changes.

use super::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
pub(super) enum Action {
    Place {
        order: usize,
        t: i64,
        lines: Vec<(usize, u64, u64)>,
    },
    Refund {
        order: usize,
        lines: Vec<(usize, Option<u64>, Option<u64>)>,
        /// The refund event names another customer than the order's.
        other_customer: bool,
    },
    /// Redeliver an earlier event (index into the history).
    Replay(prop::sample::Index),
    /// An operator pauses or resumes promotion 2.
    Pause(bool),
    /// An operator sets (or removes) promotion 0's or 1's per-customer limit.
    Limit(usize, Option<u64>),
    /// An operator re-seeds a promotion while orders hold it: `promo set
    /// --force`, or (true) a delete and re-create.
    Reseed(usize, bool),
    /// Promotion 1's hash gets a corrupt field (true) or is repaired (false).
    Corrupt(bool),
    /// The record of an order on promotion 0 gets a corrupt field (true:
    /// `counted 7`, issue 23's defect 6) or is repaired (false); met by
    /// redeliveries of multi-line orders, refunds and releases.
    CorruptRecord(usize, bool),
    /// A delivery that dies after deducting the first `upto` lines of a new
    /// placement (a zombie, or a consumer killed mid-event); the event is
    /// delivered whole later by `Finish`.
    Zombie {
        order: usize,
        t: i64,
        lines: Vec<(usize, u64, u64)>,
        upto: usize,
    },
    /// Delivers an event a zombie left half done (index into those).
    Finish(prop::sample::Index),
}

pub(super) fn promo_index() -> impl Strategy<Value = usize> {
    prop_oneof![6 => 0..3usize, 1 => Just(3usize)]
}

pub(super) fn dedup<T>(lines: Vec<(usize, T, T)>) -> Vec<(usize, T, T)> {
    let mut seen = Vec::new();
    lines
        .into_iter()
        .filter(|l| {
            let new = !seen.contains(&l.0);
            seen.push(l.0);
            new
        })
        .collect()
}

pub(super) fn action() -> impl Strategy<Value = Action> {
    let times = prop::sample::select(vec![500i64, 999, 1_000, 3_000, 4_999, 5_000, 6_000]);
    let lines = || prop::collection::vec((promo_index(), 0..=40u64, 0..=2u64), 1..=3);
    let place = (0..ORDERS, times.clone(), lines()).prop_map(|(order, t, lines)| Action::Place {
        order,
        t,
        lines: dedup(lines),
    });
    let zombie = (0..ORDERS, times, lines(), 0..=2usize).prop_map(|(order, t, lines, upto)| {
        Action::Zombie {
            order,
            t,
            lines: dedup(lines),
            upto,
        }
    });
    let amount = |max: u64| prop_oneof![Just(None), (0..=max).prop_map(Some)];
    let refund = (
        0..ORDERS,
        prop::collection::vec((promo_index(), amount(40), amount(2)), 1..=3),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(order, lines, other_customer)| Action::Refund {
            order,
            lines: dedup(lines),
            other_customer,
        });
    let limit = (
        0..2usize,
        prop_oneof![Just(None), (1..=3u64).prop_map(Some)],
    )
        .prop_map(|(p, n)| Action::Limit(p, n));
    prop_oneof![
        6 => place,
        3 => refund,
        3 => any::<prop::sample::Index>().prop_map(Action::Replay),
        1 => any::<bool>().prop_map(Action::Pause),
        1 => limit,
        1 => (0..3usize, any::<bool>()).prop_map(|(p, recreate)| Action::Reseed(p, recreate)),
        1 => any::<bool>().prop_map(Action::Corrupt),
        1 => (0..ORDERS, prop::bool::weighted(0.6)).prop_map(|(o, on)| Action::CorruptRecord(o, on)),
        1 => zombie,
        1 => any::<prop::sample::Index>().prop_map(Action::Finish),
    ]
}
