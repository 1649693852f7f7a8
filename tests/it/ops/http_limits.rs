//! The HTTP endpoint's limits against the running server, over real
//! sockets: a request whose headers trickle in and a silent connection are
//! closed after their timeouts; beyond `http.max_connections` the probes
//! still answer while other connections are refused.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use deductor::config::HttpSettings;
use deductor::ops::health::Status;
use deductor::ops::http::{serve_on, PROBE_SLOTS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Generous: the bound a closed connection must meet is its timeout plus
/// this, never a speed.
const MARGIN: Duration = Duration::from_secs(5);

struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(header_read_ms: u64, idle_ms: u64, max_connections: usize) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let http = HttpSettings {
            listen: addr.to_string(),
            stall_timeout_secs: 60,
            header_read_timeout_ms: header_read_ms,
            idle_timeout_ms: idle_ms,
            max_connections,
        };
        let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve_on(
            listener,
            http,
            metrics,
            Arc::new(Status::default()),
            stop.clone(),
        ));
        Server { addr, stop, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(MARGIN, self.task)
            .await
            .expect("the server stops")
            .unwrap();
    }
}

/// `GET path` on a connection of its own, `Connection: close`: the status
/// code, or 0 when the connection closed without an answer.
async fn get(addr: SocketAddr, path: &str) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return 0;
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(MARGIN, s.read_to_end(&mut out))
        .await
        .expect("an answer and the connection closed");
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Waits until the server closes `s` (EOF or reset); panics after `within`.
async fn closed_within(s: &mut tokio::net::tcp::OwnedReadHalf, within: Duration, what: &str) {
    let mut buf = Vec::new();
    let r = tokio::time::timeout(within, s.read_to_end(&mut buf)).await;
    assert!(r.is_ok(), "{what}: still open after {within:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_request_and_a_silent_connection_are_closed() {
    let header_read = Duration::from_millis(800);
    let server = Server::start(800, 60_000, 64).await;

    // One header line every 200 ms: bytes keep moving (the idle timeout
    // alone would never end it), the headers never complete.
    let (mut r, mut w) = TcpStream::connect(server.addr).await.unwrap().into_split();
    let writer = tokio::spawn(async move {
        if w.write_all(b"GET /metrics HTTP/1.1\r\nhost: test\r\n")
            .await
            .is_err()
        {
            return;
        }
        for i in 0.. {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if w.write_all(format!("x-slow-{i}: 1\r\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
        }
    });
    closed_within(
        &mut r,
        header_read + MARGIN,
        "a request sending a header line every 200 ms",
    )
    .await;
    writer.abort();

    // A connection that sends nothing.
    let (mut r, _w) = TcpStream::connect(server.addr).await.unwrap().into_split();
    closed_within(&mut r, header_read + MARGIN, "a silent connection").await;

    // A kept-alive connection that sends no next request.
    let (mut r, mut w) = TcpStream::connect(server.addr).await.unwrap().into_split();
    w.write_all(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 12];
    r.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    closed_within(
        &mut r,
        header_read + MARGIN,
        "an idle kept-alive connection",
    )
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_connection_is_closed_after_the_idle_timeout() {
    // Headers may take a minute; no byte at all for 600 ms ends it.
    let server = Server::start(60_000, 600, 64).await;
    let (mut r, mut w) = TcpStream::connect(server.addr).await.unwrap().into_split();
    w.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
    closed_within(
        &mut r,
        Duration::from_millis(600) + MARGIN,
        "a stalled request",
    )
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_cap_connections_are_refused_while_the_probes_answer() {
    let server = Server::start(60_000, 60_000, 2).await;
    // Every ordinary slot held by a connection that sends nothing.
    let mut held: Vec<TcpStream> = Vec::new();
    for _ in 0..2 {
        held.push(TcpStream::connect(server.addr).await.unwrap());
    }
    // The probes still answer; anything else is refused.
    for _ in 0..3 {
        assert_eq!(
            get(server.addr, "/healthz").await,
            200,
            "/healthz at the cap"
        );
        assert_eq!(
            get(server.addr, "/readyz").await,
            503,
            "/readyz at the cap (nothing assigned)"
        );
        assert_eq!(
            get(server.addr, "/metrics").await,
            503,
            "/metrics beyond the cap"
        );
    }
    // With the probes' slots held too, a connection is refused at once.
    let mut probes_held = Vec::new();
    for _ in 0..PROBE_SLOTS {
        probes_held.push(TcpStream::connect(server.addr).await.unwrap());
    }
    // (The 503 is written as the connection is closed: a reset may beat it.)
    let refused = get(server.addr, "/healthz").await;
    assert!(
        refused == 503 || refused == 0,
        "beyond every slot: {refused}"
    );
    // A slot given back serves again.
    drop(probes_held);
    drop(held.pop());
    let deadline = tokio::time::Instant::now() + MARGIN;
    loop {
        if get(server.addr, "/metrics").await == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a freed slot is not reused"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(held);
    server.stop().await;
}
