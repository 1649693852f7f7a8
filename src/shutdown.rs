//! SIGTERM / ctrl-c -> a cancelled [`CancellationToken`].

use tokio_util::sync::CancellationToken;

/// Returns a token cancelled on the first SIGTERM or SIGINT. A second signal
/// is left to the default handler's successor: the process keeps draining.
pub fn on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested: draining in-flight events");
        t.cancel();
    });
    token
}

/// Once `token` is cancelled, gives the process `limit` to stop; past it,
/// logs what happened and exits 1 from a thread of its own (so a runtime
/// blocked on a call that ignores its timeout cannot hold it). Nothing is
/// lost: what was not committed is redone by the next owner.
pub fn watchdog(token: CancellationToken, limit: std::time::Duration) {
    tokio::spawn(async move {
        token.cancelled().await;
        std::thread::spawn(move || {
            std::thread::sleep(limit);
            tracing::error!(
                limit_s = limit.as_secs(),
                "shutdown did not finish within drain_timeout_secs + the shutdown bound: \
                 exiting now; unfinished work was abandoned and is redone by the next owner"
            );
            eprintln!(
                "deductor: shutdown took over {} s: unfinished work abandoned (redone by the next owner)",
                limit.as_secs()
            );
            std::process::exit(1);
        });
    });
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only ctrl-c stops the service");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
