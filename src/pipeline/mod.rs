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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::Message;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Delivery, Settings};
use crate::kafka::commit;
use crate::kafka::consumer::{self as group};
use crate::kafka::offsets::Offsets;
use crate::kafka::publisher::Publisher;
use crate::kafka::transaction::{Boundary, Transactions};
use crate::ledger::Ledger;
use crate::metrics;
use crate::retry::{retry, RetryError, RetryPolicy};
use crate::telemetry::EventTracer;

pub use crate::ops::health::Status;

mod boundary_watch;
mod drained;
mod fetch_turns;
mod lane;
mod routing;
mod steps;
mod wind_down;

use drained::drained;
use lane::Spawner;
use routing::{consumer_error, dispatch, flush_stash, split_queues, Lanes};
use steps::Processor;

/// Runs the service until `shutdown` is cancelled (then drains, commits and
/// leaves the group: Ok) or a fatal error occurs (Err).
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_with_status(settings, shutdown, Arc::new(Status::default())).await
}

/// Connects to Redis, waiting out an outage at startup the way G3 waits one
/// out while running (exponential backoff), so a consumer restarted while
/// Redis is down recovers by itself; auth and configuration errors still
/// fail at once. `None` when shutdown was requested meanwhile. While it
/// waits, `status` says so (alive, not ready: waiting for redis).
pub async fn connect_ledger(
    settings: &Settings,
    shutdown: &CancellationToken,
    status: &Status,
) -> anyhow::Result<Option<Ledger>> {
    let policy = RetryPolicy::from(&settings.retry);
    let result = retry(
        &policy,
        shutdown,
        |e: &crate::ledger::LedgerError| e.disposition(),
        |e, delay| {
            metrics::retry("redis");
            status.waiting("redis", "unreachable at startup, retrying");
            tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "redis unreachable at startup; retrying");
        },
        || Ledger::connect(&settings.redis),
    )
    .await;
    status.starting();
    match result {
        Ok(l) => {
            status.set_ledger(l.clone());
            Ok(Some(l))
        }
        Err(RetryError::Cancelled(_)) => Ok(None),
        Err(RetryError::Permanent(e)) => Err(anyhow::Error::new(e).context("connecting to Redis")),
    }
}

/// `exactly_once`: registers the transactional id and opens the first
/// transaction, waiting out an unreachable broker with backoff (a consumer
/// restarted while the broker is down recovers by itself). `None` when
/// shutdown was requested meanwhile.
async fn start_transactions(
    settings: &Settings,
    publisher: &Publisher,
    offsets: &Offsets,
    shutdown: &CancellationToken,
    status: &Status,
) -> anyhow::Result<Option<Arc<Transactions>>> {
    let policy = RetryPolicy::from(&settings.retry);
    let topic = settings.kafka.input_topic.clone();
    let result = retry(
        &policy,
        shutdown,
        |e: &rdkafka::error::KafkaError| match e {
            rdkafka::error::KafkaError::Transaction(t) if t.is_fatal() => {
                crate::error::Disposition::Fatal
            }
            other => crate::kafka::publisher::classify(other),
        },
        |e, delay| {
            metrics::retry("kafka");
            status.waiting("kafka", "transactions not ready at startup, retrying");
            tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "kafka transactions not ready at startup; retrying");
        },
        || {
            let (p, o, t) = (publisher.clone(), offsets.clone(), topic.clone());
            let stall = settings.transaction_timeout();
            async move {
                match tokio::task::spawn_blocking(move || p.start_transactions(o, &t, stall)).await {
                    Ok(r) => r,
                    Err(_) => Err(rdkafka::error::KafkaError::Canceled),
                }
            }
        },
    )
    .await;
    status.starting();
    match result {
        Ok(t) => {
            tracing::info!(transactional_id = %settings.kafka.transactional_id(), "exactly_once: transactions started");
            Ok(Some(t))
        }
        Err(RetryError::Cancelled(_)) => Ok(None),
        Err(RetryError::Permanent(e)) => Err(anyhow::Error::new(e).context(format!(
            "starting Kafka transactions (transactional.id {})",
            settings.kafka.transactional_id()
        ))),
    }
}

/// [`run`], reporting to `status` (the HTTP endpoints read it).
pub async fn run_with_status(
    settings: Settings,
    shutdown: CancellationToken,
    status: Arc<Status>,
) -> anyhow::Result<()> {
    let Some(ledger) = connect_ledger(&settings, &shutdown, &status).await? else {
        return Ok(());
    };
    run_with_ledger(settings, shutdown, status, ledger).await
}

/// [`run_with_status`] over a ledger connected already: `deductor run`
/// shares one pool between the pipeline and `/readyz`. The pool is closed
/// when the pipeline stops.
pub async fn run_with_ledger(
    settings: Settings,
    shutdown: CancellationToken,
    status: Arc<Status>,
    ledger: Ledger,
) -> anyhow::Result<()> {
    // The wedge watchdog (a pool whose calls time out while Redis answers),
    // for as long as the pipeline runs.
    let _watchdog = {
        let stop = shutdown.child_token();
        tokio::spawn(crate::ledger::wedge::watch(
            ledger.clone(),
            settings.redis.clone(),
            Duration::from_secs(settings.http.stall_timeout_secs),
            status.clone(),
            stop.clone(),
        ));
        stop.drop_guard()
    };
    // The bucket sweeper: gifts a crashed delivery left in a bucketed
    // promotion's buckets (docs/buckets.md, "The sweeper").
    let _sweeper = {
        let stop = shutdown.child_token();
        let (ledger, token) = (ledger.clone(), stop.clone());
        tokio::spawn(async move { ledger.sweep_forever(token).await });
        stop.drop_guard()
    };
    let publisher = Publisher::new(&settings.kafka).context("creating the Kafka producer")?;
    let offsets = Offsets::new();
    // Every commit names the ledger marker of the dataset its events were
    // decided against (docs/contract.md section 2): read now and every 30 s
    // (the first `promo set` of a new deployment writes it later).
    let _marker_reader = {
        let stop = shutdown.child_token();
        let (ledger, offsets, token) = (ledger.clone(), offsets.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(Some(m)) = ledger.ledger_marker().await {
                    offsets.set_ledger_marker(&m.id);
                }
                tokio::select! {
                    () = token.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(30)) => {}
                }
            }
        });
        stop.drop_guard()
    };
    let txn = match settings.kafka.delivery {
        Delivery::AtLeastOnce => None,
        Delivery::ExactlyOnce => {
            match start_transactions(&settings, &publisher, &offsets, &shutdown, &status).await? {
                Some(t) => Some(t),
                None => return Ok(()),
            }
        }
    };
    let partitions = routing::partition_count(&settings.kafka).await;
    if let Some(n) = partitions {
        let share = group::prefetch_share(settings.kafka.prefetch_budget_kib, Some(n));
        tracing::info!(
            partitions = n,
            budget_kib = settings.kafka.prefetch_budget_kib,
            queued_kib = share.queued_kib,
            fetch_kib = share.fetch_kib,
            "prefetch shared among the input topic's partitions"
        );
    }
    let consumer = Arc::new(
        group::create(&settings.kafka, offsets.clone(), txn.clone(), partitions)
            .context("creating the Kafka consumer")?,
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
        warnings: crate::telemetry::Sampler::per_second(),
    });
    let global = Arc::new(Semaphore::new(settings.pipeline.max_in_flight));
    let (fatal_tx, mut fatal_rx) = mpsc::unbounded_channel();
    let mut lanes = Lanes {
        by_partition: HashMap::new(),
        retiring: HashMap::new(),
        queues,
        turns: fetch_turns::FetchTurns::new(
            settings.kafka.prefetch_budget_kib.saturating_mul(1024),
            {
                let share = group::prefetch_share(settings.kafka.prefetch_budget_kib, partitions);
                (share.queued_kib + share.fetch_kib) * 1024
            },
        ),
        pulls: FuturesUnordered::new(),
        spawner: Spawner {
            processor,
            offsets: offsets.clone(),
            global: global.clone(),
            capacity: settings.pipeline.max_in_flight_per_partition,
            shutdown: shutdown.clone(),
            fatal: fatal_tx,
            status: status.clone(),
            txn: txn.clone(),
            start: Some(lane::StartCheck {
                consumer: Arc::downgrade(&consumer),
                topic: settings.kafka.input_topic.clone(),
            }),
            next_id: 0,
        },
    };
    let mut txn_tick = tokio::time::interval(Duration::from_millis(
        settings.kafka.transaction_interval_ms,
    ));
    txn_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut boundary: Option<JoinHandle<KafkaResult<Boundary>>> = None;
    // A boundary retries its calls for at most the transaction timeout
    // (then aborts or renews), and abandons a call that hangs inside
    // librdkafka (librdkafka #5456, #5511) for a renewed producer; one that
    // has not returned long after that could not even renew: the last
    // resort is to exit so that a new instance takes over.
    let stuck_after = 2 * settings.transaction_timeout() + Duration::from_secs(30);
    let mut boundary_since = tokio::time::Instant::now();
    // The same bound from a thread of its own, for a loop blocked with the
    // boundary (a rebalance callback waiting on it).
    let boundary_watch = txn
        .is_some()
        .then(|| boundary_watch::BoundaryWatch::start(stuck_after));
    let topic = settings.kafka.input_topic.as_str();
    let mut commit_tick =
        tokio::time::interval(Duration::from_millis(settings.pipeline.commit_interval_ms));
    commit_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stash_tick = tokio::time::interval(Duration::from_millis(5));
    let mut fatal: Option<anyhow::Error> = None;
    let mut drained_checks = 0u32;
    let mut refusals = crate::kafka::refusal::Refusals::default();
    status.running();

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
                match &txn {
                    // exactly_once: a producer in librdkafka's fatal state
                    // (fenced, its epoch bumped by a transaction timeout) is
                    // replaced by the next boundary, which rewinds.
                    Some(t) if crate::kafka::publisher::unusable(&failure.source) => {
                        t.poison(&failure.reason);
                        publisher.clear_fatal();
                    }
                    _ => {
                        fatal = Some(anyhow::Error::new(failure).context("kafka producer"));
                        break;
                    }
                }
            }
            // Rebalance callbacks run inside `consumer.recv()` below; their
            // notes are applied before any message pulled after them.
            _ = consumer.context().noted() => {
                lanes.apply_notes(&consumer, topic, &status);
            }
            // exactly_once: end the open transaction, start the next.
            _ = txn_tick.tick(), if txn.is_some() && boundary.is_none() => {
                if let Some(t) = &txn {
                    let (t, c) = (t.clone(), consumer.clone());
                    boundary = Some(tokio::spawn(async move {
                        t.boundary(move || crate::kafka::membership::fenceable_metadata(&c)).await
                    }));
                    boundary_since = tokio::time::Instant::now();
                    if let Some(w) = &boundary_watch {
                        w.begin();
                    }
                }
            }
            _ = tokio::time::sleep_until(boundary_since + stuck_after), if boundary.is_some() => {
                fatal = Some(anyhow::anyhow!(
                    "the kafka transaction boundary has not returned for {} s: exiting so that a new \
                     instance takes over (its open transaction is abandoned; its events are redone)",
                    stuck_after.as_secs()
                ));
                break;
            }
            ended = async { boundary.as_mut().expect("armed").await }, if boundary.is_some() => {
                boundary = None;
                if let Some(w) = &boundary_watch {
                    w.end();
                }
                match ended {
                    Ok(Ok(Boundary::Committed)) => {}
                    Ok(Ok(Boundary::Rewind(why))) => {
                        // Every partition resumes from its committed offset:
                        // leave the group and join again (the revoke retires
                        // the lanes, the assignment starts new ones).
                        tracing::warn!(reason = %why, "transaction aborted: rejoining the group to resume from the committed offsets");
                        consumer.unsubscribe();
                        if let Err(e) = consumer.subscribe(&[topic]) {
                            fatal = Some(anyhow::Error::new(e).context("subscribing again after an abort"));
                            break;
                        }
                    }
                    Ok(Err(e)) => {
                        fatal = Some(anyhow::Error::new(e).context("kafka transaction"));
                        break;
                    }
                    Err(e) => {
                        fatal = Some(anyhow::Error::new(e).context("transaction boundary task"));
                        break;
                    }
                }
            }
            _ = commit_tick.tick() => {
                lanes.apply_notes(&consumer, topic, &status);
                if txn.is_none() {
                    commit::watermarks(&*consumer, &offsets, topic, CommitMode::Async);
                }
                metrics::in_flight(settings.pipeline.max_in_flight - global.available_permits());
                lanes.spawner.processor.warnings.log_suppressed();
                status.touch();
                if settings.pipeline.exit_when_drained {
                    let idle = |p: i32| {
                        // (an armed pull holds one permit of the lane's channel)
                        lanes.by_partition.get(&p).is_none_or(|l| {
                            l.stash.is_empty()
                                && l.tx.capacity() + usize::from(l.pulling) == l.tx.max_capacity()
                        })
                    };
                    // Twice in a row (see `drained`).
                    // A partition paused for its turn has a stale high
                    // watermark: never drained while one waits.
                    let waiting = lanes.turns.paused() > 0;
                    drained_checks = if !waiting && drained(&consumer, &offsets, topic, idle) {
                        drained_checks + 1
                    } else {
                        0
                    };
                    if drained_checks >= 2 {
                        tracing::info!("every assigned partition is processed to its end: stopping");
                        break;
                    }
                }
            }
            _ = stash_tick.tick(), if stashed => {
                for (p, lane) in lanes.by_partition.iter_mut() {
                    flush_stash(&consumer, topic, *p, lane, lanes.turns.is_paused(*p));
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
                    if let Some(e) = consumer_error(e, &mut refusals) {
                        fatal = Some(e);
                        break;
                    }
                }
            }
            Some(pulled) = lanes.pulls.next(), if !lanes.pulls.is_empty() => {
                status.touch();
                lanes.apply_notes(&consumer, topic, &status);
                if let Err(e) = lanes.hand_over(&consumer, topic, pulled) {
                    if let Some(e) = consumer_error(e, &mut refusals) {
                        fatal = Some(e);
                        break;
                    }
                }
            }
        }
    }

    if let Some(w) = &boundary_watch {
        w.stop();
    }
    // Drain: start nothing new, let in-flight events finish (bounded), then
    // commit what was acknowledged and leave the group, each step bounded.
    let held = wind_down::Held {
        lanes,
        boundary,
        txn,
        consumer,
        offsets,
        publisher,
        tracer,
        ledger,
    };
    let abandoned = wind_down::wind_down(held, &settings).await;
    if fatal.is_none() && !abandoned.is_empty() {
        fatal = Some(anyhow::anyhow!(
            "stopped with unfinished work abandoned ({}): it is redone by the next owner",
            abandoned.join(", ")
        ));
    }
    match fatal {
        Some(e) => Err(e),
        None => {
            tracing::info!("stopped cleanly");
            Ok(())
        }
    }
}
