//! What the ledger decided for one event: the input of `outcome`.

use std::fmt;

use super::event::Id;

/// Why a line or an event was rejected. The names are the contract's
/// (section 4) and appear verbatim in outcomes and in Redis memos.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    BudgetExceeded,
    StockInsufficient,
    UserLimitReached,
    PromotionNotFound,
    PromotionInactive,
    OrderReverted,
    NoDeduction,
    AlreadyReverted,
    ExceedsDeducted,
    InvalidEvent,
    CorruptPromotion,
}

impl Reason {
    pub const ALL: [Reason; 11] = [
        Reason::BudgetExceeded,
        Reason::StockInsufficient,
        Reason::UserLimitReached,
        Reason::PromotionNotFound,
        Reason::PromotionInactive,
        Reason::OrderReverted,
        Reason::NoDeduction,
        Reason::AlreadyReverted,
        Reason::ExceedsDeducted,
        Reason::InvalidEvent,
        Reason::CorruptPromotion,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BudgetExceeded => "budget_exceeded",
            Reason::StockInsufficient => "stock_insufficient",
            Reason::UserLimitReached => "user_limit_reached",
            Reason::PromotionNotFound => "promotion_not_found",
            Reason::PromotionInactive => "promotion_inactive",
            Reason::OrderReverted => "order_reverted",
            Reason::NoDeduction => "no_deduction",
            Reason::AlreadyReverted => "already_reverted",
            Reason::ExceedsDeducted => "exceeds_deducted",
            Reason::InvalidEvent => "invalid_event",
            Reason::CorruptPromotion => "corrupt_promotion",
        }
    }

    pub fn parse(s: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is left of a promotion after a script ran; `None` is unlimited (or,
/// for a deleted promotion, unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Remaining {
    pub budget: Option<u64>,
    pub stock: Option<u64>,
}

/// One deducted line of an accepted placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedLine {
    pub promotion_id: Id,
    /// Amounts deducted (for a duplicate: as first deducted).
    pub budget: u64,
    pub stock: u64,
    pub remaining: Remaining,
}

/// The decision for an `OrderPlaced`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlaceDecision {
    Accepted {
        /// Every line was already deducted (a replay was absorbed).
        duplicate: bool,
        lines: Vec<AcceptedLine>,
    },
    Rejected {
        /// The rejection was read back from the event's stored memo.
        duplicate: bool,
        reason: Reason,
        /// The failing line's promotion.
        promotion_id: Id,
    },
}

/// The result of one line of an `OrderRefunded`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundLineResult {
    pub promotion_id: Id,
    /// `Ok(())` is `applied`.
    pub status: Result<(), Reason>,
    /// Replayed from the line's stored result.
    pub duplicate: bool,
    /// Amounts returned to the promotion (0 when rejected).
    pub budget: u64,
    pub stock: u64,
    pub remaining: Remaining,
}

/// The decision for an `OrderRefunded`: one result per line, in line order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundDecision {
    pub lines: Vec<RefundLineResult>,
}

impl RefundDecision {
    /// `RollbackApplied` when at least one line was applied.
    pub fn applied(&self) -> bool {
        self.lines.iter().any(|l| l.status.is_ok())
    }

    /// The first line's reason, for `RollbackRejected`.
    pub fn first_reason(&self) -> Option<Reason> {
        self.lines.iter().find_map(|l| l.status.err())
    }

    pub fn duplicate(&self) -> bool {
        !self.lines.is_empty() && self.lines.iter().all(|l| l.duplicate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_names_round_trip() {
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(r));
        }
        assert_eq!(Reason::parse("nope"), None);
    }
}
