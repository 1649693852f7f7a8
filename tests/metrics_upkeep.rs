//! The metrics recorder's memory stays bounded when nothing scrapes
//! `/metrics`: histogram samples are folded into their buckets by the
//! service's own upkeep, not only by a scrape (`ops::http::spawn_upkeep`).
//!
//! Its own test binary: it installs the process's global recorder and
//! counts the live heap bytes with a global allocator of its own, so no
//! other test may share the process.

use std::time::Duration;

use deductor_testkit::alloc::{live, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A pod that nobody scrapes records a million events' histogram samples
/// (two a call, as an event's stages and duration do): the heap they hold
/// stays within a small bound. Before the upkeep task, every sample stayed
/// until the next scrape: about 16 bytes each, 32.75 MB here (measured).
#[tokio::test(start_paused = true)]
async fn histogram_samples_are_folded_without_a_scrape() {
    let _handle = deductor::ops::http::install_recorder().expect("install the recorder");
    let period = deductor::ops::http::METRICS_UPKEEP;
    // Every series exists and has been folded once before the count starts.
    deductor::metrics::stage("redis", 0.001);
    deductor::metrics::event_duration(0.002);
    tokio::time::sleep(period * 2).await;
    let before = live();
    for _ in 0..20 {
        for _ in 0..50_000 {
            deductor::metrics::stage("redis", 0.001);
            deductor::metrics::event_duration(0.002);
        }
        // Paused time: the sleep moves the clock on, and the upkeep task runs.
        tokio::time::sleep(period + Duration::from_millis(10)).await;
    }
    let grown = live() - before;
    assert!(
        grown < 1 << 20,
        "2,000,000 histogram samples left {grown} bytes on the heap with no scrape \
         (kept until a scrape: about 16 bytes a sample)"
    );
}
