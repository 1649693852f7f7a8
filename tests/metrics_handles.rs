//! The metrics recorded for every event go to the installed recorder through
//! handles registered once (`metrics::cache_handles`), not through a lookup
//! that builds the metric's key (three allocations for a labelled one) on
//! every record.
//!
//! Its own test binary: it installs the process's global recorder and counts
//! allocations with a global allocator of its own, so no other test may share
//! the process.

use deductor_testkit::alloc::{calls, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What one event records, as the pipeline records it: its five stages, its
/// outcome, its duration and its end-to-end latency, and a script call.
fn one_event(now_ms: i64) {
    for stage in deductor::metrics::STAGES {
        deductor::metrics::stage(stage, 0.001);
    }
    deductor::metrics::event("OrderPlaced", "accepted");
    deductor::metrics::event_duration(0.002);
    deductor::metrics::end_to_end(Some(now_ms - 5));
    deductor::metrics::script_duration("deduct_batch", 0.0005);
}

/// 10,000 events' records reach the exporter, each series with its labels,
/// and allocate less than one call per ten records (the histograms' sample
/// blocks). Looked up on each record, as before, they made three
/// allocations per labelled record: over 60,000 here.
#[tokio::test]
async fn per_event_metrics_are_recorded_through_cached_handles() {
    let handle = deductor::ops::http::install_recorder().expect("install the recorder");
    let now_ms = chrono::Utc::now().timestamp_millis();
    one_event(now_ms); // the first record of each labelled series registers it
    let events = 10_000;
    let before = calls();
    for _ in 0..events {
        one_event(now_ms);
    }
    let made = calls() - before;
    let records = events * 9;
    assert!(
        made * 10 < records,
        "{records} records of per-event metrics made {made} allocations"
    );

    let text = handle.render();
    let total = events + 1;
    for stage in deductor::metrics::STAGES {
        let line = format!("deductor_event_stage_seconds_count{{stage=\"{stage}\"}} {total}");
        assert!(text.contains(&line), "no `{line}` in:\n{text}");
    }
    for line in [
        format!("deductor_events_total{{type=\"OrderPlaced\",outcome=\"accepted\"}} {total}"),
        format!("deductor_event_duration_seconds_count {total}"),
        format!("deductor_end_to_end_latency_seconds_count {total}"),
        format!("deductor_script_duration_seconds_count{{script=\"deduct_batch\"}} {total}"),
    ] {
        assert!(text.contains(&line), "no `{line}` in:\n{text}");
    }
    // A stage outside the cached set is still recorded (looked up).
    deductor::metrics::stage("other", 0.001);
    assert!(handle
        .render()
        .contains("deductor_event_stage_seconds_count{stage=\"other\"} 1"));
}
