//! Pure domain logic: no I/O, no async.

pub mod buckets;
pub mod decision;
pub mod event;
pub mod keys;
pub mod outcome;
pub mod stored;
