//! TEST-ONLY (cargo feature `mutants`, never shipped): deliberately broken
//! behaviours the chaos suite must catch (docs/reliability.md, "Mutants").
//! The places that break are marked `#[cfg(feature = "mutants")]` where
//! they are: `pipeline/lane.rs` (commit-early, start-below-committed), `kafka/publisher.rs`
//! (no-ack-wait), `ledger/scripts.rs` (double-deduct, forget-corrupt, coalesce-skip-check,
//! batch-promo-stale,
//! bucket-no-gift-memo),
//! `kafka/transaction.rs` (boundary-commits-past-hole), `kafka/membership.rs`
//! (commit-unfenced).

/// TEST-ONLY (cargo feature `mutants`, never shipped): true when
/// DEDUCTOR_MUTANT (read once) names this deliberately broken behaviour, so
/// the chaos suite can show that it catches it (docs/reliability.md, "Mutants").
pub(crate) fn mutant(name: &str) -> bool {
    static CHOSEN: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| std::env::var("DEDUCTOR_MUTANT").unwrap_or_default());
    *CHOSEN == name
}
