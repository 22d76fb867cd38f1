//! Logs and traces with `tracing`.
//!
//! Logs: human-readable text by default, one JSON object per line with `--log-format json`;
//! `RUST_LOG` filters them (default `info`). They go to stderr; stdout is kept for command output
//! that scripts capture.
//!
//! Traces: off unless an OTLP endpoint is configured by the standard variables
//! (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_TRACES_SAMPLER`,
//! `OTEL_BSP_*` as the SDK reads them; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`
//! turn them off). Capstan's spans then go to the endpoint over OTLP/HTTP with protobuf bodies,
//! whatever `RUST_LOG` says: the log filter decides what is printed, not what is traced.

use crate::config::LogFormat;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::{Level, Metadata};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::FormattedFields;
use tracing_subscriber::fmt::format::{FormatFields, Writer};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, filter};

/// Keeps the trace exporter alive; [`Telemetry::shutdown`] sends what is still buffered.
#[derive(Debug, Default)]
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered (bounded by the exporter's timeout), so the last
    /// requests before a clean stop are not lost.
    pub fn shutdown(&self) {
        if let Some(provider) = &self.traces
            && let Err(error) = provider.shutdown()
        {
            eprintln!("capstan: flushing traces at shutdown: {error}");
        }
    }
}

pub fn init(format: LogFormat) -> Telemetry {
    let logs_filter = EnvFilter::try_from_default_env()
        // The access log shows failed answers unless asked for every request.
        .unwrap_or_else(|_| {
            EnvFilter::new("info,wasmtime=warn,cranelift=warn,capstan::access=warn")
        });
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // A log line that cannot be written (stderr closed: the parent that read it died) is
        // dropped. By default the subscriber would report it with `eprintln!`, which panics on
        // a closed stderr, in whatever task was logging.
        .log_internal_errors(false);
    let logs = match format {
        LogFormat::Text => logs.with_filter(logs_filter).boxed(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .fmt_fields(JsonSpanFields)
            .with_filter(logs_filter)
            .boxed(),
    };
    let (traces, provider) = match exporter() {
        Ok(Some(provider)) => {
            let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("capstan"));
            capstan_core::trace::install(Box::new(W3c));
            (Some(layer), Some(provider))
        }
        Ok(None) => (None, None),
        Err(error) => {
            eprintln!("capstan: traces are not exported: {error}");
            (None, None)
        }
    };
    // Traced: Capstan's spans down to `debug` (the stage, provider-call, delivery and step
    // spans, which a process that exports nothing never builds) and whatever the log filter
    // lets through. A filter for the whole subscriber, not one for the OpenTelemetry layer
    // alone: a per-layer verdict asked for without a span or event following (libraries'
    // `enabled!` checks, sqlx's among them) stays on the thread and is taken for the next span's,
    // which then went missing from the trace with its children left as roots.
    let logged = EnvFilter::try_from_default_env()
        .ok()
        .and_then(|f| f.max_level_hint())
        .unwrap_or(LevelFilter::INFO);
    let traced = traces.is_some().then(|| {
        filter::filter_fn(move |metadata: &Metadata<'_>| {
            (metadata.is_span()
                && metadata.target().starts_with("capstan")
                && *metadata.level() <= Level::DEBUG)
                || *metadata.level() <= logged
        })
    });
    let _ = tracing_subscriber::registry()
        .with(traced)
        .with(logs)
        .with(traces)
        .try_init();
    Telemetry { traces: provider }
}

fn env_is(name: &str, value: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.trim().eq_ignore_ascii_case(value))
}

fn exporter() -> anyhow::Result<Option<SdkTracerProvider>> {
    let configured = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var(v).is_ok_and(|v| !v.trim().is_empty()));
    if !configured || env_is("OTEL_SDK_DISABLED", "true") || env_is("OTEL_TRACES_EXPORTER", "none")
    {
        return Ok(None);
    }
    for name in [
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    ] {
        if let Ok(protocol) = std::env::var(name)
            && protocol != "http/protobuf"
        {
            anyhow::bail!("{name}={protocol}: only http/protobuf is built in");
        }
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()?;
    let mut resource = opentelemetry_sdk::Resource::builder().with_attribute(
        opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
    );
    // The SDK reads OTEL_SERVICE_NAME itself; without it, the binary's name rather than
    // `unknown_service`.
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("capstan");
    }
    Ok(Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build(),
    ))
}

/// A span's fields for the JSON log format: one JSON object, as `tracing_subscriber`'s
/// `JsonFields` writes it, but extended in place when a field is recorded after the span opened.
/// `JsonFields` parses the object back into a map and writes it anew at each `record`, and every
/// request span records its principal once the key is checked: ~2.5 % of an execution read's
/// server CPU in a profile, for a request that logs nothing (BENCHMARKS.md, "Appendix: changes
/// measured"). A field recorded twice appears twice in the object; the JSON formatter reads it
/// back into a map, where the later value wins, as it does with `JsonFields`.
struct JsonSpanFields;

impl<'w> FormatFields<'w> for JsonSpanFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut object = String::from("{");
        fields.record(&mut JsonFieldVisitor {
            out: &mut object,
            first: true,
        });
        object.push('}');
        std::fmt::Write::write_str(&mut writer, &object)
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> std::fmt::Result {
        let object = &mut current.fields;
        // The object without its closing brace (a span formatted elsewhere may have left none).
        if object.ends_with('}') {
            object.pop();
        } else {
            object.clear();
        }
        if object.is_empty() {
            object.push('{');
        }
        let first = object.ends_with('{');
        fields.record(&mut JsonFieldVisitor { out: object, first });
        object.push('}');
        Ok(())
    }
}

/// Writes each field as `"name":value` into an open JSON object.
struct JsonFieldVisitor<'a> {
    out: &'a mut String,
    first: bool,
}

impl JsonFieldVisitor<'_> {
    fn entry(&mut self, field: &tracing::field::Field, value: impl serde::Serialize) {
        let name = field.name();
        let name = name.strip_prefix("r#").unwrap_or(name);
        // Serialising a string or a number to JSON cannot fail.
        let (Ok(name), Ok(value)) = (serde_json::to_string(name), serde_json::to_string(&value))
        else {
            return;
        };
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        self.out.push_str(&name);
        self.out.push(':');
        self.out.push_str(&value);
    }
}

impl tracing::field::Visit for JsonFieldVisitor<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.entry(field, value);
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.entry(field, value);
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.entry(field, value);
    }

    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.entry(field, value);
    }

    /// A number JSON cannot hold (NaN, an infinity) is `null`, as with `JsonFields`.
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.entry(field, serde_json::Value::from(value));
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.entry(field, format!("{value:?}"));
    }
}

/// W3C `traceparent` values read and written with the SDK's own propagator.
struct W3c;

impl W3c {
    fn context(traceparent: &str) -> Option<opentelemetry::Context> {
        let carrier =
            std::collections::HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
        let cx = TraceContextPropagator::new().extract(&carrier);
        cx.span().span_context().is_valid().then_some(cx)
    }
}

impl capstan_core::trace::Propagation for W3c {
    fn set_parent(&self, span: &tracing::Span, traceparent: &str) {
        if let Some(cx) = Self::context(traceparent) {
            let _ = span.set_parent(cx);
        }
    }

    fn add_link(&self, span: &tracing::Span, traceparent: &str) {
        if let Some(cx) = Self::context(traceparent) {
            span.add_link(cx.span().span_context().clone());
        }
    }

    fn traceparent(&self, span: &tracing::Span) -> Option<String> {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        sc.is_valid().then(|| {
            format!(
                "00-{}-{}-{:02x}",
                sc.trace_id(),
                sc.span_id(),
                sc.trace_flags().to_u8()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::sync::{Arc, Mutex};

    /// The lines a subscriber wrote.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Lines {
        type Writer = Lines;

        fn make_writer(&'a self) -> Lines {
            self.clone()
        }
    }

    impl Lines {
        fn json(&self) -> Vec<Value> {
            String::from_utf8(self.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect()
        }
    }

    /// Runs `f` under the JSON log format as `init` sets it up, returning the lines it logged.
    fn logged(f: impl FnOnce()) -> Vec<Value> {
        let lines = Lines::default();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .fmt_fields(JsonSpanFields)
                .with_writer(lines.clone()),
        );
        tracing::subscriber::with_default(subscriber, f);
        lines.json()
    }

    #[test]
    fn fields_recorded_after_a_span_opened_join_its_object_in_every_later_line() {
        let tricky = "o\"ps\n\u{1F600}\\ \u{7}";
        let lines = logged(|| {
            let span = tracing::info_span!(
                "request",
                http.route = "/v1/executions/{id}",
                principal = tracing::field::Empty,
                status = tracing::field::Empty,
                never = tracing::field::Empty,
                r#type = "read",
                count = 3_u64,
                delta = -2_i64,
                ratio = f64::NAN,
                flag = true,
                debug = ?Some(1),
            );
            let _in = span.enter();
            tracing::info!("before");
            span.record("principal", tricky);
            span.record("status", 503_u64);
            tracing::info!(outcome = "late", "after");
        });
        assert_eq!(lines.len(), 2, "{lines:?}");
        let before = json!({
            "name": "request",
            "http.route": "/v1/executions/{id}",
            "type": "read",
            "count": 3,
            "delta": -2,
            "ratio": null,
            "flag": true,
            "debug": "Some(1)",
        });
        assert_eq!(lines[0]["span"], before);
        let mut after = before.clone();
        after["principal"] = json!(tricky);
        after["status"] = json!(503);
        assert_eq!(lines[1]["span"], after);
        assert_eq!(lines[1]["spans"], json!([after]));
        assert_eq!(lines[1]["outcome"], "late");
    }

    #[test]
    fn a_span_opened_without_fields_gains_them_and_a_field_recorded_twice_keeps_the_later() {
        let lines = logged(|| {
            let span = tracing::info_span!("quiet", principal = tracing::field::Empty);
            let _in = span.enter();
            tracing::info!("empty");
            span.record("principal", "first");
            span.record("principal", "second");
            tracing::info!("recorded");
        });
        assert_eq!(lines[0]["span"], json!({"name": "quiet"}));
        assert_eq!(
            lines[1]["span"],
            json!({"name": "quiet", "principal": "second"})
        );
    }
}
