//! A TCP proxy in front of a Kafka broker (which advertises the proxy as its
//! listener) that wedges one transactional producer while the broker and
//! every other client stay fine: what a producer whose transaction calls
//! hang inside librdkafka (#5456, #5511) looks like from outside.
//!
//! Once [`KafkaWedge::arm`]ed, the first `AddOffsetsToTxn` or `EndTxn`
//! request through the proxy names the victim: its producer id and epoch.
//! From then on, every connection that carries a transactional request
//! (`InitProducerId`, `AddOffsetsToTxn`, `EndTxn`) of that producer id at
//! that epoch or an older one holds every byte, both ways, for good (the
//! request itself included), so its calls never get an answer however often
//! the client reconnects. A new producer under the same `transactional.id`
//! gets a higher epoch from the broker and flows. Used by
//! `tests/it/service/hung_transaction.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const INIT_PRODUCER_ID: i16 = 22;
const ADD_OFFSETS_TO_TXN: i16 = 25;
const END_TXN: i16 = 26;

#[derive(Default)]
struct Shared {
    armed: AtomicBool,
    /// (producer id, epoch) of the wedged producer.
    victim: Mutex<Option<(i64, i16)>>,
    wedged: AtomicU64,
}

pub struct KafkaWedge {
    pub port: u16,
    shared: Arc<Shared>,
}

impl KafkaWedge {
    /// Listens on a free loopback port and relays to `target` there.
    pub async fn start(target: u16) -> anyhow::Result<KafkaWedge> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding the kafka wedge proxy")?;
        let port = listener.local_addr().context("proxy address")?.port();
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    relay(client, server, s).await;
                });
            }
        });
        Ok(KafkaWedge { port, shared })
    }

    /// The next `AddOffsetsToTxn` or `EndTxn` names the producer to wedge.
    pub fn arm(&self) {
        self.shared.armed.store(true, Ordering::SeqCst);
    }

    /// The wedged producer's (id, epoch), once named.
    pub fn victim(&self) -> Option<(i64, i16)> {
        *self.shared.victim.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connections wedged so far.
    pub fn wedged_connections(&self) -> u64 {
        self.shared.wedged.load(Ordering::SeqCst)
    }
}

impl Shared {
    /// Whether the request in `frame` (without its size) wedges its
    /// connection.
    fn wedges(&self, frame: &[u8]) -> bool {
        let Some((api, pid, epoch)) = producer_of(frame) else {
            return false;
        };
        let mut victim = self.victim.lock().unwrap_or_else(|p| p.into_inner());
        if victim.is_none()
            && pid >= 0
            && api != INIT_PRODUCER_ID
            && self.armed.load(Ordering::SeqCst)
        {
            *victim = Some((pid, epoch));
        }
        matches!(*victim, Some((v, e)) if pid == v && epoch <= e)
    }
}

async fn relay(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut c_rd, mut c_wr) = client.into_split();
    let (mut s_rd, mut s_wr) = server.into_split();
    let held = Arc::new(AtomicBool::new(false));
    let up_held = held.clone();
    let upstream = async move {
        loop {
            let mut size = [0u8; 4];
            if c_rd.read_exact(&mut size).await.is_err() {
                return;
            }
            let n = i32::from_be_bytes(size).max(0) as usize;
            let mut frame = vec![0u8; n];
            if c_rd.read_exact(&mut frame).await.is_err() {
                return;
            }
            if up_held.load(Ordering::SeqCst) || shared.wedges(&frame) {
                if !up_held.swap(true, Ordering::SeqCst) {
                    shared.wedged.fetch_add(1, Ordering::SeqCst);
                }
                // Hold both halves open, silent, for good.
                std::future::pending::<()>().await;
            }
            if s_wr.write_all(&size).await.is_err() || s_wr.write_all(&frame).await.is_err() {
                return;
            }
        }
    };
    let downstream = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match s_rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if held.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            if c_wr.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Either side ending (a close) ends the relay; a held one never ends.
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}

/// (api key, producer id, producer epoch) of an `InitProducerId` (v3+),
/// `AddOffsetsToTxn` or `EndTxn` request; `None` for any other.
fn producer_of(frame: &[u8]) -> Option<(i16, i64, i16)> {
    let mut r = Reader { b: frame, at: 0 };
    let api = r.i16()?;
    let version = r.i16()?;
    let flexible = match api {
        INIT_PRODUCER_ID => version >= 2,
        ADD_OFFSETS_TO_TXN | END_TXN => version >= 3,
        _ => return None,
    };
    if api == INIT_PRODUCER_ID && version < 3 {
        return None;
    }
    let _correlation = r.i32()?;
    // Header: client_id is always a (non-compact) nullable string.
    let client_id = r.i16()?;
    r.skip(client_id.max(0) as usize)?;
    if flexible {
        r.tagged_fields()?;
    }
    // transactional_id
    if flexible {
        let n = r.uvarint()?;
        r.skip(n.saturating_sub(1) as usize)?;
    } else {
        let n = r.i16()?;
        r.skip(n.max(0) as usize)?;
    }
    if api == INIT_PRODUCER_ID {
        let _timeout_ms = r.i32()?;
    }
    Some((api, r.i64()?, r.i16()?))
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }
    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    fn uvarint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.take(1)?.first()?;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    fn tagged_fields(&mut self) -> Option<()> {
        for _ in 0..self.uvarint()? {
            let _tag = self.uvarint()?;
            let size = self.uvarint()?;
            self.skip(usize::try_from(size).ok()?)?;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(api: i16, version: i16, flexible: bool) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(api.to_be_bytes());
        b.extend(version.to_be_bytes());
        b.extend(7i32.to_be_bytes());
        b.extend(3i16.to_be_bytes());
        b.extend(b"rdk");
        if flexible {
            b.push(0);
        }
        b
    }

    #[test]
    fn reads_the_producer_of_transactional_requests() {
        // EndTxn v3 (flexible): compact transactional_id "t1".
        let mut b = header(END_TXN, 3, true);
        b.push(3);
        b.extend(b"t1");
        b.extend(42i64.to_be_bytes());
        b.extend(5i16.to_be_bytes());
        b.push(1);
        assert_eq!(producer_of(&b), Some((END_TXN, 42, 5)));
        // AddOffsetsToTxn v2 (not flexible).
        let mut b = header(ADD_OFFSETS_TO_TXN, 2, false);
        b.extend(2i16.to_be_bytes());
        b.extend(b"t1");
        b.extend(42i64.to_be_bytes());
        b.extend(6i16.to_be_bytes());
        assert_eq!(producer_of(&b), Some((ADD_OFFSETS_TO_TXN, 42, 6)));
        // InitProducerId v4 of a new producer: no id yet.
        let mut b = header(INIT_PRODUCER_ID, 4, true);
        b.push(3);
        b.extend(b"t1");
        b.extend(60_000i32.to_be_bytes());
        b.extend((-1i64).to_be_bytes());
        b.extend((-1i16).to_be_bytes());
        assert_eq!(producer_of(&b), Some((INIT_PRODUCER_ID, -1, -1)));
        // Anything else, and truncated frames.
        assert_eq!(producer_of(&header(0, 9, true)), None);
        assert_eq!(producer_of(&b[..10]), None);
    }

    #[test]
    fn the_armed_wedge_holds_the_victim_and_older_epochs_only() {
        let s = Shared::default();
        let end_txn = |pid: i64, epoch: i16| {
            let mut b = header(END_TXN, 3, true);
            b.push(1);
            b.extend(pid.to_be_bytes());
            b.extend(epoch.to_be_bytes());
            b.push(0);
            b
        };
        assert!(!s.wedges(&end_txn(42, 5)), "not armed");
        s.armed.store(true, Ordering::SeqCst);
        assert!(s.wedges(&end_txn(42, 5)), "names the victim");
        assert!(s.wedges(&end_txn(42, 4)), "an older epoch");
        assert!(!s.wedges(&end_txn(42, 6)), "the renewed producer");
        assert!(!s.wedges(&end_txn(43, 0)), "another producer");
    }
}
