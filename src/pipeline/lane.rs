//! A partition's lane: starts events in offset order, keeps up to
//! `max_in_flight_per_partition` in flight but never two of one order, and
//! marks each offset done once its outcome is acknowledged.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::message::{Message, OwnedMessage};
use tokio::sync::{mpsc, AcquireError, OwnedRwLockReadGuard, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::steps::{Failure, Processor};
use crate::domain::event::{self, clip, Event, InvalidEvent, MAX_ID_LEN};
use crate::kafka::consumer::GroupConsumer;
use crate::kafka::headers::Incoming;
use crate::kafka::offsets::Offsets;
use crate::kafka::publisher::Trace;
use crate::kafka::start;
use crate::kafka::transaction::{Ticket, Transactions};
use crate::metrics;
use crate::ops::health::Status;

/// The key that orders events within a lane: never two of one order in flight.
pub(super) fn order_key(
    parsed: &Result<Event, InvalidEvent>,
    msg: &OwnedMessage,
) -> Option<String> {
    match parsed {
        Ok(e) => Some(e.header().order_id.to_string()),
        Err(e) => e
            .salvage
            .order_id
            .as_ref()
            .map(|o| o.to_string())
            .or_else(|| msg.key().map(|k| String::from_utf8_lossy(k).into_owned())),
    }
}

pub(super) struct Prepared {
    pub(super) msg: OwnedMessage,
    /// When the lane took it (the `admitted` stage starts).
    pub(super) taken: Instant,
    pub(super) parsed: Result<Event, InvalidEvent>,
    pub(super) order: Option<String>,
}

/// One partition's worker.
pub(super) struct Lane {
    pub(super) partition: i32,
    pub(super) rx: mpsc::Receiver<OwnedMessage>,
    pub(super) processor: Arc<Processor>,
    pub(super) offsets: Offsets,
    pub(super) global: Arc<Semaphore>,
    pub(super) capacity: usize,
    /// Cancelled on revoke and at shutdown: start nothing new, stop retrying.
    pub(super) stop: CancellationToken,
    pub(super) fatal: mpsc::UnboundedSender<anyhow::Error>,
    pub(super) status: Arc<Status>,
    /// `exactly_once`: the open transaction.
    pub(super) txn: Option<Arc<Transactions>>,
    /// Where the group's committed offset is read before the first event
    /// ([`crate::kafka::start`]); `None`: the lane starts wherever librdkafka did.
    pub(super) start: Option<StartCheck>,
}

/// The consumer and topic a lane reads its partition's committed offset
/// from. Weak: a lane must not keep the consumer alive past the pipeline.
#[derive(Clone)]
pub(super) struct StartCheck {
    pub(super) consumer: Weak<GroupConsumer>,
    pub(super) topic: String,
}

/// How long one read of the committed offset may take (the broker holds
/// an unstable one back while a transaction is open; it is asked again).
const FLOOR_READ: Duration = Duration::from_secs(10);

/// What an event holds from its start to its finish: a share of
/// `max_in_flight`, and in `exactly_once` mode its place in the open
/// transaction (a boundary waits for it).
pub(super) struct Admission {
    _permit: OwnedSemaphorePermit,
    _gate: Option<OwnedRwLockReadGuard<()>>,
}

async fn admission(
    global: Arc<Semaphore>,
    txn: Option<Arc<Transactions>>,
) -> Result<Admission, AcquireError> {
    // The gate first: a boundary waiting for it stops new events, and the
    // events holding it finish without needing it again.
    let gate = match &txn {
        Some(t) => Some(t.enter().await),
        None => None,
    };
    let permit = global.acquire_owned().await?;
    Ok(Admission {
        _permit: permit,
        _gate: gate,
    })
}

impl Lane {
    pub(super) async fn run(mut self, predecessor: Option<JoinHandle<()>>) {
        // At most one lane per partition works at a time in this process: a
        // revoked lane finishes its in-flight events before its successor
        // starts, so two copies of one event never race here.
        if let Some(p) = predecessor {
            let _ = p.await;
        }
        // Records below the group's committed offset are decided: a start
        // below it is librdkafka's reset, skipped here (kafka::start).
        let floor = match self.start.clone() {
            Some(check) => match self.floor(&check).await {
                Some(f) => f,
                None => return,
            },
            None => None,
        };
        #[cfg(feature = "mutants")] // TEST-ONLY mutant: starts where librdkafka says.
        let floor = floor.filter(|_| !crate::mutants::mutant("start-below-committed"));
        let mut skipped = 0u64;
        let generation = self.offsets.open(self.partition);
        let mut in_flight = FuturesUnordered::new();
        let mut busy: HashSet<String> = HashSet::new();
        let mut head: Option<Prepared> = None;
        let mut closed = false;
        loop {
            if closed && in_flight.is_empty() {
                break;
            }
            let startable = head.as_ref().is_some_and(|h| {
                in_flight.len() < self.capacity
                    && h.order.as_ref().is_none_or(|o| !busy.contains(o))
            });
            tokio::select! {
                biased;
                Some((offset, order, result, admitted)) = in_flight.next(), if !in_flight.is_empty() => {
                    if let Some(o) = order {
                        busy.remove(&o);
                    }
                    match result {
                        Ok(()) => {
                            self.offsets.done(self.partition, generation, offset);
                            self.status.events_done.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(Failure::Cancelled) => closed = true,
                        Err(Failure::Fatal(e)) => {
                            let _ = self.fatal.send(e);
                            self.stop.cancel();
                            closed = true;
                        }
                    }
                    // exactly_once: the event leaves the transaction only
                    // once its offset is marked done. A boundary that got
                    // the gate first would commit its outcome without its
                    // offset.
                    drop(admitted);
                }
                _ = self.stop.cancelled(), if !closed => {
                    closed = true;
                    head = None;
                }
                admitted = admission(self.global.clone(), self.txn.clone()), if startable && !closed => {
                    let Ok(admitted) = admitted else { closed = true; continue };
                    if let Some(p) = head.take() {
                        metrics::stage("admitted", p.taken.elapsed().as_secs_f64());
                        if let Some(o) = &p.order {
                            busy.insert(o.clone());
                        }
                        self.offsets.begin(self.partition, generation, p.msg.offset());
                        let ticket = self.txn.as_ref().map(|t| t.ticket(self.partition, generation));
                        #[cfg(feature = "mutants")] // TEST-ONLY mutant: done before it is.
                        if crate::mutants::mutant("commit-early") {
                            self.offsets.done(self.partition, generation, p.msg.offset());
                        }
                        in_flight.push(self.start(p, admitted, ticket));
                    }
                }
                msg = self.rx.recv(), if head.is_none() && !closed => {
                    match msg {
                        Some(msg) if start::below_floor(floor, msg.offset()) => {
                            if skipped == 0 {
                                tracing::warn!(
                                    partition = self.partition,
                                    offset = msg.offset(),
                                    committed = floor,
                                    "the partition was started below the group's committed offset \
                                     (librdkafka's reset after an unstable offset read): the \
                                     records below it are decided already and are skipped"
                                );
                            }
                            skipped += 1;
                            metrics::start_skipped();
                        }
                        Some(msg) => {
                            let taken = Instant::now();
                            if let Some(s) = metrics::since_record(msg.timestamp().to_millis()) {
                                metrics::stage("fetched", s);
                            }
                            let parsed = event::parse(msg.payload().unwrap_or_default());
                            let order = order_key(&parsed, &msg);
                            head = Some(Prepared { msg, taken, parsed, order });
                        }
                        None => closed = true,
                    }
                }
            }
        }
    }

    /// The partition's committed offset (`Some(None)`: none), asked again
    /// until the broker answers; `None` when the lane is stopped first.
    async fn floor(&self, check: &StartCheck) -> Option<Option<i64>> {
        let mut pause = Duration::from_millis(100);
        loop {
            let Some(consumer) = check.consumer.upgrade() else {
                return Some(None);
            };
            let (topic, partition) = (check.topic.clone(), self.partition);
            let read = tokio::task::spawn_blocking(move || {
                start::committed_floor(&consumer, &topic, partition, FLOOR_READ)
            });
            let why = tokio::select! {
                r = read => match r {
                    Ok(Ok(floor)) => return Some(floor),
                    Ok(Err(why)) => why,
                    Err(e) => e.to_string(),
                },
                _ = self.stop.cancelled() => return None,
            };
            tracing::warn!(
                partition = self.partition,
                reason = %why,
                "the partition's committed offset is not readable yet (a transaction holding \
                 offsets of it is still open?): its events wait"
            );
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.stop.cancelled() => return None,
            }
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }

    pub(super) fn start(
        &self,
        p: Prepared,
        admitted: Admission,
        ticket: Option<Ticket>,
    ) -> impl std::future::Future<Output = (i64, Option<String>, Result<(), Failure>, Admission)>
    {
        let processor = self.processor.clone();
        let stop = self.stop.clone();
        let span = tracing::info_span!(
            "event",
            topic = %processor.topic,
            partition = p.msg.partition(),
            offset = p.msg.offset(),
            // The key stands in for an unreadable order_id: capped, like
            // every producer-controlled string in a log line.
            order_id = %clip(p.order.as_deref().unwrap_or(""), MAX_ID_LEN),
            event_id = match &p.parsed {
                Ok(e) => e.header().event_id.as_str(),
                Err(e) => e.salvage.event_id.as_ref().map_or("", |id| id.as_str()),
            },
            trace_id = tracing::field::Empty,
        );
        async move {
            let started = Instant::now();
            // The event's span: a child of the producer's (traceparent), the
            // parent of the outcome or dead letter.
            let incoming = Incoming::read(p.msg.headers(), &processor.propagate);
            let trace = processor.tracer.start(
                &incoming,
                &processor.topic,
                p.msg.partition(),
                p.msg.offset(),
            );
            tracing::Span::current().record("trace_id", trace.span.span.trace_id_hex());
            let result = processor
                .handle(
                    &p.msg,
                    &p.parsed,
                    Trace {
                        span: &trace.span,
                        incoming: &incoming,
                        ticket,
                    },
                    &stop,
                )
                .await;
            match &result {
                Ok(()) => trace.end("done", None),
                Err(Failure::Cancelled) => trace.end("cancelled", None),
                Err(Failure::Fatal(e)) => trace.end("failed", Some(&format!("{e:#}"))),
            }
            if result.is_ok() {
                metrics::event_duration(started.elapsed().as_secs_f64());
            }
            (p.msg.offset(), p.order, result, admitted)
        }
        .instrument(span)
    }
}

/// The main loop's handle on a lane.
pub(super) struct LaneHandle {
    /// Tells this lane from a later one of the same partition.
    pub(super) id: u64,
    /// A pull from the partition's own queue is armed for this lane.
    pub(super) pulling: bool,
    pub(super) tx: mpsc::Sender<OwnedMessage>,
    pub(super) stop: CancellationToken,
    pub(super) join: JoinHandle<()>,
    /// Messages that did not fit while the lane was full; the partition is
    /// paused until they are handed over.
    pub(super) stash: VecDeque<OwnedMessage>,
}

/// Starts lanes: on assignment (partitions with their own queue) and on a
/// message from the main queue (any other partition).
pub(super) struct Spawner {
    pub(super) processor: Arc<Processor>,
    pub(super) offsets: Offsets,
    pub(super) global: Arc<Semaphore>,
    pub(super) capacity: usize,
    pub(super) shutdown: CancellationToken,
    pub(super) fatal: mpsc::UnboundedSender<anyhow::Error>,
    pub(super) status: Arc<Status>,
    pub(super) txn: Option<Arc<Transactions>>,
    pub(super) start: Option<StartCheck>,
    pub(super) next_id: u64,
}

impl Spawner {
    pub(super) fn spawn(
        &mut self,
        partition: i32,
        predecessor: Option<JoinHandle<()>>,
    ) -> LaneHandle {
        let (tx, rx) = mpsc::channel(self.capacity);
        let stop = self.shutdown.child_token();
        let lane = Lane {
            partition,
            rx,
            processor: self.processor.clone(),
            offsets: self.offsets.clone(),
            global: self.global.clone(),
            capacity: self.capacity,
            stop: stop.clone(),
            fatal: self.fatal.clone(),
            status: self.status.clone(),
            txn: self.txn.clone(),
            start: self.start.clone(),
        };
        let join = tokio::spawn(lane.run(predecessor));
        self.next_id += 1;
        LaneHandle {
            id: self.next_id,
            pulling: false,
            tx,
            stop,
            join,
            stash: VecDeque::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::message::Timestamp;

    use super::*;

    fn msg(key: Option<&str>, payload: &str) -> OwnedMessage {
        OwnedMessage::new(
            Some(payload.as_bytes().to_vec()),
            key.map(|k| k.as_bytes().to_vec()),
            "orders".to_owned(),
            Timestamp::NotAvailable,
            0,
            7,
            None,
        )
    }

    fn key_of(key: Option<&str>, payload: &str) -> Option<String> {
        let m = msg(key, payload);
        order_key(&event::parse(payload.as_bytes()), &m)
    }

    #[test]
    fn a_valid_event_is_ordered_by_its_order_id_not_the_record_key() {
        let placed = r#"{"type":"OrderPlaced","event_id":"e1","order_id":"o-9","customer_id":"c1",
            "occurred_at":"2026-11-29T10:00:00Z","lines":[{"promotion_id":"p1","budget":1}]}"#;
        assert_eq!(key_of(Some("other"), placed).as_deref(), Some("o-9"));
    }

    #[test]
    fn an_invalid_event_is_ordered_by_its_salvaged_order_id_else_the_key() {
        // Invalid (no lines), but its order id can be read: it waits for
        // the same order's valid events like they wait for each other.
        let salvaged = r#"{"type":"OrderPlaced","event_id":"e1","order_id":"o-9"}"#;
        assert_eq!(key_of(Some("k"), salvaged).as_deref(), Some("o-9"));
        assert_eq!(key_of(Some("k"), "not json").as_deref(), Some("k"));
        assert_eq!(key_of(None, "not json"), None);
    }
}
