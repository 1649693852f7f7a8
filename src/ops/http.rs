//! The HTTP server: `/metrics` (Prometheus text), `/healthz` (liveness),
//! `/readyz` (readiness). Its client, `deductor healthcheck`, is
//! [`crate::admin::healthcheck`].

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::HttpSettings;
use crate::ops::health::Status;

#[derive(Clone)]
struct AppState {
    metrics: PrometheusHandle,
    status: Arc<Status>,
    stall_timeout: Duration,
}

/// Installs the global Prometheus recorder (once per process).
pub fn install_recorder() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
            &[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ],
        )?
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(crate::metrics::BATCH_LINES.into()),
            &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0],
        )?
        .install_recorder()?;
    crate::metrics::describe();
    crate::metrics::cache_handles();
    spawn_upkeep(handle.clone(), METRICS_UPKEEP);
    Ok(handle)
}

/// How often histogram samples are folded into their buckets whether or not
/// anything scrapes `/metrics`.
pub const METRICS_UPKEEP: Duration = Duration::from_secs(1);

/// Folds the recorder's histogram samples into their buckets every `every`,
/// until the runtime stops. The exporter keeps each sample it is given (about
/// 16 bytes with its bucket's blocks; an event records seven) until its
/// upkeep runs, and a recorder installed with `install_recorder` leaves that
/// to its caller: with upkeep only on a scrape, a pod nobody scrapes (or
/// scrapes every few minutes) held every sample since the last scrape, about
/// one more MiB per 9,000 events, without bound. Needs a Tokio runtime (every
/// caller runs in one).
pub fn spawn_upkeep(handle: PrometheusHandle, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    })
}

/// Connections kept for `/healthz` and `/readyz` beyond
/// `http.max_connections`: with every ordinary slot held (a scraper gone
/// wild, or connections opened and left), the kubelet's probes still get an
/// answer. On these connections any other path answers 503.
pub const PROBE_SLOTS: usize = 4;

/// What one client may hold, from `[http]`.
#[derive(Debug, Clone, Copy)]
struct Limits {
    header_read: Duration,
    idle: Duration,
}

/// Binds `http.listen` and serves until `shutdown` is cancelled.
pub async fn serve(
    http: &HttpSettings,
    metrics: PrometheusHandle,
    status: Arc<Status>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listen = &http.listen;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("http.listen {listen}: {e}"))?;
    tracing::info!(%listen, "http endpoints up");
    serve_on(listener, http.clone(), metrics, status, shutdown).await;
    Ok(())
}

/// Serves on a bound `listener` until `shutdown` is cancelled; open
/// connections are then dropped.
///
/// Each connection must send a request's headers within
/// `http.header_read_timeout_ms` of the server waiting for them (this also
/// ends a kept-alive connection that sends no next request), and is closed
/// once no byte moved either way for `http.idle_timeout_ms`. At most
/// `http.max_connections` are served, plus [`PROBE_SLOTS`] for the probes;
/// a connection beyond both gets a 503 and is closed at once.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    http: HttpSettings,
    metrics: PrometheusHandle,
    status: Arc<Status>,
    shutdown: CancellationToken,
) {
    let state = AppState {
        metrics,
        status,
        stall_timeout: Duration::from_secs(http.stall_timeout_secs),
    };
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state.clone());
    let probes = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(over_capacity)
        .with_state(state);
    let limits = Limits {
        header_read: Duration::from_millis(http.header_read_timeout_ms),
        idle: Duration::from_millis(http.idle_timeout_ms),
    };
    let ordinary = Arc::new(Semaphore::new(http.max_connections));
    let reserved = Arc::new(Semaphore::new(PROBE_SLOTS));
    let mut connections = JoinSet::new();
    let mut refusals = Throttled::default();
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, most likely: wait a little
                    // instead of spinning on the same error.
                    refusals.warn(|n| tracing::warn!(error = %e, times = n, "http: accepting a connection failed"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (permit, router) = match ordinary.clone().try_acquire_owned() {
            Ok(p) => (p, app.clone()),
            Err(_) => match reserved.clone().try_acquire_owned() {
                Ok(p) => (p, probes.clone()),
                Err(_) => {
                    // Never blocks: a fresh socket's send buffer takes it.
                    let _ = stream.try_write(REFUSED);
                    refusals.warn(|n| {
                        tracing::warn!(
                            times = n,
                            max_connections = http.max_connections,
                            "http: connection limit reached; connections refused with 503"
                        )
                    });
                    continue;
                }
            },
        };
        connections.spawn(connection(stream, router, limits, permit));
    }
}

/// The answer to a connection beyond every slot.
const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-type: text/plain\r\ncontent-length: 29\r\n\r\nhttp connection limit reached";

/// A warning at most every 10 s, with how often it happened meanwhile.
#[derive(Default)]
struct Throttled {
    last: Option<tokio::time::Instant>,
    since: u64,
}

impl Throttled {
    fn warn(&mut self, log: impl FnOnce(u64)) {
        self.since += 1;
        let now = tokio::time::Instant::now();
        if self
            .last
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10))
        {
            log(self.since);
            self.last = Some(now);
            self.since = 0;
        }
    }
}

async fn over_capacity() -> impl IntoResponse {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(axum::http::header::CONNECTION, "close")],
        "http connection limit reached; only /healthz and /readyz are served\n",
    )
}

/// Serves one connection until the client closes it, a timeout ends it, or
/// the task is dropped (shutdown). Holds its slot while it lives.
async fn connection(
    stream: tokio::net::TcpStream,
    router: Router,
    limits: Limits,
    _slot: OwnedSemaphorePermit,
) {
    let origin = tokio::time::Instant::now();
    let moved = Arc::new(AtomicU64::new(0));
    let io = TokioIo::new(Watched {
        inner: stream,
        moved: moved.clone(),
        origin,
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    let conn = builder.serve_connection(io, TowerToHyperService::new(router));
    tokio::pin!(conn);
    let mut tick = tokio::time::interval((limits.idle / 4).max(Duration::from_millis(10)));
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "http connection ended");
                }
                return;
            }
            _ = tick.tick() => {
                let last = Duration::from_millis(moved.load(Ordering::Relaxed));
                if origin.elapsed().saturating_sub(last) >= limits.idle {
                    tracing::debug!("http connection idle: closed");
                    return;
                }
            }
        }
    }
}

/// A socket that notes when a byte last moved (milliseconds since
/// `origin`), for the idle timeout.
struct Watched {
    inner: tokio::net::TcpStream,
    moved: Arc<AtomicU64>,
    origin: tokio::time::Instant,
}

impl Watched {
    fn note(&self, n: usize) {
        if n > 0 {
            let ms = self.origin.elapsed().as_millis() as u64;
            self.moved.store(ms, Ordering::Relaxed);
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.note(n);
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r {
            self.note(*n);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

async fn metrics_handler(State(s): State<AppState>) -> impl IntoResponse {
    s.metrics.run_upkeep();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        s.metrics.render(),
    )
}

/// Liveness: the processing loop keeps making progress, or the start waits
/// out a dependency. It does not look at Kafka or Redis: an outage is waited
/// out, not fixed by a restart.
async fn healthz(State(s): State<AppState>) -> impl IntoResponse {
    match s.status.liveness(s.stall_timeout) {
        Ok(ok) => (StatusCode::OK, format!("{ok}\n")),
        Err(stalled) => (StatusCode::SERVICE_UNAVAILABLE, format!("{stalled}\n")),
    }
}

/// Readiness: started, partitions assigned and Redis answering; else why not.
async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    let assigned = match s.status.readiness() {
        Ok(n) => n,
        Err(why) => return (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    };
    if let Some(l) = s.status.ledger() {
        if let Err(e) = tokio::time::timeout(Duration::from_secs(2), l.ping())
            .await
            .map_err(|_| "timeout".to_owned())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            // The wedge watchdog tells an outage from a wedged client.
            let seen = s
                .status
                .redis_note()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: redis: {e}{seen}\n"),
            );
        }
    }
    (StatusCode::OK, format!("ready: {assigned} partitions\n"))
}
