//! Shared helpers of the integration tests: locate the real services through
//! env vars with loopback defaults (see `scripts/dev-stack env`).
#![allow(dead_code)]

pub mod contract;
pub mod kafka;
pub mod redis;
pub mod replication;
pub mod service;
pub mod workload;
