//! `/metrics` (Prometheus text), `/healthz` (liveness), `/readyz` (readiness).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

use crate::ledger::Ledger;
use crate::ops::health::Status;

#[derive(Clone)]
struct AppState {
    metrics: PrometheusHandle,
    status: Arc<Status>,
    ledger: Option<Ledger>,
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
        .install_recorder()?;
    crate::metrics::describe();
    Ok(handle)
}

/// Serves until `shutdown` is cancelled.
pub async fn serve(
    listen: &str,
    metrics: PrometheusHandle,
    status: Arc<Status>,
    ledger: Option<Ledger>,
    stall_timeout: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let state = AppState {
        metrics,
        status,
        ledger,
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

/// Liveness: the processing loop keeps making progress. It does not look
/// at Kafka or Redis: an outage is waited out, not fixed by a restart.
async fn healthz(State(s): State<AppState>) -> impl IntoResponse {
    let since = s.status.since_progress();
    if since > s.stall_timeout {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("stalled: no progress for {}s\n", since.as_secs()),
        )
    } else {
        (StatusCode::OK, "ok\n".to_owned())
    }
}

/// Readiness: partitions assigned and Redis answering.
async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    let assigned = s.status.assigned.load(Ordering::Relaxed);
    if assigned == 0 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no partitions assigned\n".to_owned(),
        );
    }
    if let Some(l) = &s.ledger {
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

/// An answer of [`fetch`].
#[derive(Debug)]
pub struct Response {
    /// The status code (0 when the status line does not parse).
    pub status: u16,
    /// The whole status line, e.g. `HTTP/1.1 503 Service Unavailable`.
    pub status_line: String,
    pub body: String,
}

/// A minimal HTTP/1.0 GET of an `http://host:port/path` url, with a 5 s
/// timeout: for `deductor healthcheck` in images without curl.
pub async fn fetch(url: &str) -> anyhow::Result<Response> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("--url {url}: only http:// is supported"))?;
    let (host, path) = match rest.split_once('/') {
        Some((h, p)) => (h, format!("/{p}")),
        None => (rest, "/".to_owned()),
    };
    let io = async {
        let mut s = tokio::net::TcpStream::connect(host).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(5), io)
        .await
        .map_err(|_| anyhow::anyhow!("{url}: timed out"))?
        .map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status_line = head.lines().next().unwrap_or_default().to_owned();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok(Response {
        status,
        status_line,
        body: body.to_owned(),
    })
}

/// The `/healthz` url of a service listening on `listen` (`http.listen`):
/// a wildcard address (0.0.0.0, [::]) is reached on the loopback address of
/// its family, since the probe runs beside the service (a container's
/// HEALTHCHECK, an exec probe).
pub fn healthz_url(listen: &str) -> anyhow::Result<String> {
    if listen.is_empty() {
        anyhow::bail!(
            "http.listen is empty, so the service serves no /healthz: set http.listen (as the service has it) or pass --url"
        );
    }
    let mut addr: std::net::SocketAddr = listen.parse().map_err(|_| {
        anyhow::anyhow!("http.listen {listen:?} is not an address: use ip:port, or pass --url")
    })?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Ok(format!("http://{addr}/healthz"))
}

/// `deductor healthcheck`: OK when `url` answers 200.
pub async fn probe(url: &str) -> anyhow::Result<()> {
    let r = fetch(url).await?;
    if r.status == 200 {
        Ok(())
    } else {
        anyhow::bail!("{url}: {} {}", r.status_line, r.body.trim())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_url_follows_http_listen() {
        for (listen, url) in [
            ("0.0.0.0:9464", "http://127.0.0.1:9464/healthz"),
            ("0.0.0.0:8080", "http://127.0.0.1:8080/healthz"),
            ("[::]:9000", "http://[::1]:9000/healthz"),
            ("127.0.0.1:9555", "http://127.0.0.1:9555/healthz"),
            ("10.1.2.3:80", "http://10.1.2.3:80/healthz"),
            ("[::1]:9464", "http://[::1]:9464/healthz"),
        ] {
            assert_eq!(healthz_url(listen).unwrap(), url, "{listen}");
        }
        for listen in ["", "nowhere"] {
            let e = healthz_url(listen).unwrap_err().to_string();
            assert!(e.contains("http.listen") && e.contains("--url"), "{e}");
        }
    }
}
