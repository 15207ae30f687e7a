//! The experiments of the seeds, run on the real stack: `stics bench`. Each experiment starts real
//! processes (stics target and gateway, tgt, `stics wan`, libiscsi's and qemu's clients, PostMark),
//! measures, and returns a [`Report`]: tables with the paper's printed value beside ours, figures,
//! and a short reading. The `stics` binary parses the command line and prints the report.
//!
//! What lives where: [`env`] is the run's context (processes, commands, progress, scratch space),
//! [`paper`] the papers' numbers, [`load`] the load generator behind `stics bench load`, [`trace`]
//! and [`replay`] the block traces and their open-loop replay behind `stics bench replay`, [`cu`]
//! the conformance log counter, [`peers`] the targets under test, [`exp`] one module per
//! experiment. Experiments know the public CLI and crates, never the internals of either.

pub mod cu;
pub mod env;
pub mod exp;
pub mod load;
pub mod machine;
pub mod paper;
pub mod peers;
pub mod replay;
pub mod report;
pub mod stat;
pub mod trace;

pub use env::{Bench, Options, Proc};
pub use report::{Report, Section};
pub use stat::Stat;

/// Why an experiment could not run or finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A program the experiment needs is not installed.
    #[error("{tool} is missing (Debian: apt-get install {package})")]
    Missing { tool: String, package: String },
    /// A command exited with an error.
    #[error("`{command}` failed ({status}){}", if stderr.is_empty() { String::new() } else { format!(": {stderr}") })]
    Command { command: String, status: String, stderr: String },
    /// A process did not become ready in time.
    #[error("{what} not ready after {secs} s (its log: {log})")]
    NotReady { what: String, secs: u64, log: String },
    /// A program's output was not what the experiment expected.
    #[error("cannot read the output of {what}: {detail}")]
    Output { what: String, detail: String },
    /// A file system was unmounted here but lives on: another mount namespace still has it.
    #[error(
        "{lun} is still loop-mounted {secs} s after its file system was unmounted ({holders}); a check of it now \
         would read a file system in use"
    )]
    StillMounted { lun: String, secs: u64, holders: String },
    /// A parameter is out of range.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Report(#[from] stics_report::Error),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, Error>;
