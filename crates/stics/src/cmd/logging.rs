//! Logging set-up shared by the long-running subcommands.

use std::io::IsTerminal;

/// Sends tracing output to stderr, coloured only on a terminal; `RUST_LOG` overrides `default`
/// (for example `info`).
pub fn init(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
