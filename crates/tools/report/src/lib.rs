//! The reports of stics' tools: tables of results (aligned text, CSV, JSON, printed at once or row
//! by row as they are measured), one-parameter sweeps over a grid of parameters, and PNG plots.
//!
//! `stics model` prints its models with it, and a benchmark prints measurements the same way: a
//! [`Column::ratio`] beside a "paper" and an "ours" column gives the comparison the project reports
//! everywhere, and a [`Stream`] prints each row when it is ready.
//!
//! Values are `f64` in SI base units (seconds, bytes, bit/s); a column scales them into its display
//! unit for the text table and plots, while CSV and JSON keep the base units.

#![forbid(unsafe_code)]

pub mod fmt;
pub mod plot;
pub mod sweep;
pub mod table;

pub use plot::{Chart, Curve, Figure, Mark, Series};
pub use sweep::{Axis, Grid, Point};
pub use table::{Cell, Column, Format, Stream, Table};

/// A boxed error from a parameter parser supplied by the caller.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of the reporting layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A sweep is not written `NAME=FROM..TO`.
    #[error("--sweep {0:?}: expected NAME=FROM..TO")]
    SweepSyntax(String),
    /// The swept parameter does not exist or cannot be swept.
    #[error("--sweep {spec:?}: cannot sweep {name:?} here; choose one of {choices}")]
    NotSweepable {
        /// The sweep as written.
        spec: String,
        /// The parameter named in it.
        name: String,
        /// The parameters that can be swept, comma-separated.
        choices: String,
    },
    /// An end of a sweep range could not be read by the parameter's parser.
    #[error("sweep {end}")]
    SweepEnd {
        /// `start` or `end`.
        end: &'static str,
        #[source]
        source: BoxError,
    },
    /// A sweep setting is out of range.
    #[error("{name} must be {expected}, got {value}")]
    Param {
        /// The setting.
        name: &'static str,
        /// The allowed range in words.
        expected: &'static str,
        /// The value given.
        value: f64,
    },
    /// A parameter was left without any value.
    #[error("no value for {0}")]
    NoValue(String),
    /// A row does not have one cell for each column it must fill.
    #[error("a row of {got} cells for a table that takes {want}")]
    RowLength {
        /// Cells given.
        got: usize,
        /// Cells expected (the columns that are not derived).
        want: usize,
    },
    /// A column named by a chart or a ratio does not exist.
    #[error("no column {0}")]
    NoColumn(String),
    /// A figure could not be drawn or written.
    #[error("plot: {0}")]
    Plot(String),
    /// Writing a streamed table failed.
    #[error("writing the table: {0}")]
    Io(#[from] std::io::Error),
    /// JSON could not be formed.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Result with the reporting layer's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
