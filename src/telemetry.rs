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
