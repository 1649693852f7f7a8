//! consume -> decide -> apply -> publish -> mark done: the only place where
//! the order of the steps lives.
//!
//! One task serves the consumer group (rebalances, errors) and hands each
//! message to its partition's lane; every partition has its own librdkafka
//! queue, pulled only when its lane has room. A lane starts events in
//! offset order, keeps up to `max_in_flight_per_partition` of them in
//! flight (pipelined to Redis), but never two of one order, and marks each
//! offset done only after Redis replied and the broker acknowledged the
//! outcome or dead letter. Only watermarks are committed: on a timer, on
//! revoke and at shutdown.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::TopicPartitionList;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::Settings;
use crate::domain::event::{self, Event, InvalidEvent};
use crate::domain::outcome::{self, Outcome, Source};
use crate::error::Disposition;
use crate::kafka::consumer::{self as group, Assignment, GroupConsumer};
use crate::kafka::headers::Incoming;
use crate::kafka::offsets::Offsets;
use crate::kafka::publisher::{DeadLetter, Publisher, Trace};
use crate::ledger::Ledger;
use crate::metrics;
use crate::retry::{retry, RetryError, RetryPolicy};
use crate::telemetry::EventTracer;

pub use crate::ops::health::Status;

/// Why an event did not complete.
enum Failure {
    /// Shutdown or revoke while it waited to retry: it stays uncommitted and
    /// is redelivered.
    Cancelled,
    /// The service cannot go on.
    Fatal(anyhow::Error),
}

/// Everything one event needs, shared by the lanes.
struct Processor {
    ledger: Ledger,
    publisher: Publisher,
    policy: RetryPolicy,
    topic: String,
    tracer: EventTracer,
    /// `kafka.propagate_headers`.
    propagate: Vec<String>,
}

impl Processor {
    async fn handle(
        &self,
        msg: &OwnedMessage,
        parsed: &Result<Event, InvalidEvent>,
        trace: Trace<'_>,
        stop: &CancellationToken,
    ) -> Result<(), Failure> {
        let source = Source {
            topic: self.topic.clone(),
            partition: msg.partition(),
            offset: msg.offset(),
        };
        let outcome = match parsed {
            Err(invalid) => {
                tracing::warn!(kind = invalid.kind.as_str(), reason = %invalid.detail, "invalid event: dead-lettered");
                let dl = DeadLetter {
                    key: msg.key(),
                    payload: msg.payload(),
                    error: invalid,
                    source: &source,
                    timestamp_ms: msg.timestamp().to_millis(),
                    trace,
                };
                self.kafka(stop, || self.publisher.send_dead_letter(&dl))
                    .await?;
                metrics::dead_letter(invalid.kind.as_str());
                match outcome::invalid(invalid, &source, &now()) {
                    Some(o) => o,
                    None => {
                        metrics::event("invalid", "dead_letter");
                        metrics::end_to_end(msg.timestamp().to_millis());
                        return Ok(());
                    }
                }
            }
            Ok(Event::Placed(e)) => {
                let d = self.redis(stop, || self.ledger.place(e)).await?;
                outcome::placed(e, &d, &source, &now())
            }
            Ok(Event::Refunded(e)) => {
                let d = self.redis(stop, || self.ledger.refund(e)).await?;
                outcome::refunded(e, &d, &source, &now())
            }
        };
        self.kafka(stop, || self.publisher.send_outcome(&outcome, &trace))
            .await?;
        metrics::end_to_end(msg.timestamp().to_millis());
        record(parsed, &outcome);
        Ok(())
    }

    async fn redis<T, F, Fut>(&self, stop: &CancellationToken, op: F) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, crate::ledger::LedgerError>>,
    {
        retry(
            &self.policy,
            stop,
            |e: &crate::ledger::LedgerError| e.disposition(),
            |e, delay| {
                metrics::retry("redis");
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "redis unavailable; retrying");
            },
            op,
        )
        .await
        .map_err(|e| match e {
            RetryError::Cancelled(_) => Failure::Cancelled,
            RetryError::Permanent(e) => Failure::Fatal(anyhow::Error::new(e).context("redis")),
        })
    }

    async fn kafka<F, Fut>(&self, stop: &CancellationToken, op: F) -> Result<(), Failure>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), crate::kafka::publisher::PublishError>>,
    {
        retry(
            &self.policy,
            stop,
            |e: &crate::kafka::publisher::PublishError| e.disposition(),
            |e, delay| {
                metrics::retry("kafka");
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "kafka produce failed; retrying");
            },
            op,
        )
        .await
        .map_err(|e| match e {
            RetryError::Cancelled(_) => Failure::Cancelled,
            RetryError::Permanent(e) => Failure::Fatal(anyhow::Error::new(e)),
        })
    }
}

fn record(parsed: &Result<Event, InvalidEvent>, o: &Outcome) {
    let event_type = match parsed {
        Ok(e) => e.event_type().as_str(),
        Err(_) => "invalid",
    };
    let label = match o.reason {
        Some(r) => r.as_str(),
        None => o.kind.as_str(),
    };
    metrics::event(event_type, label);
}

fn now() -> String {
    outcome::timestamp(chrono::Utc::now())
}

/// The key that orders events within a lane: never two of one order in flight.
fn order_key(parsed: &Result<Event, InvalidEvent>, msg: &OwnedMessage) -> Option<String> {
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

struct Prepared {
    msg: OwnedMessage,
    parsed: Result<Event, InvalidEvent>,
    order: Option<String>,
}

/// One partition's worker.
struct Lane {
    partition: i32,
    rx: mpsc::Receiver<OwnedMessage>,
    processor: Arc<Processor>,
    offsets: Offsets,
    global: Arc<Semaphore>,
    capacity: usize,
    /// Cancelled on revoke and at shutdown: start nothing new, stop retrying.
    stop: CancellationToken,
    fatal: mpsc::UnboundedSender<anyhow::Error>,
    status: Arc<Status>,
}

impl Lane {
    async fn run(mut self, predecessor: Option<JoinHandle<()>>) {
        // At most one lane per partition works at a time in this process: a
        // revoked lane finishes its in-flight events before its successor
        // starts, so two copies of one event never race here.
        if let Some(p) = predecessor {
            let _ = p.await;
        }
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
                Some((offset, order, result)) = in_flight.next(), if !in_flight.is_empty() => {
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
                }
                _ = self.stop.cancelled(), if !closed => {
                    closed = true;
                    head = None;
                }
                permit = self.global.clone().acquire_owned(), if startable && !closed => {
                    let Ok(permit) = permit else { closed = true; continue };
                    if let Some(p) = head.take() {
                        if let Some(o) = &p.order {
                            busy.insert(o.clone());
                        }
                        self.offsets.begin(self.partition, generation, p.msg.offset());
                        #[cfg(feature = "mutants")] // TEST-ONLY mutant: done before it is.
                        if crate::mutants::mutant("commit-early") {
                            self.offsets.done(self.partition, generation, p.msg.offset());
                        }
                        in_flight.push(self.start(p, permit));
                    }
                }
                msg = self.rx.recv(), if head.is_none() && !closed => {
                    match msg {
                        Some(msg) => {
                            let parsed = event::parse(msg.payload().unwrap_or_default());
                            let order = order_key(&parsed, &msg);
                            head = Some(Prepared { msg, parsed, order });
                        }
                        None => closed = true,
                    }
                }
            }
        }
    }

    fn start(
        &self,
        p: Prepared,
        permit: OwnedSemaphorePermit,
    ) -> impl std::future::Future<Output = (i64, Option<String>, Result<(), Failure>)> {
        let processor = self.processor.clone();
        let stop = self.stop.clone();
        let span = tracing::info_span!(
            "event",
            topic = %processor.topic,
            partition = p.msg.partition(),
            offset = p.msg.offset(),
            order_id = p.order.as_deref().unwrap_or(""),
            event_id = match &p.parsed { Ok(e) => e.header().event_id.as_str(), Err(_) => "" },
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
            drop(permit);
            (p.msg.offset(), p.order, result)
        }
        .instrument(span)
    }
}

/// The main loop's handle on a lane.
struct LaneHandle {
    /// Tells this lane from a later one of the same partition.
    id: u64,
    /// A pull from the partition's own queue is armed for this lane.
    pulling: bool,
    tx: mpsc::Sender<OwnedMessage>,
    stop: CancellationToken,
    join: JoinHandle<()>,
    /// Messages that did not fit while the lane was full; the partition is
    /// paused until they are handed over.
    stash: VecDeque<OwnedMessage>,
}

/// Starts lanes: on assignment (partitions with their own queue) and on a
/// message from the main queue (any other partition).
struct Spawner {
    processor: Arc<Processor>,
    offsets: Offsets,
    global: Arc<Semaphore>,
    capacity: usize,
    shutdown: CancellationToken,
    fatal: mpsc::UnboundedSender<anyhow::Error>,
    status: Arc<Status>,
    next_id: u64,
}

impl Spawner {
    fn spawn(&mut self, partition: i32, predecessor: Option<JoinHandle<()>>) -> LaneHandle {
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

type PartitionQueue = StreamPartitionQueue<group::Context>;

/// Gives every partition of `topic` its own librdkafka queue (before the
/// first poll of the main queue). A lane then pulls its partition only
/// when it has room: a full lane holds back its own partition and nothing
/// else, with no pause/resume, which drops librdkafka's prefetch on every
/// cycle (at full lag that was a refetch per lane-full of events, and
/// partitions stalled). The prefetch stays bounded per partition
/// (`queued.max.messages.kbytes`). Partitions added later, or a topic that
/// does not exist yet, go through the main queue and the stash instead.
fn split_queues(consumer: &Arc<GroupConsumer>, topic: &str) -> HashMap<i32, Arc<PartitionQueue>> {
    let metadata = match consumer.fetch_metadata(Some(topic), Duration::from_secs(10)) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, topic, "no metadata: partitions are read through the main queue");
            return HashMap::new();
        }
    };
    metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions())
        .filter_map(|p| {
            let q = consumer.split_partition_queue(topic, p.id())?;
            Some((p.id(), Arc::new(q)))
        })
        .collect()
}

/// A message taken from a partition's own queue, with room for it already
/// reserved in the lane `lane`; `None` when that lane stopped first.
struct Pulled {
    partition: i32,
    lane: u64,
    taken: Option<(mpsc::OwnedPermit<OwnedMessage>, KafkaResult<OwnedMessage>)>,
}

/// Waits for room in the lane, then for the partition's next message. Only
/// the main loop hands pulled messages over (after applying rebalance
/// notes), and at most one pull per partition is armed, so messages reach
/// the lane in offset order.
fn pull(
    partition: i32,
    lane: &LaneHandle,
    queue: Arc<PartitionQueue>,
) -> BoxFuture<'static, Pulled> {
    let (id, tx, stop) = (lane.id, lane.tx.clone(), lane.stop.clone());
    async move {
        let permit = tokio::select! {
            biased;
            _ = stop.cancelled() => None,
            permit = tx.reserve_owned() => permit.ok(),
        };
        let taken = match permit {
            None => None,
            Some(permit) => tokio::select! {
                biased;
                _ = stop.cancelled() => None,
                m = queue.recv() => Some((permit, m.map(|m| m.detach()))),
            },
        };
        Pulled {
            partition,
            lane: id,
            taken,
        }
    }
    .boxed()
}

/// Runs the service until `shutdown` is cancelled (then drains, commits and
/// leaves the group: Ok) or a fatal error occurs (Err).
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_with_status(settings, shutdown, Arc::new(Status::default())).await
}

/// Connects to Redis, waiting out an outage at startup the way G3 waits one
/// out while running (exponential backoff), so a consumer restarted while
/// Redis is down recovers by itself; auth and configuration errors still
/// fail at once. `None` when shutdown was requested meanwhile.
pub async fn connect_ledger(
    settings: &Settings,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Ledger>> {
    let policy = RetryPolicy::from(&settings.retry);
    let result = retry(
        &policy,
        shutdown,
        |e: &crate::ledger::LedgerError| e.disposition(),
        |e, delay| {
            metrics::retry("redis");
            tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "redis unreachable at startup; retrying");
        },
        || Ledger::connect(&settings.redis),
    )
    .await;
    match result {
        Ok(l) => Ok(Some(l)),
        Err(RetryError::Cancelled(_)) => Ok(None),
        Err(RetryError::Permanent(e)) => Err(anyhow::Error::new(e).context("connecting to Redis")),
    }
}

pub async fn run_with_status(
    settings: Settings,
    shutdown: CancellationToken,
    status: Arc<Status>,
) -> anyhow::Result<()> {
    let Some(ledger) = connect_ledger(&settings, &shutdown).await? else {
        return Ok(());
    };
    let publisher = Publisher::new(&settings.kafka).context("creating the Kafka producer")?;
    let offsets = Offsets::new();
    let consumer = Arc::new(
        group::create(&settings.kafka, offsets.clone()).context("creating the Kafka consumer")?,
    );
    consumer
        .subscribe(&[&settings.kafka.input_topic])
        .with_context(|| format!("subscribing to {}", settings.kafka.input_topic))?;
    let queues = split_queues(&consumer, &settings.kafka.input_topic);
    tracing::info!(topic = %settings.kafka.input_topic, group = %settings.kafka.group_id, "consuming");

    let tracer = EventTracer::new(&settings.tracing).context("tracing.otlp_endpoint")?;
    if tracer.exporting() {
        tracing::info!(endpoint = %settings.tracing.otlp_endpoint, "exporting event spans over OTLP/HTTP");
    }
    let processor = Arc::new(Processor {
        ledger: ledger.clone(),
        publisher: publisher.clone(),
        policy: RetryPolicy::from(&settings.retry),
        topic: settings.kafka.input_topic.clone(),
        tracer: tracer.clone(),
        propagate: settings.kafka.propagate_headers.clone(),
    });
    let global = Arc::new(Semaphore::new(settings.pipeline.max_in_flight));
    let (fatal_tx, mut fatal_rx) = mpsc::unbounded_channel();
    let mut lanes = Lanes {
        by_partition: HashMap::new(),
        retiring: HashMap::new(),
        queues,
        pulls: FuturesUnordered::new(),
        spawner: Spawner {
            processor,
            offsets: offsets.clone(),
            global: global.clone(),
            capacity: settings.pipeline.max_in_flight_per_partition,
            shutdown: shutdown.clone(),
            fatal: fatal_tx,
            status: status.clone(),
            next_id: 0,
        },
    };
    let topic = settings.kafka.input_topic.as_str();
    let mut commit_tick =
        tokio::time::interval(Duration::from_millis(settings.pipeline.commit_interval_ms));
    commit_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stash_tick = tokio::time::interval(Duration::from_millis(5));
    let mut fatal: Option<anyhow::Error> = None;
    status.touch();

    loop {
        let stashed = lanes.by_partition.values().any(|l| !l.stash.is_empty());
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(e) = fatal_rx.recv() => {
                fatal = Some(e);
                break;
            }
            failure = publisher.fatal() => {
                fatal = Some(anyhow::Error::new(failure).context("kafka producer"));
                break;
            }
            // Rebalance callbacks run inside `consumer.recv()` below; their
            // notes are applied before any message pulled after them.
            _ = consumer.context().noted() => {
                lanes.apply_notes(&consumer, topic, &status);
            }
            _ = commit_tick.tick() => {
                lanes.apply_notes(&consumer, topic, &status);
                commit(&consumer, &offsets, topic, CommitMode::Async);
                metrics::in_flight(settings.pipeline.max_in_flight - global.available_permits());
                status.touch();
                if settings.pipeline.exit_when_drained && drained(&consumer, &offsets, topic) {
                    tracing::info!("every assigned partition is processed to its end: stopping");
                    break;
                }
            }
            _ = stash_tick.tick(), if stashed => {
                for (p, lane) in lanes.by_partition.iter_mut() {
                    flush_stash(&consumer, topic, *p, lane);
                }
            }
            // Polled on every turn, ahead of the pulls: it serves rebalances
            // and errors (and the messages of partitions without their own
            // queue), however busy the partition queues are.
            msg = consumer.recv() => {
                status.touch();
                lanes.apply_notes(&consumer, topic, &status);
                let result = match msg {
                    Ok(m) => {
                        let m = m.detach();
                        let p = m.partition();
                        dispatch(&consumer, topic, p, lanes.get_or_spawn(p), m);
                        Ok(())
                    }
                    Err(e) => Err(e),
                };
                if let Err(e) = result {
                    if let Some(e) = consumer_error(e) {
                        fatal = Some(e);
                        break;
                    }
                }
            }
            Some(pulled) = lanes.pulls.next(), if !lanes.pulls.is_empty() => {
                status.touch();
                lanes.apply_notes(&consumer, topic, &status);
                if let Err(e) = lanes.hand_over(&consumer, topic, pulled) {
                    if let Some(e) = consumer_error(e) {
                        fatal = Some(e);
                        break;
                    }
                }
            }
        }
    }

    // Drain: start nothing new, let in-flight events finish (bounded), then
    // commit what was acknowledged and leave the group.
    let drain = settings.drain_timeout();
    tracing::info!(
        in_flight = offsets.in_flight(),
        drain_timeout_s = drain.as_secs(),
        "draining"
    );
    let mut joins = Vec::new();
    for (_, lane) in lanes.by_partition.drain() {
        lane.stop.cancel();
        drop(lane.tx);
        joins.push(lane.join);
    }
    joins.extend(lanes.retiring.drain().map(|(_, j)| j));
    // The partition queues hold the consumer: release them before it closes.
    drop(lanes);
    if tokio::time::timeout(drain, futures::future::join_all(joins))
        .await
        .is_err()
    {
        tracing::warn!(
            in_flight = offsets.in_flight(),
            "drain timeout: unfinished events stay uncommitted and are redelivered"
        );
    }
    commit(
        &consumer,
        &offsets,
        &settings.kafka.input_topic,
        CommitMode::Sync,
    );
    if let Err(e) = publisher.flush(Duration::from_secs(5)) {
        tracing::warn!(error = %e, "producer flush at shutdown");
    }
    // The exporter's thread blocks on its last export: off the runtime.
    let _ = tokio::task::spawn_blocking(move || tracer.shutdown()).await;
    consumer.unsubscribe();
    drop(consumer);
    ledger.quit().await;
    match fatal {
        Some(e) => Err(e),
        None => {
            tracing::info!("stopped cleanly");
            Ok(())
        }
    }
}

/// The main loop's lanes, their partition queues and the armed pulls.
struct Lanes {
    by_partition: HashMap<i32, LaneHandle>,
    /// Revoked lanes still finishing their in-flight events.
    retiring: HashMap<i32, JoinHandle<()>>,
    queues: HashMap<i32, Arc<PartitionQueue>>,
    pulls: FuturesUnordered<BoxFuture<'static, Pulled>>,
    spawner: Spawner,
}

impl Lanes {
    /// The lane of `p`, started if there is none; a partition with its own
    /// queue gets its pull armed.
    fn get_or_spawn(&mut self, p: i32) -> &mut LaneHandle {
        let lane = match self.by_partition.entry(p) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(self.spawner.spawn(p, self.retiring.remove(&p)))
            }
        };
        if !lane.pulling {
            if let Some(q) = self.queues.get(&p) {
                lane.pulling = true;
                self.pulls.push(pull(p, lane, q.clone()));
            }
        }
        lane
    }

    /// Retires the lanes of revoked partitions and starts the lanes of
    /// assigned ones, before the next message is handled.
    fn apply_notes(&mut self, consumer: &GroupConsumer, topic: &str, status: &Status) {
        for note in consumer.context().take_notes() {
            match note {
                Assignment::Revoked(parts) => {
                    for p in parts {
                        if let Some(lane) = self.by_partition.remove(&p) {
                            // Also resolves the lane's pull without taking
                            // a message.
                            lane.stop.cancel();
                            self.retiring.insert(p, lane.join);
                        }
                    }
                    status.assigned.store(0, Ordering::Relaxed);
                    metrics::assigned(0);
                }
                Assignment::Assigned(parts) => {
                    // A partition paused by a full lane before a revoke must not
                    // come back paused: its new lane starts empty.
                    let mut list = TopicPartitionList::new();
                    for p in &parts {
                        list.add_partition(topic, *p);
                    }
                    if let Err(e) = consumer.resume(&list) {
                        tracing::debug!(error = %e, "resume on assign");
                    }
                    for p in &parts {
                        if self.queues.contains_key(p) {
                            self.get_or_spawn(*p);
                        }
                    }
                    status.assigned.store(parts.len(), Ordering::Relaxed);
                    metrics::assigned(parts.len());
                }
            }
        }
        self.retiring.retain(|_, j| !j.is_finished());
    }

    /// Hands a pulled message to its lane and arms the next pull. A message
    /// pulled for a lane that has since been replaced goes to the current
    /// lane (its stash keeps the order); for a revoked partition it is
    /// dropped, uncommitted, and redelivered to the next owner.
    fn hand_over(
        &mut self,
        consumer: &GroupConsumer,
        topic: &str,
        pulled: Pulled,
    ) -> KafkaResult<()> {
        let Pulled {
            partition: p,
            lane: id,
            taken,
        } = pulled;
        let Some(lane) = self.by_partition.get_mut(&p) else {
            return Ok(());
        };
        let current = lane.id == id;
        if current {
            lane.pulling = false;
        }
        let Some((permit, msg)) = taken else {
            return Ok(());
        };
        let result = match msg {
            Ok(m) if current && lane.stash.is_empty() => {
                permit.send(m);
                Ok(())
            }
            Ok(m) => {
                drop(permit);
                dispatch(consumer, topic, p, lane, m);
                Ok(())
            }
            Err(e) => Err(e),
        };
        if current {
            self.get_or_spawn(p);
        }
        result
    }
}

/// A consumer error: logged and counted; `Some` when the service cannot go on.
fn consumer_error(e: rdkafka::error::KafkaError) -> Option<anyhow::Error> {
    metrics::kafka_error(&e);
    match crate::kafka::publisher::classify(&e) {
        Disposition::Fatal => Some(anyhow::Error::new(e).context("kafka consumer")),
        _ => {
            tracing::warn!(error = %e, "kafka consumer error; librdkafka reconnects by itself");
            None
        }
    }
}

fn partition_list(topic: &str, p: i32) -> TopicPartitionList {
    let mut l = TopicPartitionList::new();
    l.add_partition(topic, p);
    l
}

/// Hands a message to its lane; when the lane is full the message is kept
/// and the partition paused, so the loop keeps polling (rebalances, other
/// partitions) while memory stays bounded.
fn dispatch(consumer: &GroupConsumer, topic: &str, p: i32, lane: &mut LaneHandle, m: OwnedMessage) {
    if !lane.stash.is_empty() {
        lane.stash.push_back(m);
        return;
    }
    match lane.tx.try_send(m) {
        Ok(()) => {}
        Err(mpsc::error::TrySendError::Full(m)) => {
            lane.stash.push_back(m);
            if let Err(e) = consumer.pause(&partition_list(topic, p)) {
                tracing::warn!(error = %e, partition = p, "pause failed");
            }
        }
        Err(mpsc::error::TrySendError::Closed(_)) => {
            // The lane stopped (fatal or shutdown); the message stays
            // uncommitted and is redelivered.
        }
    }
}

fn flush_stash(consumer: &GroupConsumer, topic: &str, p: i32, lane: &mut LaneHandle) {
    if lane.stash.is_empty() {
        return;
    }
    while let Some(m) = lane.stash.pop_front() {
        match lane.tx.try_send(m) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(m)) => {
                lane.stash.push_front(m);
                return;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                lane.stash.clear();
                return;
            }
        }
    }
    if let Err(e) = consumer.resume(&partition_list(topic, p)) {
        tracing::warn!(error = %e, partition = p, "resume failed");
    }
}

/// True when partitions are assigned and each is processed to its end
/// (nothing in flight, watermark or committed offset at the high watermark).
/// Only used with `exit_when_drained`. The high watermarks librdkafka cached
/// from its last fetch decide without a round trip; only when a partition
/// has none yet are the broker and the group coordinator asked, with
/// blocking calls that hold up this loop (and so every lane's pulls).
fn drained(consumer: &GroupConsumer, offsets: &Offsets, topic: &str) -> bool {
    if offsets.in_flight() > 0 {
        return false;
    }
    let Ok(assignment) = consumer.assignment() else {
        return false;
    };
    let parts = assignment.elements_for_topic(topic);
    if parts.is_empty() {
        return false;
    }
    let mut unknown = false;
    for e in &parts {
        let p = e.partition();
        match cached_watermarks(consumer, topic, p) {
            Some((low, high)) => {
                if high != low && offsets.watermark(p).unwrap_or(-1) < high {
                    return false;
                }
            }
            _ => unknown = true,
        }
    }
    if !unknown {
        return true;
    }
    let timeout = Duration::from_secs(2);
    let Ok(committed) = consumer.committed_offsets(assignment.clone(), timeout) else {
        return false;
    };
    parts.iter().all(|e| {
        let p = e.partition();
        let Ok((low, high)) = consumer.fetch_watermarks(topic, p, timeout) else {
            return false;
        };
        let done = offsets.watermark(p).unwrap_or(-1);
        let committed = match committed.find_partition(topic, p).map(|x| x.offset()) {
            Some(rdkafka::Offset::Offset(o)) => o,
            _ => -1,
        };
        high == low || done.max(committed) >= high
    })
}

/// The (low, high) watermarks librdkafka last saw for a partition, if any.
fn cached_watermarks(consumer: &GroupConsumer, topic: &str, p: i32) -> Option<(i64, i64)> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client handle lives as long as `consumer`; librdkafka
    // only reads the NUL-terminated `topic` and writes the two integers
    // (rd_kafka_get_watermark_offsets, which rust-rdkafka does not wrap).
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            p,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
        .then_some((low, high))
}

/// Commits the watermarks that moved: the one place offsets are committed.
fn commit(consumer: &GroupConsumer, offsets: &Offsets, topic: &str, mode: CommitMode) {
    let commits = offsets.take_commits(None);
    if commits.is_empty() {
        return;
    }
    let result = group::commit_list(topic, &commits).and_then(|list| consumer.commit(&list, mode));
    match result {
        Ok(()) => {
            metrics::commit(true);
            tracing::debug!(?commits, "offsets committed");
        }
        Err(e) => {
            metrics::commit(false);
            offsets.commit_failed(&commits);
            tracing::warn!(error = %e, "offset commit failed; retried on the next tick");
        }
    }
}
