//! `deductor healthcheck`: GET the service's `/healthz` (or any url) and
//! exit 0 on a 200, for images without curl (a container's HEALTHCHECK, an
//! exec probe). The client is hyper-util's.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// An answer of [`fetch`].
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// The whole status line, e.g. `HTTP/1.1 503 Service Unavailable`.
    pub status_line: String,
    pub body: String,
}

/// The error and its causes on one line (hyper's own message alone says
/// only "client error (Connect)").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// GET an `http://` url, with a 5 s timeout.
pub async fn fetch(url: &str) -> anyhow::Result<Response> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| anyhow::anyhow!("--url {url}: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        anyhow::bail!("--url {url}: only http://host:port/path urls are supported");
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let io = async {
        let answer = client.get(uri).await.map_err(|e| chain(&e))?;
        let status = answer.status();
        let status_line = format!("{:?} {status}", answer.version());
        let body = answer
            .into_body()
            .collect()
            .await
            .map_err(|e| chain(&e))?
            .to_bytes();
        Ok::<_, String>(Response {
            status: status.as_u16(),
            status_line,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    tokio::time::timeout(Duration::from_secs(5), io)
        .await
        .map_err(|_| anyhow::anyhow!("{url}: timed out"))?
        .map_err(|e| anyhow::anyhow!("{url}: {e}"))
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
