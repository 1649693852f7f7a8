//! A TCP proxy in front of a Redis data node that can stall or cut the
//! replication stream, so that a primary acknowledges writes its replica
//! never gets: what the durability gate guards against. Used by the chaos
//! suite's failover fault and by the replication tests.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the replication link does with the primary's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Flowing,
    /// Held: not read from the primary (so never acknowledged by the replica).
    Stalled,
    /// Closed without delivering what was held.
    Cut,
}

/// A TCP proxy in front of a data node. Connections whose client sent
/// `PSYNC`/`SYNC` (a replica) obey [`Link`]; the others always flow.
pub struct LinkProxy {
    pub port: u16,
    state: watch::Sender<Link>,
}

impl LinkProxy {
    /// Listens on `port` of the loopback (0: any free port; see
    /// [`LinkProxy::port`]) and relays to `target` there.
    pub async fn start(port: u16, target: u16) -> anyhow::Result<LinkProxy> {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .with_context(|| format!("binding the link proxy on {port}"))?;
        let port = listener.local_addr().context("link proxy address")?.port();
        let (state, rx) = watch::channel(Link::Flowing);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let rx = rx.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    relay(client, server, rx).await;
                });
            }
        });
        Ok(LinkProxy { port, state })
    }

    pub fn set(&self, link: Link) {
        let _ = self.state.send(link);
    }
}

async fn relay(client: TcpStream, server: TcpStream, mut rx: watch::Receiver<Link>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut c_rd, mut c_wr) = client.into_split();
    let (mut s_rd, mut s_wr) = server.into_split();
    let replica = Arc::new(AtomicBool::new(false));
    let is_replica = replica.clone();
    let upstream = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match c_rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            if chunk.windows(4).any(|w| w == b"SYNC") {
                is_replica.store(true, Ordering::SeqCst);
            }
            if s_wr.write_all(chunk).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let link = *rx.borrow_and_update();
        if replica.load(Ordering::SeqCst) {
            match link {
                Link::Cut => break,
                Link::Stalled => {
                    if rx.changed().await.is_err() {
                        break;
                    }
                    continue;
                }
                Link::Flowing => {}
            }
        }
        tokio::select! {
            r = s_rd.read(&mut buf) => {
                let n = match r {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if c_wr.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            changed = rx.changed() => {
                if changed.is_err() {
                    break;
                }
            }
        }
    }
    upstream.abort();
}
