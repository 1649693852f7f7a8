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
//!   every partition to its committed offset. The scripts' idempotency
//!   absorbs the reprocessing.
//! - **A new producer.** Some failures leave the producer itself unusable
//!   (librdkafka's fatal errors: its epoch was bumped by the broker when
//!   the transaction outlived `transaction.timeout.ms`, e.g. while a Redis
//!   outage held its events, or it was fenced). The next boundary then
//!   replaces it ([`Transactions::renew_locked`]): a new producer under the
//!   same `transactional.id` (its `init_transactions` aborts whatever the
//!   old one left open), swapped in for every sender, and a rewind as
//!   above. Only a producer that cannot be created or registered at all
//!   (configuration, authorization) stops the service.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rdkafka::error::KafkaResult;

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

/// The producer every sender uses; replaced as a whole by a renewal.
pub type ProducerSlot = Arc<RwLock<FutureProducer<PublisherContext>>>;

/// Creates a new producer of the same configuration (a renewal).
pub type MakeProducer =
    Box<dyn Fn() -> KafkaResult<FutureProducer<PublisherContext>> + Send + Sync>;

/// The transactional side of the producer; shared by the pipeline, the
/// lanes (tickets), the publisher (admission) and the rebalance callback.
pub struct Transactions {
    /// Shared with the publisher: swapped under the epoch's write lock.
    producer: ProducerSlot,
    make: MakeProducer,
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
    /// The producer cannot be used again: the next boundary renews it.
    poisoned: AtomicBool,
    /// Renewals one after another (each within a minute of the last), for
    /// their backoff: two processes fencing each other's producers under one
    /// `transactional.id` must not do it in a tight loop.
    renewals: Mutex<(u32, Option<Instant>)>,
    timeout: Duration,
    /// Set at shutdown: no transaction call is retried past it.
    stop_by: Mutex<Option<Instant>>,
    /// The longest a boundary retries sending the offsets or committing
    /// (the broker aborts the transaction after `transaction.timeout.ms`
    /// anyway): past it the transaction is aborted, or the producer renewed.
    stall: Duration,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Transactions {
    /// Registers the `transactional.id` with the coordinator (fencing and
    /// aborting an earlier process's open transaction under the same id)
    /// and opens the first transaction. Blocking.
    pub fn init(
        producer: ProducerSlot,
        make: MakeProducer,
        offsets: Offsets,
        topic: &str,
        timeout: Duration,
        stall: Duration,
    ) -> Result<Transactions, KafkaError> {
        {
            let p = read(&producer);
            p.init_transactions(timeout)?;
            p.begin_transaction()?;
        }
        Ok(Transactions {
            producer,
            make,
            offsets,
            topic: topic.to_owned(),
            epoch: RwLock::new(0),
            ops: Mutex::new(()),
            gate: Arc::new(Gate::new(())),
            doomed: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            renewals: Mutex::new((0, None)),
            timeout,
            stop_by: Mutex::new(None),
            stall,
        })
    }

    /// Shutdown: from now on no transaction call is retried past
    /// `deadline`, nor is a producer renewed; a boundary in progress ends
    /// by then (unless librdkafka's own call blocks past its timeout:
    /// the pipeline bounds its wait for the boundary too).
    pub fn stop_by(&self, deadline: Instant) {
        *lock(&self.stop_by) = Some(deadline);
    }

    fn stopping(&self) -> bool {
        lock(&self.stop_by).is_some()
    }

    /// Retries `op` while its error is retriable, until the earliest of
    /// `deadline`, the shutdown deadline and `stall` after the first try.
    fn retrying(
        &self,
        deadline: Option<Instant>,
        stall: Option<Duration>,
        mut op: impl FnMut() -> Result<(), KafkaError>,
    ) -> Result<(), KafkaError> {
        let started = Instant::now();
        loop {
            let until = [deadline, *lock(&self.stop_by), stall.map(|s| started + s)]
                .into_iter()
                .flatten()
                .min();
            match op() {
                Err(e) if retriable(&e) && until.is_none_or(|d| Instant::now() < d) => {
                    tracing::warn!(error = %e, "transaction call not done yet (broker unreachable?); retrying");
                    std::thread::sleep(Duration::from_millis(100));
                }
                r => return r,
            }
        }
    }

    /// The current producer.
    fn producer(&self) -> FutureProducer<PublisherContext> {
        read(&self.producer)
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
    /// `enqueue` gets the producer to queue on: the current one, which a
    /// renewal cannot swap until the enqueue is done.
    pub fn admit<R>(
        &self,
        ticket: &Ticket,
        enqueue: impl FnOnce(&FutureProducer<PublisherContext>) -> R,
    ) -> Option<R> {
        let epoch = self.epoch.read().unwrap_or_else(|p| p.into_inner());
        let current = *epoch == ticket.epoch
            && !self.doomed.load(Ordering::SeqCst)
            && self.offsets.owns(ticket.partition, ticket.generation);
        current.then(|| enqueue(&self.producer()))
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

    /// The producer reported a fatal error (it cannot be used again): the
    /// next boundary replaces it and rewinds.
    pub fn poison(&self, why: &str) {
        self.doomed.store(true, Ordering::SeqCst);
        if !self.poisoned.swap(true, Ordering::SeqCst) {
            tracing::error!(
                reason = why,
                "kafka producer unusable: the next boundary replaces it and rewinds"
            );
        }
    }

    /// Aborts the open transaction and opens the next: called with `ops`
    /// held. Partitions whose outcomes were in it must have been closed
    /// in [`Offsets`] (revoked, or all of them for a rewind) before.
    fn abort_locked(&self, why: &str, deadline: Option<Instant>) -> Result<(), KafkaError> {
        *self.epoch.write().unwrap_or_else(|p| p.into_inner()) += 1;
        let producer = self.producer();
        self.retrying(deadline, None, || producer.abort_transaction(self.timeout))?;
        self.doomed.store(false, Ordering::SeqCst);
        producer.begin_transaction()?;
        metrics::transaction("aborted");
        tracing::info!(reason = why, "transaction aborted");
        Ok(())
    }

    /// The rebalance callback's abort: `parts` are revoked (every partition,
    /// with an eager assignor) and closed first, so no event of theirs can
    /// publish into the next transaction. An abort that fails leaves the
    /// producer to be replaced by the next boundary (nothing of the revoked
    /// partitions can be committed meanwhile: they are closed). Blocking.
    pub fn abort_on_revoke(&self, parts: &[i32]) {
        for p in parts {
            self.offsets.close(*p);
        }
        let _ops = lock(&self.ops);
        if self.poisoned.load(Ordering::SeqCst) {
            // Already unusable: the next boundary renews it.
            *self.epoch.write().unwrap_or_else(|p| p.into_inner()) += 1;
            return;
        }
        if let Err(e) = self.abort_locked("partitions revoked", None) {
            self.poison(&format!("aborting the transaction on revoke: {e}"));
        }
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
        if self.poisoned.load(Ordering::SeqCst) {
            return self.renew_locked("the producer reported a fatal error", deadline);
        }
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
        let list = commit_list(&self.topic, &commits, &self.offsets.commit_metadata())?;
        let producer = self.producer();
        let stall = Some(self.stall);
        let sent = self.retrying(deadline, stall, || {
            producer.send_offsets_to_transaction(&list, &metadata, self.timeout)
        });
        if let Err(e) = sent {
            return self.failed("sending the offsets to the transaction", e, deadline);
        }
        if let Err(e) = self.retrying(deadline, stall, || {
            producer.commit_transaction(self.timeout)
        }) {
            return self.failed("committing the transaction", e, deadline);
        }
        if let Err(e) = producer.begin_transaction() {
            // Committed; the next one cannot start on this producer.
            metrics::transaction("committed");
            metrics::commit(true);
            if deadline.is_some() {
                return Err(e);
            }
            return self.renew_locked(&format!("beginning the next transaction: {e}"), deadline);
        }
        metrics::transaction("committed");
        metrics::commit(true);
        tracing::debug!(?commits, "transaction committed");
        Ok(Boundary::Committed)
    }

    /// A transaction call failed: a fatal error (the producer cannot be
    /// used again) renews the producer, any other aborts and rewinds (e.g. a
    /// zombie fenced by the group generation).
    fn failed(
        &self,
        what: &str,
        e: KafkaError,
        deadline: Option<Instant>,
    ) -> Result<Boundary, KafkaError> {
        metrics::commit(false);
        if fatal(&e) {
            if deadline.is_some() {
                // At shutdown: nothing to renew for.
                return Err(e);
            }
            return self.renew_locked(&format!("{what}: {e}"), deadline);
        }
        self.rewind(&format!("{what}: {e}"), deadline)
    }

    /// Aborts after closing every partition: the pipeline rejoins the group.
    /// An abort that fails leaves a producer that cannot go on: it is
    /// renewed (at shutdown, with a `deadline`, the error is returned).
    fn rewind(&self, why: &str, deadline: Option<Instant>) -> Result<Boundary, KafkaError> {
        self.close_all();
        match self.abort_locked(why, deadline) {
            Ok(()) => Ok(Boundary::Rewind(why.to_owned())),
            Err(e) if deadline.is_some() => Err(e),
            Err(e) => self.renew_locked(&format!("{why}; the abort failed: {e}"), deadline),
        }
    }

    fn close_all(&self) {
        for p in self.offsets.partitions() {
            self.offsets.close(p);
        }
    }

    /// Replaces the producer (called with `ops` held): every partition is
    /// closed and every ticket made stale first, so nothing of the old
    /// producer's transaction can be committed by the new one; the new
    /// producer registers the same `transactional.id` (which aborts what
    /// the old one left open) and opens a transaction; then it is swapped in
    /// for every sender, and the pipeline rejoins the group. `Err` only
    /// when a producer cannot be created or registered at all.
    fn renew_locked(&self, why: &str, deadline: Option<Instant>) -> Result<Boundary, KafkaError> {
        self.close_all();
        *self.epoch.write().unwrap_or_else(|p| p.into_inner()) += 1;
        if self.stopping() {
            // Nothing to renew for: the open transaction is left to the
            // broker (aborted after its timeout, or by the next owner's
            // init_transactions); its events are redone.
            self.poisoned.store(true, Ordering::SeqCst);
            tracing::warn!(
                reason = why,
                "shutting down: the kafka producer is not replaced"
            );
            return Err(KafkaError::Canceled);
        }
        tracing::warn!(reason = why, "replacing the kafka producer");
        let pause = self.renewal_backoff();
        if !pause.is_zero() {
            tracing::warn!(
                wait_ms = pause.as_millis() as u64,
                "producer replaced again within a minute: waiting first"
            );
            std::thread::sleep(pause);
        }
        let fresh = (self.make)()?;
        self.retrying(deadline, None, || fresh.init_transactions(self.timeout))?;
        fresh.begin_transaction()?;
        let old = {
            let _epoch = self.epoch.write().unwrap_or_else(|p| p.into_inner());
            let mut slot = self.producer.write().unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut *slot, fresh)
        };
        self.doomed.store(false, Ordering::SeqCst);
        self.poisoned.store(false, Ordering::SeqCst);
        metrics::transaction("renewed");
        tracing::warn!(
            reason = why,
            "kafka producer replaced: resuming from the committed offsets"
        );
        // Its destruction may wait on its broker threads: here, off the runtime.
        drop(old);
        Ok(Boundary::Rewind(format!("producer replaced: {why}")))
    }

    /// 0 for a first renewal; then 100 ms doubling per renewal within a
    /// minute of the previous one, at most 10 s.
    fn renewal_backoff(&self) -> Duration {
        let mut r = lock(&self.renewals);
        let recent = r.1.is_some_and(|t| t.elapsed() < Duration::from_secs(60));
        r.0 = if recent { r.0.saturating_add(1) } else { 0 };
        r.1 = Some(Instant::now());
        renewal_delay(r.0)
    }

    /// At shutdown, after the drain: commits when every started event
    /// finished and nothing failed, else aborts; gives up after `limit`
    /// (the broker then aborts it after transaction.timeout.ms). Blocking.
    pub fn finish(&self, metadata: Option<ConsumerGroupMetadata>, limit: Duration) {
        let deadline = Some(Instant::now() + limit);
        if self.poisoned.load(Ordering::SeqCst) {
            tracing::warn!("the kafka producer is unusable at shutdown: its open transaction is aborted by the broker; its events are redone by the next owner");
            return;
        }
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

/// The wait before the `streak`-th renewal in a row (0: the first).
fn renewal_delay(streak: u32) -> Duration {
    if streak == 0 {
        return Duration::ZERO;
    }
    let ms = 100u64.saturating_mul(1 << streak.min(7));
    Duration::from_millis(ms.min(10_000))
}

/// The producer in `slot` now (a renewal may replace it).
pub(super) fn read(slot: &ProducerSlot) -> FutureProducer<PublisherContext> {
    slot.read().unwrap_or_else(|p| p.into_inner()).clone()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_in_a_row_back_off_up_to_ten_seconds() {
        assert_eq!(renewal_delay(0), Duration::ZERO);
        assert_eq!(renewal_delay(1), Duration::from_millis(200));
        assert_eq!(renewal_delay(2), Duration::from_millis(400));
        assert_eq!(renewal_delay(6), Duration::from_millis(6_400));
        assert_eq!(renewal_delay(7), Duration::from_millis(10_000));
        assert_eq!(renewal_delay(u32::MAX), Duration::from_millis(10_000));
    }
}
