//! The integration tests: one test binary (`cargo test --test it`), against
//! the real Kafka broker and Redis servers of `scripts/dev-stack`, organised
//! by subject. Filter by module path: `scripts/test ledger::`,
//! `scripts/test service::outages`, `scripts/test ops::cli::`.
//!
//! - `ledger`: the Lua scripts through the `Ledger` API on standalone Redis,
//!   the Cluster and replicated Redis (their own servers), the model and the
//!   script fuzzer, and the bucket protocol's model (pure: issue 28's
//!   design, docs/buckets.md);
//! - `service`: the service in-process or as a child process, end to end
//!   through Kafka, under faults and outages, its metrics and security;
//! - `ops`: the `deductor` binary as an operator uses it;
//! - `contract`: the published schemas against the parser and the outcomes.
//!
//! One binary links once (sixteen did before) and shares one process, so
//! tests that take a shared server down (the broker outages of
//! `service::outages`, `service::shutdown`, `service::hung_transaction`)
//! hold [`common::stack_exclusive`] while every test on the shared servers
//! holds a [`common::stack_shared`] guard (taken by `Fixture::new` and the
//! `common::redis` ledgers). Nothing else runs while an exclusive test
//! does, so a test that only needs to kill, restart or freeze Redis does it
//! to a server of its own ([`common::own_redis::OwnRedis`]) instead.

mod common;
mod contract;

mod ledger {
    mod buckets;
    mod cluster;
    mod edges;
    mod interleaving;
    mod model;
    mod replication;
    mod script_fuzz;
    mod scripts;
    pub(crate) mod upgrade;
}

mod ops {
    mod cli;
    mod http_limits;
}

mod service {
    mod bucketed;
    mod consumer_e2e;
    mod consumer_faults;
    mod corrupt_release;
    mod handover;
    mod hostile_input;
    mod hung_transaction;
    mod metrics;
    mod outages;
    mod prefetch;
    mod redis_oom;
    mod secret_files;
    mod security;
    mod shutdown;
    mod slot_migration;
    mod unstable_start;
    mod upgrade;
    mod wedged_client;
    mod zombie_fencing;
}
