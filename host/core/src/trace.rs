//! W3C trace context across the engine's durable gaps, without an OpenTelemetry dependency here.
//!
//! Spans are plain `tracing` spans everywhere. What `tracing` cannot say on its own is "this span
//! continues a trace that began elsewhere" — a caller's `traceparent` header, or the execution a
//! run belongs to when the run is claimed later, maybe on another node — and "what is this span's
//! `traceparent`", to store it with the execution. The binary that exports traces installs a
//! [`Propagation`] doing both; without one (no exporter configured, tests, tools) every function
//! here does nothing, so the engine pays nothing for tracing it does not export.

use std::sync::OnceLock;
use tracing::Span;

/// What the exporting binary provides: reading and writing W3C `traceparent` values on spans.
pub trait Propagation: Send + Sync {
    /// Makes `span` a child of the remote span `traceparent` names. Must come before the span
    /// is first entered.
    fn set_parent(&self, span: &Span, traceparent: &str);
    /// Links `span` to the span `traceparent` names (a cause that is not its parent).
    fn add_link(&self, span: &Span, traceparent: &str);
    /// The `traceparent` of `span`, `None` when it is not sampled or not exported.
    fn traceparent(&self, span: &Span) -> Option<String>;
}

static PROPAGATION: OnceLock<Box<dyn Propagation>> = OnceLock::new();

/// Installs the process's propagation (once; a second call is ignored).
pub fn install(propagation: Box<dyn Propagation>) {
    let _ = PROPAGATION.set(propagation);
}

/// Whether spans are exported: callers skip building what only an exporter would read.
pub fn is_exporting() -> bool {
    PROPAGATION.get().is_some()
}

/// See [`Propagation::set_parent`]; a value that is not a valid `traceparent` is ignored.
pub fn set_parent(span: &Span, traceparent: Option<&str>) {
    if let (Some(p), Some(tp)) = (PROPAGATION.get(), traceparent) {
        p.set_parent(span, tp);
    }
}

/// See [`Propagation::add_link`].
pub fn add_link(span: &Span, traceparent: Option<&str>) {
    if let (Some(p), Some(tp)) = (PROPAGATION.get(), traceparent) {
        p.add_link(span, tp);
    }
}

/// See [`Propagation::traceparent`].
pub fn traceparent(span: &Span) -> Option<String> {
    PROPAGATION.get().and_then(|p| p.traceparent(span))
}
