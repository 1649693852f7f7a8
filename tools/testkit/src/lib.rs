//! What the benchmark (`tools/bench`), the chaos suite (`tools/chaos`) and
//! the integration tests share: both drive a real `deductor` against a real broker and Redis.
//!
//! - [`topics`]: fresh topics for a run, and reading a topic back to its end;
//! - [`service`]: the `deductor` binary as a child process;
//! - [`rng`]: the seeded PRNG their workloads are made with;
//! - [`redis_cli`]: `redis-cli` against a loopback node, and a Redis Cluster
//!   of such nodes created and waited for;
//! - [`sentinel`]: the sentinels of a replicated Redis of one's own;
//! - [`settings`]: Redis settings for a test or tool, whatever the
//!   environment says;
//! - [`proxy`]: a TCP proxy that stalls or cuts Redis replication (also
//!   used by the integration tests in `tests/it`);
//! - [`wedge_proxy`]: a TCP proxy that wedges a Redis client's connections
//!   while new ones still answer;
//! - [`kafka_wedge`]: a TCP proxy in front of a Kafka broker that wedges one
//!   transactional producer (its calls never answered) while the others flow.

pub mod alloc;
pub mod kafka_wedge;
pub mod proxy;
pub mod redis_cli;
pub mod rng;
pub mod sentinel;
pub mod service;
pub mod settings;
pub mod topics;
pub mod wedge_proxy;
