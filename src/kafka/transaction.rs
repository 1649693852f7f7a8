//! `kafka.delivery = "exactly_once"`: outcomes, dead letters and the
//! consumed offsets commit in one Kafka transaction (KIP-98), fenced by the
//! consumer group's generation (KIP-447). This replaces [`super::commit`].
//!
//! - **The boundary.** Every `transaction_interval_ms` the pipeline takes
//!   [`Transactions::boundary`]: it closes the gate (no event starts), waits
//!   for every started event to finish, sends the watermarks with the
//!   group's metadata, commits, and opens the next transaction. With every
//!   started event finished, each partition's watermark is one past its
//!   last outcome: a committed transaction never holds the outcome of an
//!   offset above the committed position.
//! - **Tickets.** An event starts with a [`Ticket`]: the transaction epoch
//!   and its lane's generation. An outcome is queued only while both are
//!   current ([`Transactions::admit`]), checked under the epoch's lock, so
//!   nothing of an event from before an abort (or of a revoked lane) can
//!   enter the next transaction.
//! - **Aborts.** A revoke (eager assignors only: every partition is given up
//!   and resumes from the committed offsets) aborts in the rebalance
//!   callback. Any other failure (a failed produce, a commit the broker
//!   refuses, a fenced zombie) dooms the transaction: the next boundary
//!   aborts it and asks the pipeline to rejoin the group, which rewinds
//!   every partition to its committed offset. A fatal producer error stops
//!   the service. The scripts' idempotency absorbs the reprocessing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, Producer};
use tokio::sync::{OwnedRwLockReadGuard, RwLock as Gate};

use super::commit::commit_list;
use super::offsets::Offsets;
use super::publisher::PublisherContext;
use crate::metrics;

/// What an event carries to publish inside the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    epoch: u64,
    partition: i32,
    generation: u64,
}

/// How a boundary ended.
#[derive(Debug)]
pub enum Boundary {
    /// Committed (or nothing to commit): the next transaction is open.
    Committed,
    /// Aborted: every partition must resume from its committed offset.
    Rewind(String),
}

/// The transactional side of the producer; shared by the pipeline, the
/// lanes (tickets), the publisher (admission) and the rebalance callback.
pub struct Transactions {
    producer: FutureProducer<PublisherContext>,
    offsets: Offsets,
    topic: String,
    /// Bumped by every abort; read-locked around each enqueue.
    epoch: RwLock<u64>,
    /// Serialises the producer's transaction calls.
    ops: Mutex<()>,
    /// Events hold a read guard from start to finish; a boundary takes it
    /// for writing.
    gate: Arc<Gate<()>>,
    /// Something in this transaction failed: abort, do not commit.
    doomed: AtomicBool,
    timeout: Duration,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Transactions {
    /// Registers the `transactional.id` with the coordinator (fencing and
    /// aborting an earlier process's open transaction under the same id)
    /// and opens the first transaction. Blocking.
    pub fn init(
        producer: FutureProducer<PublisherContext>,
        offsets: Offsets,
        topic: &str,
        timeout: Duration,
    ) -> Result<Transactions, KafkaError> {
        producer.init_transactions(timeout)?;
        producer.begin_transaction()?;
        Ok(Transactions {
            producer,
            offsets,
            topic: topic.to_owned(),
            epoch: RwLock::new(0),
            ops: Mutex::new(()),
            gate: Arc::new(Gate::new(())),
            doomed: AtomicBool::new(false),
            timeout,
        })
    }

    fn epoch(&self) -> u64 {
        *self.epoch.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until no boundary is going on; the guard keeps the next one
    /// waiting until the event is finished.
    pub async fn enter(&self) -> OwnedRwLockReadGuard<()> {
        self.gate.clone().read_owned().await
    }

    /// The ticket of an event of `partition` started now by a lane of
    /// `generation`.
    pub fn ticket(&self, partition: i32, generation: u64) -> Ticket {
        Ticket {
            epoch: self.epoch(),
            partition,
            generation,
        }
    }

    /// Runs `enqueue` iff `ticket` is still current (no abort since it was
    /// issued, its lane still owns the partition, the transaction is not
    /// doomed). The check and the enqueue are atomic with respect to an
    /// abort. `None` when it is stale.
    pub fn admit<R>(&self, ticket: &Ticket, enqueue: impl FnOnce() -> R) -> Option<R> {
        let epoch = self.epoch.read().unwrap_or_else(|p| p.into_inner());
        let current = *epoch == ticket.epoch
            && !self.doomed.load(Ordering::SeqCst)
            && self.offsets.owns(ticket.partition, ticket.generation);
        current.then(enqueue)
    }

    /// A produce of this transaction failed: it can only be aborted. A
    /// failure of an aborted one (its messages are purged) changes nothing.
    pub fn doom(&self, ticket: &Ticket, why: &str) {
        let epoch = self.epoch.read().unwrap_or_else(|p| p.into_inner());
        if *epoch == ticket.epoch && !self.doomed.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                reason = why,
                "transaction doomed: the next boundary aborts it and rewinds"
            );
        }
    }

    /// Aborts the open transaction and opens the next: called with `ops`
    /// held. Partitions whose outcomes were in it must have been closed
    /// in [`Offsets`] (revoked, or all of them for a rewind) before.
    fn abort_locked(&self, why: &str, deadline: Option<Instant>) -> Result<(), KafkaError> {
        *self.epoch.write().unwrap_or_else(|p| p.into_inner()) += 1;
        retrying(deadline, || self.producer.abort_transaction(self.timeout))?;
        self.doomed.store(false, Ordering::SeqCst);
        self.producer.begin_transaction()?;
        metrics::transaction("aborted");
        tracing::info!(reason = why, "transaction aborted");
        Ok(())
    }

    /// The rebalance callback's abort: `parts` are revoked (every partition,
    /// with an eager assignor) and closed first, so no event of theirs can
    /// publish into the next transaction. Blocking.
    pub fn abort_on_revoke(&self, parts: &[i32]) -> Result<(), KafkaError> {
        for p in parts {
            self.offsets.close(*p);
        }
        let _ops = lock(&self.ops);
        self.abort_locked("partitions revoked", None)
    }

    /// The end of one transaction and the start of the next; see the
    /// module comment. `metadata` is the group's, read just before.
    /// `Err` only for what the service cannot go on from.
    pub async fn boundary(
        self: &Arc<Self>,
        metadata: impl FnOnce() -> Option<ConsumerGroupMetadata>,
    ) -> Result<Boundary, KafkaError> {
        let gate = self.gate.clone().write_owned().await;
        let metadata = metadata();
        let this = self.clone();
        let result = tokio::task::spawn_blocking(move || {
            let _gate = gate;
            this.commit_or_abort(metadata, None)
        })
        .await;
        match result {
            Ok(r) => r,
            Err(e) => Err(KafkaError::Canceled).inspect_err(|_| {
                tracing::error!(error = %e, "transaction boundary task failed");
            }),
        }
    }

    /// `deadline`: None waits out a broker outage as long as it lasts
    /// (events wait meanwhile, as they do for their produces).
    fn commit_or_abort(
        &self,
        metadata: Option<ConsumerGroupMetadata>,
        deadline: Option<Instant>,
    ) -> Result<Boundary, KafkaError> {
        let _ops = lock(&self.ops);
        if self.doomed.load(Ordering::SeqCst) {
            return self.rewind("a produce in the transaction failed", deadline);
        }
        let commits = self.offsets.take_commits(None);
        if commits.is_empty() {
            return Ok(Boundary::Committed);
        }
        let Some(metadata) = metadata else {
            return self.rewind("no consumer group metadata (not in the group)", deadline);
        };
        let list = commit_list(&self.topic, &commits)?;
        let sent = retrying(deadline, || {
            self.producer
                .send_offsets_to_transaction(&list, &metadata, self.timeout)
        });
        if let Err(e) = sent {
            return self.failed("sending the offsets to the transaction", e, deadline);
        }
        if let Err(e) = retrying(deadline, || self.producer.commit_transaction(self.timeout)) {
            return self.failed("committing the transaction", e, deadline);
        }
        self.producer.begin_transaction()?;
        metrics::transaction("committed");
        metrics::commit(true);
        tracing::debug!(?commits, "transaction committed");
        Ok(Boundary::Committed)
    }

    /// A transaction call failed: fatal errors stop the service, any other
    /// aborts and rewinds (e.g. a zombie fenced by the group generation).
    fn failed(
        &self,
        what: &str,
        e: KafkaError,
        deadline: Option<Instant>,
    ) -> Result<Boundary, KafkaError> {
        metrics::commit(false);
        if fatal(&e) {
            tracing::error!(error = %e, "{what}: fatal");
            return Err(e);
        }
        self.rewind(&format!("{what}: {e}"), deadline)
    }

    /// Aborts after closing every partition: the pipeline rejoins the group.
    fn rewind(&self, why: &str, deadline: Option<Instant>) -> Result<Boundary, KafkaError> {
        for p in self.offsets.partitions() {
            self.offsets.close(p);
        }
        self.abort_locked(why, deadline)?;
        Ok(Boundary::Rewind(why.to_owned()))
    }

    /// At shutdown, after the drain: commits when every started event
    /// finished and nothing failed, else aborts; gives up after `limit`
    /// (the broker then aborts it after transaction.timeout.ms). Blocking.
    pub fn finish(&self, metadata: Option<ConsumerGroupMetadata>, limit: Duration) {
        let deadline = Some(Instant::now() + limit);
        let clean = self.offsets.in_flight() == 0 && !self.doomed.load(Ordering::SeqCst);
        let result = if clean {
            self.commit_or_abort(metadata, deadline).map(|_| ())
        } else {
            let _ops = lock(&self.ops);
            self.abort_locked("shutdown with unfinished events", deadline)
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "last transaction at shutdown; its events are redone by the next owner");
        }
    }
}

/// Retries `op` while its error is retriable (librdkafka: "retry call to
/// resume"), until `deadline` if any.
fn retrying(
    deadline: Option<Instant>,
    mut op: impl FnMut() -> Result<(), KafkaError>,
) -> Result<(), KafkaError> {
    loop {
        match op() {
            Err(e) if retriable(&e) && deadline.is_none_or(|d| Instant::now() < d) => {
                tracing::warn!(error = %e, "transaction call not done yet (broker unreachable?); retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

fn retriable(e: &KafkaError) -> bool {
    matches!(e, KafkaError::Transaction(t) if t.is_retriable())
}

fn fatal(e: &KafkaError) -> bool {
    match e {
        KafkaError::Transaction(t) => t.is_fatal(),
        _ => false,
    }
}
