//! Redis: the scripts and the order-level logic around them. This module
//! is the only one that speaks to Redis (and imports fred).
//!
//! One script call decides one line atomically: [`calls`] builds it (keys
//! and ARGV, pure), [`scripts`] sends it, [`reply`] decodes its reply into
//! types. [`order`] makes orders out of lines; [`promo`] runs the
//! operator's promotion scripts; [`store`] holds the plain reads of the
//! operator tools (SCAN, hashes, `INFO`); [`connect`] builds the pool and
//! [`durability`] the replication gate. Every command of one order goes
//! over one pooled connection (chosen by the order id), and its writes are
//! awaited one after another.

mod batch;
pub mod bucketed;
pub mod buckets;
pub mod calls;
pub mod connect;
pub mod durability;
pub mod error;
pub mod marker;
pub mod order;
pub mod promo;
pub mod redrive;
pub mod reply;
pub mod scripts;
pub mod sentinel;
pub mod store;
pub mod wedge;

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{Client, ClientLike, LuaInterface, Pool, Value};

use crate::domain::event::{Header, Id};
use crate::domain::keys::Keys;

use calls::{Call, Ttls};
pub use connect::fred_config;
pub use error::{classify, ErrorClass, LedgerError};

/// The Redis side of deductor. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct Ledger {
    pool: Pool,
    shared: Arc<Shared>,
}

struct Shared {
    keys: Keys,
    ttl: Ttls,
    slow_script: Duration,
    /// The durability gate ([`durability`]): 0 = off.
    wait_replicas: u32,
    wait_timeout: Duration,
    command_timeout: Duration,
    /// Placement lines batched into deduct_batch.lua calls ([`batch`]).
    batcher: Option<batch::Batcher>,
    /// Memo reads of multi-line placements batched into memo_batch.lua
    /// calls, wherever placement lines are batched.
    memo_batcher: Option<batch::Batcher>,
    /// Refund lines batched into rollback_batch.lua calls, likewise.
    rollback_batcher: Option<batch::Batcher>,
    /// Releases of rejected placements' lines batched into
    /// release_batch.lua calls, likewise.
    release_batcher: Option<batch::Batcher>,
    /// The calls' timeouts, for the wedge watchdog ([`wedge`]).
    wedge: Arc<wedge::Wedge>,
    /// The bucketed promotions met so far, with their layouts ([`bucketed`]).
    layouts: std::sync::Mutex<std::collections::HashMap<Id, Arc<bucketed::Layout>>>,
    /// The TTL of every key a bucket walk writes but the bucket hashes
    /// (`redis.record_ttl_secs`).
    bucket_ttl_secs: u64,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("prefix", &self.shared.keys.prefix())
            .field("pool_size", &self.pool.size())
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// The key layout under this ledger's prefix.
    pub fn keys(&self) -> &Keys {
        &self.shared.keys
    }

    /// The underlying pool, for admin tools (audit scans) and tests.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// One round trip, for readiness.
    pub async fn ping(&self) -> Result<(), LedgerError> {
        self.pool
            .ping::<Value>(None)
            .await
            .map(drop)
            .map_err(|e| LedgerError::redis("ping", e))
    }

    /// `SCRIPT LOAD`s every script on every primary (for `deductor check`
    /// and startup; calls would load them lazily anyway).
    pub async fn load_scripts(&self) -> Result<(), LedgerError> {
        for script in scripts::all() {
            self.pool
                .script_load_cluster::<Value, _>(script.body)
                .await
                .map_err(|e| LedgerError::redis("script_load", e))?;
        }
        Ok(())
    }

    /// The record of the calls' timeouts the wedge watchdog reads.
    pub fn wedge(&self) -> Arc<wedge::Wedge> {
        self.shared.wedge.clone()
    }

    /// Reconnects every connection of the pool (and re-reads a Cluster's
    /// slot map): the wedge watchdog's remedy.
    pub async fn reconnect(&self) {
        if let Err(e) = self.pool.force_reconnection().await {
            tracing::warn!(error = %e, "reconnecting the redis pool failed");
        }
    }

    /// Closes every connection.
    pub async fn quit(&self) {
        let _ = self.pool.quit().await;
    }

    /// The connection that carries every command of `order`: an order's
    /// commands are sent in order over one connection (and its concurrent
    /// memo lookups go out in one write); orders spread over the pool.
    fn connection(&self, order: &Id) -> &Client {
        let clients = self.pool.clients();
        let mut h = std::hash::DefaultHasher::new();
        order.as_str().hash(&mut h);
        &clients[(h.finish() % clients.len() as u64) as usize]
    }

    /// Runs one script for promotion `p`, timed: over the order's connection
    /// when `order` is given, else over any connection of the pool.
    pub(crate) async fn run(
        &self,
        call: Call,
        order: Option<&Id>,
        p: &Id,
    ) -> Result<Value, LedgerError> {
        let script = call.script;
        let client = match order {
            Some(o) => self.connection(o),
            None => self.pool.next(),
        };
        let (result, slow) = scripts::eval_timed(client, call, self.shared.slow_script).await;
        if let Some(took) = slow {
            tracing::warn!(
                script = script.name,
                promotion = %p,
                elapsed_ms = took.as_millis() as u64,
                "slow Redis script"
            );
        }
        let result = result.map_err(|e| LedgerError::redis(script.name, e));
        self.shared.wedge.observe(&result);
        result
    }

    /// `call` through `batcher` when there is one (a single Redis or a
    /// Sentinel primary without the gate), else as its own call ([`Self::run`]).
    async fn batched(
        &self,
        batcher: Option<&batch::Batcher>,
        call: Call,
        order: &Id,
        p: &Id,
    ) -> Result<Value, LedgerError> {
        match batcher {
            Some(b) => {
                let result = b.call(call).await;
                self.shared.wedge.observe(&result);
                result
            }
            None => self.run(call, Some(order), p).await,
        }
    }

    fn report_corrupt(&self, h: &Header, p: &Id, err: &LedgerError) {
        tracing::error!(
            promotion = %p,
            order = %h.order_id,
            event = %h.event_id,
            error = %err,
            "corrupt promotion data; the line is rejected corrupt_promotion (remembered for a placement)"
        );
        crate::metrics::corrupt_data();
    }
}
