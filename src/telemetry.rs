//! The tracing subscriber (JSON for production, readable for terminals),
//! and the spans of events ([`EventTracer`]).

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber, writing to stderr so stdout stays free for
/// command output. `RUST_LOG`, when set, wins over the configured level.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
        LogFormat::Pretty => builder.compact().try_init(),
    };
}

/// Samples a warning logged once per event, so that a flood of bad events
/// (or an outage that fails every event's step) writes a few lines a second
/// and not one per event: at most `per_window` lines per kind in each
/// window; the number left out is logged with the next line of that kind
/// or by [`Sampler::flush`], whichever comes first. The counts of what
/// happened are in the metrics already (`deductor_dead_letters_total`,
/// `deductor_retries_total`).
#[derive(Debug)]
pub struct Sampler {
    per_window: u32,
    window: std::time::Duration,
    kinds: std::sync::Mutex<std::collections::HashMap<&'static str, Window>>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    start: std::time::Instant,
    shown: u32,
    suppressed: u64,
}

/// What to do with one warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample {
    /// Log it; `suppressed` lines of its kind were left out before it.
    Log { suppressed: u64 },
    /// Leave it out (counted).
    Skip,
}

impl Sampler {
    /// At most 10 lines per kind and second.
    pub fn per_second() -> Sampler {
        Sampler::new(10, std::time::Duration::from_secs(1))
    }

    pub fn new(per_window: u32, window: std::time::Duration) -> Sampler {
        Sampler {
            per_window,
            window,
            kinds: Default::default(),
        }
    }

    /// Whether the warning of `kind` seen at `now` is logged.
    pub fn check(&self, kind: &'static str, now: std::time::Instant) -> Sample {
        let mut kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        let w = kinds.entry(kind).or_insert(Window {
            start: now,
            shown: 0,
            suppressed: 0,
        });
        if now.saturating_duration_since(w.start) >= self.window {
            let suppressed = w.suppressed;
            *w = Window {
                start: now,
                shown: 1,
                suppressed: 0,
            };
            return Sample::Log { suppressed };
        }
        if w.shown < self.per_window {
            w.shown += 1;
            return Sample::Log { suppressed: 0 };
        }
        w.suppressed += 1;
        Sample::Skip
    }

    /// The kinds whose window ended with lines left out, and how many; each
    /// is reported once.
    pub fn flush(&self, now: std::time::Instant) -> Vec<(&'static str, u64)> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for (kind, w) in kinds.iter_mut() {
            if w.suppressed > 0 && now.saturating_duration_since(w.start) >= self.window {
                out.push((*kind, w.suppressed));
                w.suppressed = 0;
            }
        }
        out
    }

    /// [`Sampler::flush`], each count logged as a warning.
    pub fn log_suppressed(&self) {
        for (kind, suppressed) in self.flush(std::time::Instant::now()) {
            tracing::warn!(
                kind,
                suppressed,
                "repeated warnings suppressed (at most {} a second per kind)",
                self.per_window
            );
        }
    }
}

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator, SdkTracer, SdkTracerProvider};

use crate::config::TracingSettings;
use crate::kafka::headers::{EventSpan, Incoming, SpanRef};

/// One span per event (OpenTelemetry messaging conventions: a `process`
/// span of kind consumer, child of the producer's span when the record
/// carried a `traceparent`). Its ids are always made, for the
/// `traceparent` written on the outcome or dead letter; the span is
/// exported over OTLP/HTTP only when `tracing.otlp_endpoint` is set.
#[derive(Clone, Debug, Default)]
pub struct EventTracer {
    otel: Option<(SdkTracerProvider, SdkTracer)>,
    ids: RandomIdGenerator,
}

/// Where one event's span is: what the headers carry, and the exported span.
pub struct EventTrace {
    pub span: EventSpan,
    otel: Option<opentelemetry_sdk::trace::Span>,
}

impl EventTracer {
    /// Off (ids only) unless `otlp_endpoint` is set; then spans go to
    /// `<endpoint>/v1/traces` in batches from a thread of the exporter's own.
    pub fn new(s: &TracingSettings) -> anyhow::Result<EventTracer> {
        if s.otlp_endpoint.is_empty() {
            return Ok(EventTracer::default());
        }
        let endpoint = format!("{}/v1/traces", s.otlp_endpoint.trim_end_matches('/'));
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| anyhow::anyhow!("tracing.otlp_endpoint {}: {e}", s.otlp_endpoint))?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(s.service_name.clone())
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "deductor");
        Ok(EventTracer {
            otel: Some((provider, tracer)),
            ids: RandomIdGenerator::default(),
        })
    }

    pub fn exporting(&self) -> bool {
        self.otel.is_some()
    }

    /// Starts the span of the event in `partition`/`offset` of `topic`.
    pub fn start(
        &self,
        incoming: &Incoming,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> EventTrace {
        let Some((_, tracer)) = &self.otel else {
            let span = EventSpan::new(
                incoming.parent,
                self.ids.new_trace_id().to_bytes(),
                self.ids.new_span_id().to_bytes(),
            );
            return EventTrace { span, otel: None };
        };
        let parent = match incoming.parent {
            Some(p) => Context::new().with_remote_span_context(SpanContext::new(
                TraceId::from_bytes(p.trace_id),
                SpanId::from_bytes(p.span_id),
                TraceFlags::new(p.flags),
                true,
                TraceState::default(),
            )),
            None => Context::new(),
        };
        let builder = tracer
            .span_builder(format!("process {topic}"))
            .with_kind(SpanKind::Consumer)
            .with_attributes(vec![
                KeyValue::new("messaging.system", "kafka"),
                KeyValue::new("messaging.operation.type", "process"),
                KeyValue::new("messaging.destination.name", topic.to_owned()),
                KeyValue::new("messaging.destination.partition.id", partition.to_string()),
                KeyValue::new("messaging.kafka.offset", offset),
            ]);
        let otel = tracer.build_with_context(builder, &parent);
        let cx = otel.span_context();
        let span = EventSpan {
            span: SpanRef {
                trace_id: cx.trace_id().to_bytes(),
                span_id: cx.span_id().to_bytes(),
                flags: cx.trace_flags().to_u8(),
            },
            parent: incoming.parent,
        };
        EventTrace {
            span,
            otel: Some(otel),
        }
    }

    /// Sends the spans still buffered; for shutdown.
    pub fn shutdown(&self) {
        if let Some((provider, _)) = &self.otel {
            if let Err(e) = provider.shutdown() {
                tracing::warn!(error = %e, "tracing: exporter shutdown");
            }
        }
    }
}

impl EventTrace {
    /// Ends the span, naming what became of the event.
    pub fn end(mut self, outcome: &'static str, error: Option<&str>) {
        if let Some(span) = &mut self.otel {
            span.set_attribute(KeyValue::new("deductor.outcome", outcome));
            if let Some(e) = error {
                span.set_status(opentelemetry::trace::Status::error(e.to_owned()));
            }
            span.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_flood_is_sampled_and_what_was_left_out_is_counted() {
        let s = Sampler::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        let logged = (0..100)
            .filter(|_| s.check("not_json", t0) != Sample::Skip)
            .count();
        assert_eq!(logged, 3);
        // Another kind has its own budget.
        assert_eq!(s.check("too_large", t0), Sample::Log { suppressed: 0 });
        // Within the window nothing is flushed yet.
        assert!(s.flush(t0 + Duration::from_millis(500)).is_empty());
        // The next line of the kind after the window carries the count...
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(s.check("not_json", t1), Sample::Log { suppressed: 97 });
        // ... or the flush reports it, once.
        for _ in 0..10 {
            s.check("not_json", t1);
        }
        let t2 = t1 + Duration::from_secs(2);
        assert_eq!(s.flush(t2), vec![("not_json", 8)]);
        assert!(s.flush(t2).is_empty());
    }
}
