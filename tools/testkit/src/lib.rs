//! What the benchmark (`tools/bench`) and the chaos suite (`tools/chaos`)
//! share: both drive a real `deductor` against a real broker and Redis.
//!
//! - [`topics`]: fresh topics for a run, and reading a topic back to its end;
//! - [`service`]: the `deductor` binary as a child process;
//! - [`rng`]: the seeded PRNG their workloads are made with.

pub mod rng;
pub mod service;
pub mod topics;
