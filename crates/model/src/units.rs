//! Reading human quantities (`10ms`, `64KiB`, `1gbit`, `1e-3`, `0.1%`) into SI base units.
//!
//! Sizes follow the habit of storage tools: `k`, `K`, `KiB` are 1024 bytes, `kB` is 1000 bytes (SI).

use crate::{Error, Result};

/// Splits `"10ms"` into `(10.0, "ms")`: the unit is the trailing run of letters, `µ`, `/` and `%`.
fn split(what: &'static str, input: &str) -> Result<(f64, String)> {
    let s = input.trim();
    let example = match what {
        "duration" => "10ms",
        "size" => "64KiB",
        "rate" => "1gbit",
        "probability" => "1e-3",
        _ => "0.02",
    };
    let err =
        |reason: String| Error::Parse { what, input: input.to_string(), reason: format!("{reason}; e.g. {example}") };
    if s.is_empty() {
        return Err(err("empty value".into()));
    }
    let cut = s
        .char_indices()
        .rev()
        .take_while(|&(_, c)| c.is_alphabetic() || c == '/' || c == '%' || c == 'µ')
        .last()
        .map_or(s.len(), |(i, _)| i);
    let (num, unit) = s.split_at(cut);
    let num = num.trim();
    if num.is_empty() {
        return Err(err("no number".into()));
    }
    let value: f64 = num.parse().map_err(|_| err(format!("{num:?} is not a number")))?;
    if !value.is_finite() {
        return Err(err("not a finite number".into()));
    }
    Ok((value, unit.trim().to_string()))
}

/// Reads a duration in seconds: `10ms`, `0.2ms`, `500us`, `500µs`, `1s`, `2min`; a bare `0` is zero.
pub fn parse_duration(input: &str) -> Result<f64> {
    let (v, unit) = split("duration", input)?;
    let scale = match unit.as_str() {
        "" if v == 0.0 => 1.0,
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" | "sec" => 1.0,
        "min" => 60.0,
        _ => {
            return Err(Error::Parse {
                what: "duration",
                input: input.into(),
                reason: format!("unknown or missing unit {unit:?}; use ns, us, ms, s or min, e.g. 10ms"),
            })
        }
    };
    non_negative("duration", input, v * scale)
}

/// Reads a size in bytes: `1460`, `1460B`, `6KiB`, `6k`, `6kB` (6000), `1MiB`, `1MB`, `1GiB`.
pub fn parse_size(input: &str) -> Result<f64> {
    let (v, unit) = split("size", input)?;
    let scale = size_unit(&unit).ok_or_else(|| Error::Parse {
        what: "size",
        input: input.into(),
        reason: format!("unknown unit {unit:?}; use B, KiB (or k), kB, MiB (or M), MB, GiB, GB, e.g. 64KiB"),
    })?;
    non_negative("size", input, v * scale)
}

/// Like [`parse_size`], and also accepts `inf` for the paper's infinitely large request.
pub fn parse_size_or_inf(input: &str) -> Result<f64> {
    match input.trim().to_ascii_lowercase().as_str() {
        "inf" | "infinite" | "infinity" | "∞" => Ok(f64::INFINITY),
        _ => parse_size(input),
    }
}

fn size_unit(unit: &str) -> Option<f64> {
    Some(match unit {
        "" | "B" | "b" => 1.0,
        "k" | "K" | "KiB" | "kiB" | "KB" => 1024.0,
        "kB" => 1e3,
        "M" | "m" | "MiB" => 1024.0 * 1024.0,
        "MB" => 1e6,
        "G" | "g" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        "GB" => 1e9,
        _ => return None,
    })
}

/// Reads a data rate in bytes per second: `1gbit`, `1Gbit/s`, `100mbps`, `125MB/s`, `10MiB/s`.
pub fn parse_rate(input: &str) -> Result<f64> {
    let (v, unit) = split("rate", input)?;
    let lower = unit.to_ascii_lowercase();
    let bit_prefix =
        lower.strip_suffix("bit/s").or_else(|| lower.strip_suffix("bit")).or_else(|| lower.strip_suffix("bps"));
    let bytes_per_s = match bit_prefix {
        Some(prefix) => match prefix {
            "" => Some(1.0),
            "k" => Some(1e3),
            "m" => Some(1e6),
            "g" => Some(1e9),
            _ => None,
        }
        .map(|bits| v * bits / 8.0),
        None => unit.strip_suffix("/s").filter(|size| !size.is_empty()).and_then(size_unit).map(|s| v * s),
    };
    let value = bytes_per_s.ok_or_else(|| Error::Parse {
        what: "rate",
        input: input.into(),
        reason: format!(
            "unknown or missing unit {unit:?}; use bit/s, kbit, mbit, gbit (or bps, mbps...) or B/s, MB/s, MiB/s, \
             e.g. 1gbit"
        ),
    })?;
    non_negative("rate", input, value)
}

/// Reads a probability: `1e-3`, `0.001` or `0.1%`, in `[0, 1]`.
pub fn parse_probability(input: &str) -> Result<f64> {
    let (v, unit) = split("probability", input)?;
    let p = match unit.as_str() {
        "" => v,
        "%" => v / 100.0,
        _ => {
            return Err(Error::Parse {
                what: "probability",
                input: input.into(),
                reason: format!("unexpected unit {unit:?}; write 1e-3 or 0.1%"),
            })
        }
    };
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(Error::Parse { what: "probability", input: input.into(), reason: "must lie between 0 and 1".into() })
    }
}

/// Reads offered traffic in Erlang: `0.02`, `0.02erl`, `2%`.
pub fn parse_erlang(input: &str) -> Result<f64> {
    let (v, unit) = split("offered traffic", input)?;
    let a = match unit.to_ascii_lowercase().as_str() {
        "" | "erl" | "e" => v,
        "%" => v / 100.0,
        _ => {
            return Err(Error::Parse {
                what: "offered traffic",
                input: input.into(),
                reason: format!("unexpected unit {unit:?}; write 0.02 or 0.02erl (Erlang of the link rate)"),
            })
        }
    };
    non_negative("offered traffic", input, a)
}

fn non_negative(what: &'static str, input: &str, value: f64) -> Result<f64> {
    if value >= 0.0 {
        Ok(value)
    } else {
        Err(Error::Parse { what, input: input.into(), reason: "must not be negative".into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_si_units() {
        assert_eq!(parse_duration("10ms").unwrap(), 10e-3);
        assert_eq!(parse_duration("0.2 ms").unwrap(), 0.2e-3);
        assert_eq!(parse_duration("500us").unwrap(), 500e-6);
        assert_eq!(parse_duration("500µs").unwrap(), 500e-6);
        assert_eq!(parse_duration("1e-3s").unwrap(), 1e-3);
        assert_eq!(parse_duration("0").unwrap(), 0.0);
    }

    #[test]
    fn durations_without_unit_or_negative_are_refused() {
        assert!(parse_duration("10").unwrap_err().to_string().contains("10ms"));
        assert!(parse_duration("-1ms").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("NaNms").is_err());
    }

    #[test]
    fn sizes_use_binary_k_and_decimal_kb() {
        assert_eq!(parse_size("64KiB").unwrap(), 65536.0);
        assert_eq!(parse_size("64k").unwrap(), 65536.0);
        assert_eq!(parse_size("6kB").unwrap(), 6000.0);
        assert_eq!(parse_size("1460").unwrap(), 1460.0);
        assert_eq!(parse_size("1460B").unwrap(), 1460.0);
        assert_eq!(parse_size("1MiB").unwrap(), 1048576.0);
        assert!(parse_size("inf").is_err());
        assert_eq!(parse_size_or_inf("inf").unwrap(), f64::INFINITY);
        assert!(parse_size("3 apples").is_err());
    }

    #[test]
    fn rates_read_bits_and_bytes() {
        assert_eq!(parse_rate("1gbit").unwrap(), 125e6);
        assert_eq!(parse_rate("1Gbit/s").unwrap(), 125e6);
        assert_eq!(parse_rate("100mbps").unwrap(), 12.5e6);
        assert_eq!(parse_rate("125MB/s").unwrap(), 125e6);
        assert_eq!(parse_rate("1MiB/s").unwrap(), 1048576.0);
        assert_eq!(parse_rate("8bit/s").unwrap(), 1.0);
        assert!(parse_rate("1000").is_err());
        assert!(parse_rate("1 furlong").is_err());
    }

    #[test]
    fn probabilities_stay_in_unit_interval() {
        assert_eq!(parse_probability("1e-3").unwrap(), 1e-3);
        assert_eq!(parse_probability("0.1%").unwrap(), 1e-3);
        assert!(parse_probability("2").is_err());
        assert!(parse_probability("-0.1").is_err());
        assert!(parse_probability("1e-3ms").is_err());
    }

    #[test]
    fn erlang_accepts_plain_and_suffixed() {
        assert_eq!(parse_erlang("0.02").unwrap(), 0.02);
        assert_eq!(parse_erlang("0.02erl").unwrap(), 0.02);
        assert_eq!(parse_erlang("2%").unwrap(), 0.02);
        assert!(parse_erlang("-1").is_err());
    }
}
