//! Batched placement lines (issue 14): the deduct calls of many events go
//! to Redis as one `deduct_batch.lua` call, which decides each line in turn
//! as deduct.lua would (a fresh line by its own code, any other by
//! deduct.lua's body). Batches form from whatever is ready: a call waits
//! while every batch slot (one per pooled connection) is in flight, and then
//! at most `redis.batch_linger_ms` more for other lines to join it (0 = not
//! at all: at low load a batch is one line and no latency is added). Under
//! load one script call, one round trip and one reply carry up to
//! `redis.batch_max_lines` lines.
//!
//! The memo reads of multi-line placements (memo.lua), the refund lines
//! (rollback.lua) and the releases of rejected placements' lines
//! (release.lua) are batched the same way, each by a batcher of its own, as
//! `memo_batch.lua`, `rollback_batch.lua` and `release_batch.lua` calls.
//! Those three have one slot each ([`Kind::slots`]): they carry about a
//! tenth of the lines, so with a slot per connection their calls were
//! mostly of one or two lines, and a call's fixed cost in Redis is about
//! that of a line or two. With one, what arrives while a call is in flight
//! goes in the next (docs/benchmarks.md, "One slot for the memo, refund and
//! release batches").
//!
//! Only where one script may touch every key (a single Redis or a Sentinel
//! primary; not a Redis Cluster, whose keys of different promotions live
//! on different nodes) and without the durability gate (its `WAIT` is per
//! connection, after the order's own writes). [`super::connect`] decides.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{Pool, Value};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use super::calls::{self, Call};
use super::{scripts, LedgerError};

struct Pending {
    call: Call,
    reply: oneshot::Sender<Result<Value, LedgerError>>,
}

/// What a batcher batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Placement lines (deduct.lua calls) as `deduct_batch.lua` calls.
    Deduct,
    /// Memo reads (memo.lua calls) as `memo_batch.lua` calls.
    Memo,
    /// Refund lines (rollback.lua calls) as `rollback_batch.lua` calls.
    Rollback,
    /// Releases (release.lua calls) as `release_batch.lua` calls.
    Release,
}

impl Kind {
    fn build(self, calls: Vec<Call>) -> Call {
        match self {
            Kind::Deduct => calls::deduct_batch(calls),
            Kind::Memo => calls::memo_batch(calls),
            Kind::Rollback => calls::rollback_batch(calls),
            Kind::Release => calls::release_batch(calls),
        }
    }

    /// How many of this kind's calls may be in flight at once: one per
    /// pooled connection for placement lines, which are most of the work;
    /// one for the others, so that what is ready while a call is in flight
    /// gathers into the next instead of going out as calls of a line or two.
    fn slots(self, pool_size: usize) -> usize {
        match self {
            Kind::Deduct => pool_size.max(1),
            Kind::Memo | Kind::Rollback | Kind::Release => 1,
        }
    }

    /// The script each element stands for, in its errors.
    fn one(self) -> &'static str {
        match self {
            Kind::Deduct => scripts::DEDUCT.name,
            Kind::Memo => scripts::MEMO.name,
            Kind::Rollback => scripts::ROLLBACK.name,
            Kind::Release => scripts::RELEASE.name,
        }
    }
}

/// The queue of calls waiting for a batch.
#[derive(Clone)]
pub(super) struct Batcher {
    tx: mpsc::UnboundedSender<Pending>,
    kind: Kind,
}

impl Batcher {
    /// Starts the batching task; it ends when every handle is dropped.
    /// `linger`: how long a batch's first line may wait for others to join
    /// it once a slot is free (zero: not at all).
    pub(super) fn start(
        kind: Kind,
        pool: Pool,
        max_lines: usize,
        linger: Duration,
        slow: Duration,
    ) -> Batcher {
        let (tx, rx) = mpsc::unbounded_channel();
        let slots = Arc::new(Semaphore::new(kind.slots(pool.size())));
        let shape = Shape {
            max_lines: max_lines.max(1),
            linger,
        };
        tokio::spawn(collect(rx, slots, shape, move |batch| {
            let client = pool.next().clone();
            async move { send(kind, &client, batch, slow).await }
        }));
        Batcher { tx, kind }
    }

    /// Runs one call (of the batcher's kind: deduct.lua, memo.lua or
    /// rollback.lua) in the next batch; its own reply (or error).
    pub(super) async fn call(&self, call: Call) -> Result<Value, LedgerError> {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Pending { call, reply }).is_err() {
            return Err(closed(self.kind));
        }
        rx.await.unwrap_or_else(|_| Err(closed(self.kind)))
    }
}

/// How a batch forms: its size limit and how long its first line may wait
/// for more.
#[derive(Clone, Copy)]
struct Shape {
    max_lines: usize,
    linger: Duration,
}

/// Forms batches from `rx` and hands each to `send`, at most `slots`'
/// permits of them in flight at once.
async fn collect<T, F, Fut>(
    mut rx: mpsc::UnboundedReceiver<T>,
    slots: Arc<Semaphore>,
    shape: Shape,
    mut send: F,
) where
    F: FnMut(Vec<T>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        // A free slot first: while all are busy, calls pile up into the
        // next batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let batch = fill(&mut rx, first, shape).await;
        let sent = send(batch);
        tokio::spawn(async move {
            sent.await;
            drop(slot);
        });
    }
}

/// The batch led by `first`: every line ready now, then (with a linger)
/// those arriving until the first line has waited `shape.linger`, up to
/// `shape.max_lines`. A closed queue ends it early; the loop in [`collect`]
/// then ends after sending it.
async fn fill<T>(rx: &mut mpsc::UnboundedReceiver<T>, first: T, shape: Shape) -> Vec<T> {
    let deadline = (!shape.linger.is_zero()).then(|| Instant::now() + shape.linger);
    let mut batch = vec![first];
    while batch.len() < shape.max_lines {
        let next = match rx.try_recv() {
            Ok(p) => Some(p),
            Err(TryRecvError::Disconnected) => None,
            Err(TryRecvError::Empty) => match deadline {
                Some(at) => tokio::time::timeout_at(at, rx.recv()).await.ok().flatten(),
                None => None,
            },
        };
        match next {
            Some(p) => batch.push(p),
            None => break,
        }
    }
    batch
}

async fn send(kind: Kind, client: &fred::prelude::Client, batch: Vec<Pending>, slow: Duration) {
    let (calls, replies): (Vec<Call>, Vec<_>) =
        batch.into_iter().map(|p| (p.call, p.reply)).unzip();
    let call = kind.build(calls);
    let script = call.script.name;
    let n = replies.len();
    let (result, slow) = scripts::eval_timed(client, call, slow).await;
    if kind == Kind::Deduct {
        crate::metrics::batch_lines(n);
    }
    if let Some(took) = slow {
        tracing::warn!(
            script,
            lines = n,
            elapsed_ms = took.as_millis() as u64,
            "slow Redis script"
        );
    }
    match result {
        Ok(Value::Array(items)) if items.len() == n => {
            for (item, reply) in items.into_iter().zip(replies) {
                let _ = reply.send(element(kind, item));
            }
        }
        Ok(other) => {
            for reply in replies {
                let _ = reply.send(Err(LedgerError::MalformedReply {
                    script,
                    detail: format!("{n} lines, reply {other:?}"),
                }));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(LedgerError::redis(kind.one(), e.clone())));
            }
        }
    }
}

/// The batching task is gone (the ledger is closing): like a dropped
/// connection, the caller retries or gives up with the service.
fn closed(kind: Kind) -> LedgerError {
    LedgerError::redis(
        kind.one(),
        fred::error::Error::new(fred::error::ErrorKind::Canceled, "batching stopped"),
    )
}

/// One call's element of the reply: its script's reply (deduct.lua's,
/// memo.lua's, rollback.lua's, release.lua's), or the error it would have replied with
/// (`{"ERR", message}`).
fn element(kind: Kind, item: Value) -> Result<Value, LedgerError> {
    if let Value::Array(parts) = &item {
        if let [Value::String(tag), message] = parts.as_slice() {
            if &**tag == "ERR" {
                let message = message.as_string().unwrap_or_default();
                return Err(LedgerError::redis(
                    kind.one(),
                    fred::error::Error::new(fred::error::ErrorKind::Unknown, message),
                ));
            }
        }
    }
    Ok(item)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(max_lines: usize, linger_ms: u64) -> Shape {
        Shape {
            max_lines,
            linger: Duration::from_millis(linger_ms),
        }
    }

    /// Sends `at` (milliseconds after now, on tokio's paused clock) each
    /// item of `later`, its index as the value (after `ready`'s).
    fn feed(ready: usize, later: &[u64]) -> mpsc::UnboundedReceiver<usize> {
        let (tx, rx) = mpsc::unbounded_channel();
        for i in 0..ready {
            tx.send(i).unwrap();
        }
        let later = later.to_vec();
        tokio::spawn(async move {
            let start = Instant::now();
            for (i, at) in later.into_iter().enumerate() {
                tokio::time::sleep_until(start + Duration::from_millis(at)).await;
                if tx.send(ready + i).is_err() {
                    return;
                }
            }
            // Kept open: only the linger may end the batch.
            std::future::pending::<()>().await;
        });
        rx
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_linger_a_batch_is_what_is_ready() {
        let mut rx = feed(3, &[1]);
        let batch = fill(&mut rx, 100, shape(32, 0)).await;
        assert_eq!(batch, vec![100, 0, 1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_linger_takes_the_lines_arriving_within_it_and_no_later_ones() {
        let mut rx = feed(1, &[2, 4, 6]);
        let start = Instant::now();
        let batch = fill(&mut rx, 100, shape(32, 5)).await;
        assert_eq!(batch, vec![100, 0, 1, 2]);
        // It went out when the first line had waited the linger, not later.
        assert_eq!(start.elapsed(), Duration::from_millis(5));
        // The line after the linger leads the next batch.
        assert_eq!(rx.recv().await, Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_out_without_waiting_the_linger() {
        let mut rx = feed(1, &[1, 2, 3]);
        let start = Instant::now();
        let batch = fill(&mut rx, 100, shape(3, 50)).await;
        assert_eq!(batch, vec![100, 0, 1]);
        assert_eq!(start.elapsed(), Duration::from_millis(1));
    }

    /// A batch [`collect`] sent, and what ends its call.
    type Sent = (Vec<usize>, oneshot::Sender<()>);

    /// Runs [`collect`] with `slots` over a queue fed by the returned
    /// sender; each batch it sends is reported on the returned receiver
    /// and stays in flight until its own sender is used.
    fn collecting(slots: usize) -> (mpsc::UnboundedSender<usize>, mpsc::UnboundedReceiver<Sent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (sent_tx, sent_rx) = mpsc::unbounded_channel();
        let slots = Arc::new(Semaphore::new(slots));
        tokio::spawn(collect(rx, slots, shape(32, 0), move |batch| {
            let (done, wait) = oneshot::channel();
            let _ = sent_tx.send((batch, done));
            async move {
                let _ = wait.await;
            }
        }));
        (tx, sent_rx)
    }

    #[tokio::test(start_paused = true)]
    async fn with_one_slot_what_arrives_during_a_call_goes_in_the_next() {
        let (tx, mut sent) = collecting(1);
        tx.send(0).unwrap();
        let (first, done) = sent.recv().await.unwrap();
        assert_eq!(first, vec![0]);
        for i in 1..4 {
            tx.send(i).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            sent.try_recv().is_err(),
            "a second call went out while the first was in flight"
        );
        done.send(()).unwrap();
        let (second, _done) = sent.recv().await.unwrap();
        assert_eq!(second, vec![1, 2, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn with_two_slots_a_second_call_goes_out_beside_the_first() {
        let (tx, mut sent) = collecting(2);
        tx.send(0).unwrap();
        let (first, _done) = sent.recv().await.unwrap();
        assert_eq!(first, vec![0]);
        tx.send(1).unwrap();
        let (second, _done2) = sent.recv().await.unwrap();
        assert_eq!(second, vec![1]);
    }

    #[test]
    fn placement_lines_get_a_slot_per_connection_the_others_one() {
        assert_eq!(Kind::Deduct.slots(4), 4);
        assert_eq!(Kind::Deduct.slots(0), 1);
        for kind in [Kind::Memo, Kind::Rollback, Kind::Release] {
            assert_eq!(kind.slots(4), 1, "{kind:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_queue_ends_the_linger() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(1).unwrap();
        drop(tx);
        let start = Instant::now();
        let batch = fill(&mut rx, 0, shape(32, 50)).await;
        assert_eq!(batch, vec![0, 1]);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
