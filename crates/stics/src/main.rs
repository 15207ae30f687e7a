//! The `stics` command: argument parsing and wiring; every subcommand lives in `cmd/`.

#![deny(unsafe_code)]

use clap::{Parser, Subcommand};

mod alloc;
mod cmd;

/// SCSI-to-IP storage: an iSCSI target, an initiator, the STICS cache, a WAN emulator and models.
#[derive(Parser)]
#[command(name = "stics", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve block devices over iSCSI (RFC 7143). With no arguments: a 1 GiB memory LUN on 127.0.0.1:3260.
    Target(cmd::target::Args),
    /// Serve a remote LUN through the STICS cache. With no arguments: an in-process remote over mem:1GiB, served on 127.0.0.1:3260.
    Gateway(cmd::gateway::Args),
    /// List the targets and LUNs behind an iscsi:// URL, with size and block size.
    Ls(cmd::ls::Args),
    /// Expose a remote LUN as a regular file through FUSE.
    Mount(cmd::mount::Args),
    /// Mount an NFSv3 export through FUSE with a client that caches as Linux's does, counting its RPCs.
    NfsMount(cmd::nfs_mount::Args),
    /// Break the persistent reservation a writer gone for good (a gateway whose log was lost) holds on a LUN.
    Release(cmd::release::Args),
    /// Show or apply the writes a gateway of a shared LUN kept under a token its SG broke.
    Quarantine(cmd::quarantine::Args),
    /// Analytical and queueing models of iSCSI over TCP (seeds 000 and 003).
    Model(cmd::model::Args),
    /// Emulate a WAN (delay, loss, rate, background load) between two network namespaces.
    Wan(cmd::wan::Args),
    /// Reproduce the seeds' tables and figures on the real stack (stics against tgt, gateway against plain iSCSI).
    Bench(cmd::bench::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Target(a) => cmd::target::run(a),
        Command::Gateway(a) => cmd::gateway::run(a),
        Command::Ls(a) => cmd::ls::run(a),
        Command::Mount(a) => cmd::mount::run(a),
        Command::NfsMount(a) => cmd::nfs_mount::run(a),
        Command::Release(a) => cmd::release::run(a),
        Command::Quarantine(a) => cmd::quarantine::run(a),
        Command::Model(a) => cmd::model::run(a),
        Command::Wan(a) => cmd::wan::run(a),
        Command::Bench(a) => cmd::bench::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stics: {}", explain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line. The library errors name their source in their own
/// message, so a cause already said is left out, and a context its cause repeats gives way to it.
fn explain(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let m = cause.to_string();
        if parts.iter().any(|p| p.contains(&m)) {
            continue;
        }
        match parts.last_mut() {
            Some(last) if m.starts_with(last.as_str()) => *last = m,
            _ => parts.push(m),
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_said_once() {
        #[derive(Debug)]
        struct Connect(std::io::Error);
        impl std::fmt::Display for Connect {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "cannot connect to h:1: {}", self.0)
            }
        }
        impl std::error::Error for Connect {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = anyhow::Error::new(Connect(io)).context("cannot connect to h:1").context("load");
        assert_eq!(explain(&e), "load: cannot connect to h:1: Connection refused");
        let plain = anyhow::anyhow!("disk full").context("cannot write x");
        assert_eq!(explain(&plain), "cannot write x: disk full");
    }
}
