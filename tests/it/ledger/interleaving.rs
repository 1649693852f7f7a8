//! Two deliveries of one multi-line placement in flight at once, through the
//! real `Ledger`: a zombie consumer that wakes after its partitions moved, or
//! the previous owner finishing its in-flight events after a rebalance (the
//! revoke does not wait for them, and the first attempt of a step always
//! runs). One delivery is held at its first deduct by a TCP proxy in front of
//! Redis while the other delivery, and then the order's refund, run to the
//! end. The contract promises one decision per event, and a refund of an
//! order whose placement was rejected finds nothing to return.
//!
//! Finding 2 of docs/reliability.md: both promises broke before the fix;
//! these tests keep them (`scripts/test ledger::interleaving::`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::{self, placed, refunded, TestRedis};
use deductor::domain::decision::PlaceDecision;
use deductor::domain::event::OrderPlaced;
use deductor::ledger::scripts::{DEDUCT, DEDUCT_BATCH};
use deductor::ledger::{Ledger, LedgerError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// A proxy to Redis that, once armed, holds the first chunk the client sends
/// that calls `deduct.lua` (or `deduct_batch.lua`), until released.
struct Hold {
    addr: String,
    armed: Arc<AtomicBool>,
    held: Arc<Notify>,
    release: Arc<Notify>,
}

async fn hold_proxy(upstream: String) -> Hold {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let armed = Arc::new(AtomicBool::new(false));
    let held = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let (a, h, r) = (armed.clone(), held.clone(), release.clone());
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let server = TcpStream::connect(&upstream).await.unwrap();
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 || cw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
            let (a, h, r) = (a.clone(), h.clone(), r.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                // deduct.lua, alone or in a batch (the ledger batches
                // placement lines on a single Redis).
                let shas = [DEDUCT.sha1.as_bytes(), DEDUCT_BATCH.sha1.as_bytes()];
                while let Ok(n) = cr.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    let calls_deduct = shas
                        .iter()
                        .any(|sha| buf[..n].windows(sha.len()).any(|w| w == *sha))
                        || buf[..n].windows(12).any(|w| w == b"deduct.lua: ");
                    if calls_deduct && a.swap(false, Ordering::SeqCst) {
                        h.notify_one();
                        r.notified().await;
                    }
                    if sw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Hold {
        addr,
        armed,
        held,
        release,
    }
}

/// Promotion A has stock, B has none: the placement of lines A then B is
/// rejected on B after A was deducted (and released).
async fn setup() -> (TestRedis, Ledger, Hold) {
    let r = redis::standalone().await;
    r.seed("A", &[("stock", "10"), ("initial_stock", "10")])
        .await;
    r.seed("B", &[("stock", "0"), ("initial_stock", "0")]).await;
    r.ledger.load_scripts().await.unwrap();
    let upstream = redis::redis_url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let hold = hold_proxy(upstream).await;
    let slow = Ledger::connect(&redis::settings(
        &format!("redis://{}/{}", hold.addr, redis::TEST_DB),
        &r.prefix,
    ))
    .await
    .unwrap();
    (r, slow, hold)
}

/// Starts a delivery of `e` over the slow path and waits until the proxy
/// holds it at its first deduct.
async fn start_held(
    slow: &Ledger,
    hold: &Hold,
    e: &OrderPlaced,
) -> tokio::task::JoinHandle<Result<PlaceDecision, LedgerError>> {
    hold.armed.store(true, Ordering::SeqCst);
    let first = {
        let (slow, e) = (slow.clone(), e.clone());
        tokio::spawn(async move { slow.place(&e).await })
    };
    hold.held.notified().await;
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deliveries_of_one_event_publish_one_decision() {
    let (r, slow, hold) = setup().await;
    let e = placed("e1", "o1", "c1", 1_795_946_400, &[("A", 0, 1), ("B", 0, 1)]);

    // Delivery 1 (the zombie) looks up the memos, then is held at its first deduct.
    let first = start_held(&slow, &hold, &e).await;
    // Delivery 2 (the new owner) decides the event, then handles the order's refund.
    let second = r.ledger.place(&e).await.unwrap();
    let refund = r
        .ledger
        .refund(&refunded("e2", "o1", "c1", &[("A", None, None)]))
        .await
        .unwrap();
    hold.release.notify_one();
    let first = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    println!("delivery 2: {second:?}\nrefund: {refund:?}\ndelivery 1: {first:?}");
    let decision = |d: &PlaceDecision| match d {
        PlaceDecision::Rejected {
            reason,
            promotion_id,
            ..
        } => format!("rejected {reason} on {promotion_id}"),
        PlaceDecision::Accepted { lines, .. } => format!("accepted {lines:?}"),
    };
    assert_eq!(decision(&second), "rejected stock_insufficient on B");
    assert_eq!(
        decision(&first),
        decision(&second),
        "two decisions for one event"
    );
    assert_eq!(
        r.promo_field("A", "stock").await.as_deref(),
        Some("10"),
        "A holds nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_never_applies_to_a_rejected_placement() {
    let (r, slow, hold) = setup().await;
    let e = placed("e1", "o1", "c1", 1_795_946_400, &[("A", 0, 1), ("B", 0, 1)]);

    // Delivery 1 has looked up the memos and is held at its deduct of A
    // while delivery 2 decides the event (and releases A); before the fix,
    // delivery 1 then deducted A afresh and was held again before B while
    // the refund ran.
    let first = start_held(&slow, &hold, &e).await;
    let second = r.ledger.place(&e).await.unwrap();
    hold.armed.store(true, Ordering::SeqCst);
    hold.release.notify_one();
    // Had delivery 1 deducted A afresh, it would now be held before B. With
    // the released mark it deducts nothing more: no second hold comes.
    let _ = tokio::time::timeout(Duration::from_secs(3), hold.held.notified()).await;
    let refund = r
        .ledger
        .refund(&refunded("e2", "o1", "c1", &[("A", None, None)]))
        .await
        .unwrap();
    hold.release.notify_one();
    let first = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    println!("delivery 2: {second:?}\ndelivery 1: {first:?}\nrefund: {refund:?}");
    assert!(matches!(second, PlaceDecision::Rejected { .. }));
    let line = &refund.lines[0];
    assert_eq!(
        line.status.map_err(|r| r.as_str()),
        Err("no_deduction"),
        "the refund of a rejected order returned {} stock",
        line.stock
    );
}
