//! A TCP proxy in front of a Redis node that wedges its clients'
//! connections while new ones keep working: what a client whose replies fell
//! out of step, or whose connection task hangs, looks like from outside.
//! Used by the wedge test (`tests/it/service/wedged_client.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with the bytes of its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wedge {
    /// Everything flows.
    Flowing,
    /// The connections opened before this mode was set hold every byte
    /// (both ways); later ones flow.
    Existing { below: u64 },
    /// A connection holds every byte from the first one that carries a
    /// script call (`EVAL`, `EVALSHA`) on, new connections included: a
    /// fresh connection's handshake and `PING` still answer.
    Scripts,
}

pub struct WedgeProxy {
    pub port: u16,
    state: watch::Sender<Wedge>,
    next_id: Arc<AtomicU64>,
}

impl WedgeProxy {
    /// Listens on a free loopback port and relays to `target` there.
    pub async fn start(target: u16) -> anyhow::Result<WedgeProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding the wedge proxy")?;
        let port = listener.local_addr().context("wedge proxy address")?.port();
        let (state, rx) = watch::channel(Wedge::Flowing);
        let next_id = Arc::new(AtomicU64::new(0));
        let ids = next_id.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let id = ids.fetch_add(1, Ordering::SeqCst);
                let rx = rx.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    relay(id, client, server, rx).await;
                });
            }
        });
        Ok(WedgeProxy {
            port,
            state,
            next_id,
        })
    }

    /// Wedges the connections open now; new ones flow.
    pub fn wedge_existing(&self) {
        let below = self.next_id.load(Ordering::SeqCst);
        let _ = self.state.send(Wedge::Existing { below });
    }

    /// Wedges every connection at its first script call.
    pub fn wedge_scripts(&self) {
        let _ = self.state.send(Wedge::Scripts);
    }

    pub fn flow(&self) {
        let _ = self.state.send(Wedge::Flowing);
    }
}

/// Whether connection `id` holds its bytes now (`scripted`: it has sent a
/// script call since the last `Flowing`).
fn held(mode: Wedge, id: u64, scripted: bool) -> bool {
    match mode {
        Wedge::Flowing => false,
        Wedge::Existing { below } => id < below,
        Wedge::Scripts => scripted,
    }
}

async fn relay(id: u64, client: TcpStream, server: TcpStream, rx: watch::Receiver<Wedge>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut c_rd, mut c_wr) = client.into_split();
    let (mut s_rd, mut s_wr) = server.into_split();
    let scripted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (up_rx, up_scripted) = (rx.clone(), scripted.clone());
    let upstream = tokio::spawn(async move {
        let mut rx = up_rx;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match c_rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            if *rx.borrow() == Wedge::Scripts && chunk.windows(4).any(|w| w == b"EVAL") {
                up_scripted.store(true, Ordering::SeqCst);
            }
            if !wait_flowing(&mut rx, id, &up_scripted).await {
                return;
            }
            if s_wr.write_all(chunk).await.is_err() {
                return;
            }
        }
    });
    let mut rx = rx;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if !wait_flowing(&mut rx, id, &scripted).await {
            break;
        }
        tokio::select! {
            r = s_rd.read(&mut buf) => {
                let n = match r {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if !wait_flowing(&mut rx, id, &scripted).await {
                    break;
                }
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

/// Waits while the connection is held; false when the proxy is gone.
async fn wait_flowing(
    rx: &mut watch::Receiver<Wedge>,
    id: u64,
    scripted: &std::sync::atomic::AtomicBool,
) -> bool {
    loop {
        let mode = *rx.borrow_and_update();
        if mode == Wedge::Flowing {
            scripted.store(false, Ordering::SeqCst);
        }
        if !held(mode, id, scripted.load(Ordering::SeqCst)) {
            return true;
        }
        if rx.changed().await.is_err() {
            return false;
        }
    }
}
