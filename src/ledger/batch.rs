//! Batched placement lines (issue 14): the deduct calls of many events go
//! to Redis as one `deduct_batch.lua` call, which decides each line in turn
//! as deduct.lua would (a fresh line by its own code, any other by
//! deduct.lua's body). Batches form from whatever is ready: a call waits only
//! while every batch slot (one per pooled connection) is in flight, so at low
//! load a batch is one line and no latency is added, and under load one
//! script call, one round trip and one reply carry up to
//! `redis.batch_max_lines` lines.
//!
//! Only where one script may touch every key (a single Redis or a Sentinel
//! primary; not a Redis Cluster, whose keys of different promotions live
//! on different nodes) and without the durability gate (its `WAIT` is per
//! connection, after the order's own writes). [`super::connect`] decides.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{Pool, Value};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::calls::{self, Call};
use super::{scripts, LedgerError};

struct Pending {
    call: Call,
    reply: oneshot::Sender<Result<Value, LedgerError>>,
}

/// The queue of deduct calls waiting for a batch.
#[derive(Clone)]
pub(super) struct Batcher {
    tx: mpsc::UnboundedSender<Pending>,
}

impl Batcher {
    /// Starts the batching task; it ends when every handle is dropped.
    pub(super) fn start(pool: Pool, max_lines: usize, slow: Duration) -> Batcher {
        let (tx, rx) = mpsc::unbounded_channel();
        let slots = Arc::new(Semaphore::new(pool.size().max(1)));
        tokio::spawn(collect(rx, pool, slots, max_lines.max(1), slow));
        Batcher { tx }
    }

    /// Runs one deduct call in the next batch; its own reply (or error).
    pub(super) async fn deduct(&self, call: Call) -> Result<Value, LedgerError> {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Pending { call, reply }).is_err() {
            return Err(closed());
        }
        rx.await.unwrap_or_else(|_| Err(closed()))
    }
}

async fn collect(
    mut rx: mpsc::UnboundedReceiver<Pending>,
    pool: Pool,
    slots: Arc<Semaphore>,
    max_lines: usize,
    slow: Duration,
) {
    loop {
        // A free slot first: while all are busy, calls pile up into the
        // next batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < max_lines {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let client = pool.next().clone();
        tokio::spawn(async move {
            send(&client, batch, slow).await;
            drop(slot);
        });
    }
}

async fn send(client: &fred::prelude::Client, batch: Vec<Pending>, slow: Duration) {
    let (calls, replies): (Vec<Call>, Vec<_>) =
        batch.into_iter().map(|p| (p.call, p.reply)).unzip();
    let call = calls::deduct_batch(calls);
    let script = call.script.name;
    let n = replies.len();
    let (result, slow) = scripts::eval_timed(client, call, slow).await;
    crate::metrics::batch_lines(n);
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
                let _ = reply.send(line(item));
            }
        }
        Ok(other) => {
            for reply in replies {
                let _ = reply.send(Err(LedgerError::MalformedReply {
                    script: "deduct_batch",
                    detail: format!("{n} lines, reply {other:?}"),
                }));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(LedgerError::redis("deduct", e.clone())));
            }
        }
    }
}

/// The batching task is gone (the ledger is closing): like a dropped
/// connection, the caller retries or gives up with the service.
fn closed() -> LedgerError {
    LedgerError::redis(
        "deduct",
        fred::error::Error::new(fred::error::ErrorKind::Canceled, "batching stopped"),
    )
}

/// One line's element of the reply: deduct.lua's reply, or the error it
/// would have replied with (`{"ERR", message}`).
fn line(item: Value) -> Result<Value, LedgerError> {
    if let Value::Array(parts) = &item {
        if let [Value::String(tag), message] = parts.as_slice() {
            if &**tag == "ERR" {
                let message = message.as_string().unwrap_or_default();
                return Err(LedgerError::redis(
                    "deduct",
                    fred::error::Error::new(fred::error::ErrorKind::Unknown, message),
                ));
            }
        }
    }
    Ok(item)
}
