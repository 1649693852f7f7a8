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
//!   offset above the committed position. An event marks its offset done
//!   before it lets go of the gate. One that ended unfinished instead (a
//!   shutdown or a fatal error cancelled it) leaves its offset in flight,
//!   and the watermark below it: the boundary then aborts, since outcomes
//!   of later offsets may be in the transaction.
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
//! - **A hung call.** librdkafka's transaction calls can ignore their
//!   timeout when the transaction coordinator goes away (librdkafka #5456,
//!   #5511). Each call runs on a thread of its own ([`Transactions::call`]);
//!   one that has not returned [`HUNG_MARGIN`] after its timeout is
//!   abandoned (left on its thread, never awaited again; it holds no lock of
//!   ours, only a clone of its producer) and its producer renewed as above:
//!   the new producer's `init_transactions` bumps the epoch, which fences the
//!   hung one and aborts its transaction, and the pipeline rewinds. A revoke
//!   waits for a boundary in progress at most as long
//!   ([`Transactions::abort_on_revoke`]), then leaves the renewal to the
//!   next boundary. Only a renewal that hangs too ends the process (the
//!   pipeline's "boundary has not returned" exit).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, TryLockError};
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

/// How long past its own timeout a transaction call may run before it is
/// taken as hung and abandoned (see the module comment).
pub const HUNG_MARGIN: Duration = Duration::from_secs(5);

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
    /// ... because a call of it hung (or a revoke gave up waiting for one):
    /// the renewal's cause for the metric.
    stuck: AtomicBool,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`lock`], waiting at most `within`; `None` when still held by then.
fn lock_within<T>(m: &Mutex<T>, within: Duration) -> Option<MutexGuard<'_, T>> {
    let deadline = Instant::now() + within;
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(TryLockError::WouldBlock) => return None,
        }
    }
}

/// Runs `op` on a thread of its own and waits for it at most `within`.
/// `None` when it has not returned by then: the thread is left to itself
/// (whatever it returns later is dropped). `op` must hold nothing the
/// caller needs back.
fn run_within<R: Send + 'static>(
    name: &str,
    within: Duration,
    op: impl FnOnce() -> R + Send + 'static,
) -> Option<R> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let _ = tx.send(op());
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "could not start a thread for a kafka transaction call");
        return None;
    }
    rx.recv_timeout(within).ok()
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
            stuck: AtomicBool::new(false),
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

    /// How long a transaction call may run before it is taken as hung: its
    /// own timeout and [`HUNG_MARGIN`].
    fn hung_after(&self) -> Duration {
        self.timeout + HUNG_MARGIN
    }

    /// One librdkafka transaction call (`what`, for the log) of `producer`,
    /// on a thread of its own. One that has not returned within
    /// [`Transactions::hung_after`] is abandoned and its producer poisoned
    /// (the caller renews it, which fences the hung call's transaction);
    /// it then fails with `Canceled`, which is not retried.
    fn call(
        &self,
        what: &'static str,
        producer: &FutureProducer<PublisherContext>,
        op: impl FnOnce(&FutureProducer<PublisherContext>) -> KafkaResult<()> + Send + 'static,
    ) -> KafkaResult<()> {
        let p = producer.clone();
        let within = self.hung_after();
        match run_within("kafka-txn-call", within, move || op(&p)) {
            Some(r) => r,
            None => {
                self.stuck.store(true, Ordering::SeqCst);
                self.poison(&format!(
                    "{what} has not returned after {} s (librdkafka ignores its timeout when the \
                     transaction coordinator goes away): the call is abandoned",
                    within.as_secs()
                ));
                Err(KafkaError::Canceled)
            }
        }
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
    /// Its retries end after `stall` (then the producer is renewed).
    fn abort_locked(
        &self,
        why: &str,
        deadline: Option<Instant>,
        stall: Duration,
    ) -> Result<(), KafkaError> {
        *self.epoch.write().unwrap_or_else(|p| p.into_inner()) += 1;
        if self.poisoned.load(Ordering::SeqCst) {
            // A call of it hung, or it reported a fatal error: nothing to
            // abort with; its renewal aborts the transaction.
            return Err(KafkaError::Canceled);
        }
        let producer = self.producer();
        let timeout = self.timeout;
        self.retrying(deadline, Some(stall), || {
            self.call("abort_transaction", &producer, move |p| {
                p.abort_transaction(timeout)
            })
        })?;
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
    /// partitions can be committed meanwhile: they are closed). Blocking,
    /// but bounded: this runs on the consumer's thread, inside the
    /// rebalance callback, so it waits for a boundary in progress at most
    /// [`Transactions::hung_after`]. Past that the producer is poisoned (the
    /// next boundary renews it, which fences and aborts the transaction of
    /// the boundary still running) and the revoke goes on: that transaction
    /// holds only events that finished before it, and its offsets commit
    /// with the group's old generation or not at all (the next owner's
    /// read of the committed offsets waits for it to end, KIP-447).
    pub fn abort_on_revoke(&self, parts: &[i32]) {
        for p in parts {
            self.offsets.close(*p);
        }
        let wait = self.hung_after();
        let Some(_ops) = lock_within(&self.ops, wait) else {
            *self.epoch.write().unwrap_or_else(|p| p.into_inner()) += 1;
            self.stuck.store(true, Ordering::SeqCst);
            self.poison(&format!(
                "a revoke waited {} s for a transaction boundary that has not returned",
                wait.as_secs()
            ));
            return;
        };
        if self.poisoned.load(Ordering::SeqCst) {
            // Already unusable: the next boundary renews it.
            *self.epoch.write().unwrap_or_else(|p| p.into_inner()) += 1;
            return;
        }
        if let Err(e) = self.abort_locked("partitions revoked", None, self.timeout) {
            self.poison(&format!("aborting the transaction on revoke: {e}"));
        }
    }

    /// The end of one transaction and the start of the next; see the
    /// module comment. `metadata` is the group's, read just before
    /// ([`super::membership::fenceable_metadata`]).
    /// `Err` only for what the service cannot go on from.
    pub async fn boundary(
        self: &Arc<Self>,
        metadata: impl FnOnce() -> Result<ConsumerGroupMetadata, String>,
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
        metadata: Result<ConsumerGroupMetadata, String>,
        deadline: Option<Instant>,
    ) -> Result<Boundary, KafkaError> {
        let _ops = lock(&self.ops);
        if self.poisoned.load(Ordering::SeqCst) {
            return self.renew_locked("the producer reported a fatal error", deadline);
        }
        if self.doomed.load(Ordering::SeqCst) {
            return self.rewind("a produce in the transaction failed", deadline);
        }
        // No event runs while a boundary holds the gate, so an offset still
        // in flight is an event that ended unfinished (cancelled by a
        // shutdown or a fatal error). Events after it in its partition may
        // have queued their outcomes, which the watermark (held below it)
        // would not cover: this transaction cannot commit.
        #[cfg(feature = "mutants")] // TEST-ONLY mutant: commits past the hole.
        let hole_ok = crate::mutants::mutant("boundary-commits-past-hole");
        #[cfg(not(feature = "mutants"))]
        let hole_ok = false;
        if self.offsets.in_flight() > 0 && !hole_ok {
            return self.rewind("events ended unfinished in this transaction", deadline);
        }
        let commits = self.offsets.take_commits(None);
        if commits.is_empty() {
            return Ok(Boundary::Committed);
        }
        // Offsets go only with a live membership's metadata: with the
        // sentinel of a lost one the broker would commit them unfenced
        // (super::membership).
        let metadata = match metadata {
            Ok(m) => m,
            Err(why) => {
                metrics::transaction("unfenced");
                return self.rewind(&format!("offsets not sent: {why}"), deadline);
            }
        };
        let list = commit_list(&self.topic, &commits, &self.offsets.commit_metadata())?;
        let producer = self.producer();
        let stall = Some(self.stall);
        let timeout = self.timeout;
        let metadata = Arc::new(metadata);
        let sent = self.retrying(deadline, stall, || {
            let (list, metadata) = (list.clone(), metadata.clone());
            self.call("send_offsets_to_transaction", &producer, move |p| {
                p.send_offsets_to_transaction(&list, &metadata, timeout)
            })
        });
        if let Err(e) = sent {
            return self.failed("sending the offsets to the transaction", e, deadline);
        }
        if let Err(e) = self.retrying(deadline, stall, || {
            self.call("commit_transaction", &producer, move |p| {
                p.commit_transaction(timeout)
            })
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
        if fatal(&e) || self.poisoned.load(Ordering::SeqCst) {
            if deadline.is_some() {
                // At shutdown: nothing to renew for.
                return Err(e);
            }
            if matches!(e, KafkaError::Canceled) && self.stuck.load(Ordering::SeqCst) {
                return self.renew_locked(
                    &format!("{what}: the call hung and was abandoned"),
                    deadline,
                );
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
        match self.abort_locked(why, deadline, self.stall) {
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
        let started = Instant::now();
        let cause = if self.stuck.load(Ordering::SeqCst) {
            "hung"
        } else {
            "fatal"
        };
        tracing::debug!(reason = why, cause, "replacing the kafka producer");
        let pause = self.renewal_backoff();
        if !pause.is_zero() {
            tracing::warn!(
                wait_ms = pause.as_millis() as u64,
                "producer replaced again within a minute: waiting first"
            );
            std::thread::sleep(pause);
        }
        let fresh = (self.make)()?;
        let timeout = self.timeout;
        self.retrying(deadline, None, || {
            self.call(
                "init_transactions (renewing the producer)",
                &fresh,
                move |p| p.init_transactions(timeout),
            )
        })?;
        fresh.begin_transaction()?;
        let old = {
            let _epoch = self.epoch.write().unwrap_or_else(|p| p.into_inner());
            let mut slot = self.producer.write().unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut *slot, fresh)
        };
        self.doomed.store(false, Ordering::SeqCst);
        self.poisoned.store(false, Ordering::SeqCst);
        self.stuck.store(false, Ordering::SeqCst);
        metrics::transaction("renewed");
        metrics::producer_renewal(cause);
        tracing::warn!(
            reason = why,
            cause,
            took_ms = started.elapsed().as_millis() as u64,
            "kafka producer replaced: renewed under the same transactional.id (the old one is \
             fenced, its transaction aborted); resuming from the committed offsets"
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
    pub fn finish(&self, metadata: Result<ConsumerGroupMetadata, String>, limit: Duration) {
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
            self.abort_locked("shutdown with unfinished events", deadline, limit)
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
    fn lock_within_gives_up_on_a_lock_held_past_the_wait() {
        let m = Mutex::new(());
        assert!(lock_within(&m, Duration::ZERO).is_some(), "a free lock");
        let held = lock(&m);
        assert!(
            lock_within(&m, Duration::from_millis(50)).is_none(),
            "held past the wait"
        );
        drop(held);
        // Released during the wait: taken.
        let m = Arc::new(Mutex::new(()));
        let held = lock(&m);
        let t = std::thread::spawn({
            let m = m.clone();
            move || lock_within(&m, Duration::from_secs(30)).is_some()
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        assert!(t.join().expect("thread"), "taken once released");
    }

    #[test]
    fn a_call_that_does_not_return_in_time_is_abandoned() {
        assert_eq!(run_within("t", Duration::from_secs(30), || 7), Some(7));
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        let r = run_within("t", Duration::from_millis(50), move || {
            let _ = wait.recv();
            let _ = done_tx.send(());
            1
        });
        assert_eq!(r, None, "still running past the wait: abandoned");
        // The abandoned call goes on by itself; its result is dropped.
        release.send(()).expect("the call is still waiting");
        done.recv_timeout(Duration::from_secs(30))
            .expect("the abandoned call ran to its end");
    }

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
