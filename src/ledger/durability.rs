//! The durability gate (`redis.wait_replicas`): an event is done only when
//! Redis `WAIT` says enough replicas have every write of its scripts.
//!
//! Replication is asynchronous: a write the primary acknowledged can be
//! missing from the replica a failover promotes, and the offset committed
//! after it would make that deduction vanish (oversell, refunds without a
//! record). `WAIT N timeout` blocks until N replicas acknowledged every
//! earlier write *of the same connection*; the ledger sends all of an
//! order's commands over one pooled connection ([`Ledger::connection`]), so
//! one `WAIT` there after the scripts covers the whole event (and any event
//! pipelined before it on that connection). On a Cluster the writes of a
//! line go to the node of its promotion's slot, so one `WAIT` goes to each
//! node the event wrote to, routed by that slot.
//!
//! Two cases are not confirmations, and are retried like a Redis outage (the
//! event is never skipped and never committed; rerunning its scripts is
//! harmless, the records make them idempotent):
//! - a short count (fewer than N replicas within `redis.wait_timeout_ms`);
//! - a connection that changed between the event's first command and the
//!   `WAIT` (a reconnect, e.g. to a newly promoted primary): a `WAIT` on a
//!   fresh connection covers none of the writes made on the old one, so its
//!   count would prove nothing.
//!
//! Not covered: writes an *earlier attempt* made on another connection and
//! that a retry finds already present (it writes nothing then): the retry's
//! `WAIT` confirms only what its own connection wrote. That needs a second
//! failover within the replication lag of the first to lose anything.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use fred::prelude::{
    Client, ClientInterface, ClientLike, ClusterInterface, Options, Server, ServerInterface,
};
use fred::types::ClusterHash;

use super::{Ledger, LedgerError};
use crate::domain::event::Id;

/// Taken before an event's first command: which connection (per server,
/// by `CLIENT ID`) the order's commands go over. `None` when the gate is off.
#[derive(Debug)]
pub(crate) struct Gate {
    order: Id,
    connections: HashMap<Server, i64>,
}

impl Ledger {
    /// Warns when the gate is on but cannot see reconnects: fred learns a
    /// connection's `CLIENT ID` at connect and carries on without it when
    /// refused (an ACL user without `+client|id`).
    pub(crate) fn check_gate(&self) {
        if self.shared.wait_replicas > 0
            && self
                .pool
                .clients()
                .iter()
                .any(|c| c.connection_ids().is_empty())
        {
            tracing::warn!(
                "redis.wait_replicas is on but CLIENT ID is refused: the durability gate cannot \
                 tell a reconnect (e.g. to a new primary) from the connection that wrote; \
                 grant the Redis user +client|id (docs/operations.md)"
            );
        }
    }

    /// Opens the gate for one event of `order` (before its first command).
    pub(crate) fn gate(&self, order: &Id) -> Option<Gate> {
        (self.shared.wait_replicas > 0).then(|| Gate {
            order: order.clone(),
            connections: self.connection(order).connection_ids(),
        })
    }

    /// The gate's settings, `None` when it is off.
    pub(crate) fn wait_policy(&self) -> Option<WaitPolicy> {
        (self.shared.wait_replicas > 0).then(|| WaitPolicy {
            replicas: self.shared.wait_replicas,
            timeout: self.shared.wait_timeout,
            command_timeout: self.shared.command_timeout,
        })
    }

    /// Returns once `redis.wait_replicas` replicas have every write the
    /// event made on the nodes of `promotions`; else a retryable
    /// [`LedgerError::NotDurable`]. A no-op when the gate is off.
    pub(crate) async fn durable<'a>(
        &self,
        gate: Option<Gate>,
        promotions: impl IntoIterator<Item = &'a Id>,
    ) -> Result<(), LedgerError> {
        let (Some(gate), Some(policy)) = (gate, self.wait_policy()) else {
            return Ok(());
        };
        let client = self.connection(&gate.order);
        let slots = wait_slots(client, self.written_keys(promotions));
        let subject = gate.order.to_string();
        confirm(
            client,
            policy,
            &slots,
            &gate.connections,
            "the event",
            &subject,
        )
        .await
    }
}

/// The durability gate's settings: `redis.wait_replicas`, its timeout,
/// and the usual command timeout (the `WAIT`'s reply may take both).
#[derive(Clone, Copy, Debug)]
pub struct WaitPolicy {
    /// `redis.wait_replicas`.
    pub replicas: u32,
    /// `redis.wait_timeout_ms`.
    pub timeout: Duration,
    /// The usual command timeout, added to the WAIT's own.
    pub command_timeout: Duration,
}

/// One `WAIT` per slot of `slots` (`None`: on the connection, not routed)
/// over `client`, in parallel; `Ok` when each counts `policy.replicas`
/// replicas and `client`'s connections are still `connections` (those that
/// made the writes), else a retryable [`LedgerError::NotDurable`] naming
/// `what` was not confirmed (`subject`, the order or key, goes to the log).
/// The one place the gate's `WAIT`s are sent: the event's gate
/// ([`Ledger::durable`]) and a bucket walk's step gate
/// (`ledger::buckets::Buckets::call`) both call it.
pub(crate) async fn confirm(
    client: &Client,
    policy: WaitPolicy,
    slots: &[Option<u16>],
    connections: &HashMap<Server, i64>,
    what: &str,
    subject: &str,
) -> Result<(), LedgerError> {
    let wanted = i64::from(policy.replicas);
    let timeout_ms = policy.timeout.as_millis() as i64;
    let options = |slot: Option<u16>| Options {
        cluster_hash: slot.map(ClusterHash::Custom),
        // The reply may take the whole WAIT timeout, then the usual.
        timeout: Some(policy.timeout + policy.command_timeout),
        // Resent after a reconnect it would cover nothing: fail instead.
        max_attempts: Some(1),
        ..Options::default()
    };
    let start = Instant::now();
    let waits = slots.iter().map(|&slot| {
        let client = client.with_options(&options(slot));
        async move { client.wait::<i64>(wanted, timeout_ms).await }
    });
    let replies = futures::future::join_all(waits).await;
    crate::metrics::redis_wait(start.elapsed().as_secs_f64());
    let mut acked = i64::MAX;
    for reply in replies {
        acked = acked.min(reply.map_err(|e| LedgerError::redis("wait", e))?);
    }
    let detail = if acked < wanted {
        format!(
            "{acked} of {wanted} replicas have {what}'s writes after {timeout_ms} ms \
             (redis.wait_replicas); the event is retried"
        )
    } else if client.connection_ids() != *connections {
        format!(
            "the connection changed under {what} (a reconnect or failover), so WAIT \
             cannot vouch for its writes; the event is retried"
        )
    } else {
        return Ok(());
    };
    crate::metrics::redis_wait_shortfall();
    tracing::warn!(subject, detail, "durability gate: {what} not confirmed");
    Err(LedgerError::not_durable(detail))
}

/// Where the `WAIT`s go: on a Cluster one slot per node `keys` (a key of
/// each slot the event wrote: a plain promotion's hash, every bucket of a
/// bucketed one) live on (`Some(slot)` routes the `WAIT` like a key of that slot);
/// elsewhere one `WAIT` on the connection (`None`).
fn wait_slots(client: &Client, keys: Vec<String>) -> Vec<Option<u16>> {
    if !client.is_clustered() {
        return vec![None];
    }
    let routing = client.cached_cluster_state();
    let mut nodes = BTreeSet::new();
    let mut slots = Vec::new();
    for key in keys {
        let slot = fred::util::redis_keyslot(key.as_bytes());
        // Unknown routing (being refreshed): one WAIT per slot is still right.
        let node = routing
            .as_ref()
            .and_then(|r| r.get_server(slot))
            .map(|s| s.to_string())
            .unwrap_or_else(|| format!("slot {slot}"));
        if nodes.insert(node) {
            slots.push(Some(slot));
        }
    }
    if slots.is_empty() {
        // No line (cannot happen for a parsed event): nothing was written.
        return Vec::new();
    }
    slots
}
