//! deductor: applies promotion deductions from a Kafka event stream, exactly.
//!
//! Layout (data flows one way: Kafka in -> pure decisions -> Redis -> Kafka
//! out -> offset; only [`pipeline`] knows the order of the steps):
//! - [`domain`]: pure parsing, key layout, decisions and outcome JSON.
//! - [`ledger`]: the Lua scripts and the order-level logic around them.
//! - [`kafka`]: consumer group, offset watermarks, outcome/dead-letter producer.
//! - [`pipeline`]: consume -> decide -> apply -> publish -> mark done.
//! - [`config`], [`cli`], [`telemetry`], [`shutdown`], [`retry`], [`error`],
//!   [`exit`]: plumbing (exit codes of the commands).
//! - [`ops`]: HTTP metrics and health; [`admin`]: promo set/show, audit, publish.

pub mod admin;
pub mod build_info;
pub mod cli;
pub mod commands;
pub mod config;
pub mod domain;
pub mod error;
pub mod exit;
pub mod kafka;
pub mod ledger;
pub mod metrics;
#[cfg(feature = "mutants")]
mod mutants;
pub mod ops;
pub mod pipeline;
pub mod retry;
pub mod shutdown;
pub mod telemetry;
