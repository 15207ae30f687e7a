//! The numbers the seeds print, from `paper.toml` (embedded at build time), each with its seed,
//! table or figure, row and column, so that a table can put the paper's value beside ours.

use std::sync::OnceLock;

use serde::Deserialize;

/// The data file, as shipped.
pub const TEXT: &str = include_str!("../paper.toml");

/// One printed number.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaperValue {
    /// The seed's number in `seeds/README.md` ("000" … "004").
    pub seed: String,
    /// "Table 1", "Fig. 5", "§4.2".
    #[serde(rename = "where")]
    pub place: String,
    pub row: String,
    pub column: String,
    /// As printed, in `unit`.
    pub value: f64,
    pub unit: String,
    /// Read off a figure rather than printed.
    #[serde(default)]
    pub approximate: bool,
    /// The words around it in the paper, when the row and column need them.
    #[serde(default)]
    pub quote: Option<String>,
}

impl PaperValue {
    /// The value in SI base units (seconds, bytes, bytes/s, bit/s; fractions for percent), the
    /// units `stics_report` tables hold.
    pub fn base(&self) -> f64 {
        self.value * unit_scale(&self.unit).unwrap_or(f64::NAN)
    }
}

/// Base units per `unit`, for the units the data file may use.
pub fn unit_scale(unit: &str) -> Option<f64> {
    Some(match unit {
        "s" | "bytes" | "B/s" | "bit/s" | "count" | "ratio" | "IOPS" | "ops/s" | "packets" | "messages" => 1.0,
        "ops/min" => 1.0 / 60.0,
        "ops/h" => 1.0 / 3600.0,
        "ms" => 1e-3,
        "us" => 1e-6,
        "KB" | "kB" | "KB/s" | "kB/s" | "kbit/s" => 1e3,
        "MB" | "MB/s" | "Mbit/s" => 1e6,
        "GB" | "Gbit/s" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1_048_576.0,
        "percent" => 0.01,
        _ => return None,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    value: Vec<PaperValue>,
}

/// Every value of the data file.
pub fn values() -> &'static [PaperValue] {
    static V: OnceLock<Vec<PaperValue>> = OnceLock::new();
    // The file is part of the binary and a unit test parses it, so it cannot fail here.
    V.get_or_init(|| toml::from_str::<File>(TEXT).map(|f| f.value).unwrap_or_default())
}

/// The value at `seed`, `place`, `row`, `column`, exactly as the data file names them.
pub fn lookup(seed: &str, place: &str, row: &str, column: &str) -> Option<&'static PaperValue> {
    values().iter().find(|v| v.seed == seed && v.place == place && v.row == row && v.column == column)
}

/// [`lookup`]'s value in base units, NaN when the paper prints none (an empty "paper" cell).
pub fn base(seed: &str, place: &str, row: &str, column: &str) -> f64 {
    lookup(seed, place, row, column).map_or(f64::NAN, PaperValue::base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_file_parses_with_known_units_and_no_duplicates() {
        let parsed: File = toml::from_str(TEXT).unwrap();
        assert!(!parsed.value.is_empty());
        let mut seen = std::collections::HashSet::new();
        for v in &parsed.value {
            assert!(unit_scale(&v.unit).is_some(), "unknown unit {:?} in {v:?}", v.unit);
            assert!(["000", "001", "002", "003", "004"].contains(&v.seed.as_str()), "{v:?}");
            assert!(v.value.is_finite(), "{v:?}");
            assert!(seen.insert((&v.seed, &v.place, &v.row, &v.column)), "duplicate {v:?}");
        }
        assert_eq!(values().len(), parsed.value.len());
    }
}
