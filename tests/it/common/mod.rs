//! Shared helpers of the integration tests: locate the real services through
//! env vars with loopback defaults (see `scripts/dev-stack env`).
#![allow(dead_code)]

pub mod contract;
pub mod kafka;
pub mod own_redis;
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

/// Checks the commit a binary of this build names (`deductor --version`,
/// `deductor_build_info`): the one build.rs gave this build, and either
/// `unknown` outside a git checkout (a tarball) or a commit of this checkout
/// that HEAD contains (HEAD may have moved on since the build).
pub fn assert_build_commit(printed: &str) {
    let built = env!("DEDUCTOR_GIT_COMMIT");
    assert_eq!(printed, built, "the binary names the commit of its build");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if git(&["rev-parse", "HEAD"]) {
        assert!(
            built.len() == 40 && git(&["merge-base", "--is-ancestor", built, "HEAD"]),
            "{built} is not a commit of this checkout's HEAD"
        );
    } else {
        assert_eq!(built, "unknown", "no git checkout: the commit is unknown");
    }
}
