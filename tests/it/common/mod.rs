//! Shared helpers of the integration tests: locate the real services through
//! env vars with loopback defaults (see `scripts/dev-stack env`).
#![allow(dead_code)]

pub mod contract;
pub mod kafka;
pub mod redis;
pub mod replication;
pub mod service;
pub mod workload;

use std::sync::{Arc, LazyLock, Mutex};

use tokio::sync::Notify;

/// Who uses the shared dev-stack servers right now: tests holding a
/// [`StackGuard`] (any number at once), or one test that takes a server
/// down ([`Exclusive`]). Unlike a fair read-write lock, a shared guard is
/// never refused while other shared guards exist, so a test may hold two
/// (a `Fixture` and a ledger) without deadlocking behind a waiting
/// exclusive test, which waits for a moment with no shared guard at all.
struct Stack {
    /// (shared guards alive, an exclusive holder exists)
    state: Mutex<(usize, bool)>,
    changed: Notify,
}

static STACK: LazyLock<Stack> = LazyLock::new(|| Stack {
    state: Mutex::new((0, false)),
    changed: Notify::new(),
});

/// A shared hold on the dev-stack servers; cloning shares the same hold.
#[derive(Debug, Clone)]
pub struct StackGuard(Arc<Shared>);

#[derive(Debug)]
struct Shared;

impl Drop for Shared {
    fn drop(&mut self) {
        if let Ok(mut s) = STACK.state.lock() {
            s.0 -= 1;
        }
        STACK.changed.notify_waiters();
    }
}

/// The only hold on the dev-stack servers: no other test uses them while
/// it lives.
pub struct Exclusive;

impl Drop for Exclusive {
    fn drop(&mut self) {
        if let Ok(mut s) = STACK.state.lock() {
            s.1 = false;
        }
        STACK.changed.notify_waiters();
    }
}

/// Waits until no test holds the servers exclusively, then holds them shared.
pub async fn stack_shared() -> StackGuard {
    loop {
        // Registered before the check, so a release in between is not missed.
        let changed = STACK.changed.notified();
        {
            let mut s = STACK.state.lock().expect("stack lock");
            if !s.1 {
                s.0 += 1;
                return StackGuard(Arc::new(Shared));
            }
        }
        changed.await;
    }
}

/// Waits until no other test holds the servers, then holds them alone.
pub async fn stack_exclusive() -> Exclusive {
    loop {
        let changed = STACK.changed.notified();
        {
            let mut s = STACK.state.lock().expect("stack lock");
            if s.0 == 0 && !s.1 {
                s.1 = true;
                return Exclusive;
            }
        }
        changed.await;
    }
}

/// The commit this checkout is at (`git rev-parse HEAD`), or None outside a
/// git checkout (a tarball: the binary then says `unknown`).
pub fn git_head() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
