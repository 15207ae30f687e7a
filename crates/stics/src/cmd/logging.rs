//! Logging set-up shared by the long-running subcommands.

/// Sends tracing output to stderr; `RUST_LOG` overrides `default` (for example `info`).
pub fn init(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
