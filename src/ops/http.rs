//! The HTTP server: `/metrics` (Prometheus text), `/healthz` (liveness),
//! `/readyz` (readiness). Its client, `deductor healthcheck`, is
//! [`crate::admin::healthcheck`].

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

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
    Ok(handle)
}

/// Serves until `shutdown` is cancelled. `deductor run` starts it before
/// anything else, so the probes answer while the start waits out Redis or
/// Kafka (`status` says what it waits for).
pub async fn serve(
    listen: &str,
    metrics: PrometheusHandle,
    status: Arc<Status>,
    stall_timeout: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let state = AppState {
        metrics,
        status,
        stall_timeout,
    };
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("http.listen {listen}: {e}"))?;
    tracing::info!(%listen, "http endpoints up");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await?;
    Ok(())
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
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: redis: {e}\n"),
            );
        }
    }
    (StatusCode::OK, format!("ready: {assigned} partitions\n"))
}
