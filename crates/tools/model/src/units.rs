//! Reading human quantities (`10ms`, `64KiB`, `1gbit`, `1e-3`, `0.1%`) into the model's SI base units.
//!
//! Sizes, durations, rates and probabilities are read as every stics subcommand reads them (see
//! `stics_units`: `k`, `K`, `KiB` are 1024 bytes, `kB` and `KB` 1000); this module adds what only the
//! models take: `inf` for a request size and offered traffic in Erlang.

use crate::{Error, Result};

/// Reads a duration in seconds: `10ms`, `0.2ms`, `500us`, `500µs`, `1s`, `2min`; a bare `0` is zero.
pub fn parse_duration(input: &str) -> Result<f64> {
    Ok(stics_units::parse_duration(input)?)
}

/// Reads a size in bytes: `1460`, `1460B`, `6KiB`, `6k`, `6kB` (6000), `1MiB`, `1MB` (10⁶), `1GiB`.
pub fn parse_size(input: &str) -> Result<f64> {
    Ok(stics_units::parse_size(input)? as f64)
}

/// Like [`parse_size`], and also accepts `inf` for the paper's infinitely large request.
pub fn parse_size_or_inf(input: &str) -> Result<f64> {
    match input.trim().to_ascii_lowercase().as_str() {
        "inf" | "infinite" | "infinity" | "∞" => Ok(f64::INFINITY),
        _ => parse_size(input),
    }
}

/// Reads a data rate in bytes per second: `1gbit`, `1Gbit/s`, `100mbps`, `125MB/s`, `10MiB/s`.
pub fn parse_rate(input: &str) -> Result<f64> {
    Ok(stics_units::parse_rate(input)? / 8.0)
}

/// Reads a probability: `1e-3`, `0.001` or `0.1%`, in `[0, 1]`.
pub fn parse_probability(input: &str) -> Result<f64> {
    Ok(stics_units::parse_probability(input)?)
}

/// Reads offered traffic in Erlang: `0.02`, `0.02erl`, `2%`.
pub fn parse_erlang(input: &str) -> Result<f64> {
    let what = "offered traffic";
    let err = |reason: String| Error::Parse { what, input: input.to_string(), reason };
    let s = input.trim();
    // The unit is the trailing run of letters and `%`, so that `1e-6` stays a number.
    let cut =
        s.char_indices().rev().take_while(|&(_, c)| c.is_alphabetic() || c == '%').last().map_or(s.len(), |(i, _)| i);
    let (num, unit) = s.split_at(cut);
    let v: f64 = num.trim().parse().map_err(|_| err(format!("{:?} is not a number; e.g. 0.02", num.trim())))?;
    if !v.is_finite() {
        return Err(err("not a finite number; e.g. 0.02".into()));
    }
    let a = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "erl" | "e" => v,
        "%" => v / 100.0,
        _ => return Err(err(format!("unexpected unit {unit:?}; write 0.02 or 0.02erl (Erlang of the link rate)"))),
    };
    if a >= 0.0 {
        Ok(a)
    } else {
        Err(err("must not be negative".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_bytes_and_may_be_infinite() {
        assert_eq!(parse_size("64KiB").unwrap(), 65536.0);
        assert_eq!(parse_size("6kB").unwrap(), 6000.0);
        assert_eq!(parse_size("1MB").unwrap(), 1e6);
        assert!(parse_size("inf").is_err());
        assert_eq!(parse_size_or_inf("inf").unwrap(), f64::INFINITY);
        assert_eq!(parse_size_or_inf("6KiB").unwrap(), 6144.0);
    }

    #[test]
    fn rates_are_bytes_per_second() {
        assert_eq!(parse_rate("1gbit").unwrap(), 125e6);
        assert_eq!(parse_rate("100mbps").unwrap(), 12.5e6);
        assert_eq!(parse_rate("125MB/s").unwrap(), 125e6);
        assert_eq!(parse_rate("1MiB/s").unwrap(), 1048576.0);
        assert_eq!(parse_rate("8bit/s").unwrap(), 1.0);
    }

    #[test]
    fn durations_are_seconds() {
        assert_eq!(parse_duration("10ms").unwrap(), 10e-3);
        assert_eq!(parse_duration("0.2 ms").unwrap(), 0.2e-3);
        assert!(parse_duration("10").unwrap_err().to_string().contains("10ms"));
    }

    #[test]
    fn erlang_accepts_plain_and_suffixed() {
        assert_eq!(parse_erlang("0.02").unwrap(), 0.02);
        assert_eq!(parse_erlang("0.02erl").unwrap(), 0.02);
        assert_eq!(parse_erlang("2%").unwrap(), 0.02);
        assert_eq!(parse_erlang("1e-6").unwrap(), 1e-6);
        assert!(parse_erlang("-1").is_err());
        assert!(parse_erlang("x").is_err());
        assert!(parse_erlang("1 apple").is_err());
    }
}
