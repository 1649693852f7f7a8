//! Every branch of lua/deduct.lua, release.lua, rollback.lua and memo.lua,
//! through the Ledger API against the real Redis (raw EVAL where the API
//! cannot reach a branch). Each test owns a key prefix.
//!
//! - `placement`: deduct.lua's decisions on one line, and their replays;
//! - `refund`: rollback.lua, partial and full, and its replays;
//! - `multi_line`: orders of several promotions, all or nothing (release.lua);
//! - `corrupt`: corrupt stored values and keys of the wrong type;
//! - `errors`: bad arguments, NOSCRIPT and connection errors;
//! - `promo_set`: `promo set` as the scripts read it;
//! - `batch`: deduct_batch.lua decides as deduct.lua one line at a time;
//! - `coalesce`: the same for coalesced batches, with refunds, releases,
//!   operator changes and corrupt data between batches (a property test).

mod batch;
mod coalesce;
mod corrupt;
mod errors;
mod multi_line;
mod placement;
mod promo_set;
mod refund;

use crate::common::redis::TestRedis;
use deductor::domain::decision::{PlaceDecision, Remaining};

const T: i64 = 1_800_000_000;

/// Seeds promotion `p` with a budget of 100, a stock of 5 and at most
/// `per_customer` counted orders a customer.
async fn seed_limited(r: &TestRedis, p: &str, per_customer: &str) {
    r.seed(
        p,
        &[
            ("budget", "100"),
            ("stock", "5"),
            ("per_customer", per_customer),
        ],
    )
    .await;
}

fn accepted(d: &PlaceDecision) -> (bool, Vec<(u64, u64, Remaining)>) {
    match d {
        PlaceDecision::Accepted { duplicate, lines } => (
            *duplicate,
            lines
                .iter()
                .map(|l| (l.budget, l.stock, l.remaining))
                .collect(),
        ),
        other => panic!("expected accepted, got {other:?}"),
    }
}

fn left(budget: Option<u64>, stock: Option<u64>) -> Remaining {
    Remaining { budget, stock }
}
