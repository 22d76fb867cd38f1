//! Logging with `tracing`: human-readable text by default, one JSON object per line with
//! `--log-format json`. `RUST_LOG` filters (default `info`). Logs go to stderr; stdout is kept for
//! command output that scripts capture.

use crate::config::LogFormat;
use tracing_subscriber::EnvFilter;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        // The access log shows failed answers unless asked for every request.
        .unwrap_or_else(|_| {
            EnvFilter::new("info,wasmtime=warn,cranelift=warn,capstan::access=warn")
        });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A log line that cannot be written (stderr closed: the parent that read it died) is
        // dropped. By default the subscriber would report it with `eprintln!`, which panics on
        // a closed stderr, in whatever task was logging.
        .log_internal_errors(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
