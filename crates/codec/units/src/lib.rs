//! Human quantities as the command line writes them (`64KiB`, `10ms`, `1gbit`, `0.1%`), read the
//! same way by every subcommand. No dependencies, no I/O.
//!
//! # Sizes
//!
//! IEC binary for `KiB`, `MiB`, `GiB`, `TiB` and for the bare one-letter suffixes `k`, `K`, `M`,
//! `G`, `T` (as qemu, dd and tc read them); SI decimal for `kB`, `MB`, `GB`, `TB` in any case
//! (`mb` is 10⁶); `B` or nothing is bytes. A fraction is allowed when the result is a whole number
//! of bytes (`1.5GiB`, not `0.1KiB`).
//!
//! # Durations, rates, probabilities
//!
//! Durations take `ns`, `us` (`µs`), `ms`, `s`, `min`; a bare `0` is zero. Rates are bits per
//! second with decimal prefixes (`bit`, `kbit`, `mbit`, `gbit`, `tbit`, each with an optional
//! `/s`, or `bps`, `kbps`, `mbps`...: bits, not tc's bytes), or a size per second (`125MB/s`,
//! `1MiB/s`). Probabilities are `1e-3`, `0.001` or `0.1%`.

#![forbid(unsafe_code)]

use std::fmt;

/// The kind of quantity that was being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    Size,
    Duration,
    Rate,
    Probability,
}

impl Quantity {
    fn name(self) -> &'static str {
        match self {
            Quantity::Size => "size",
            Quantity::Duration => "duration",
            Quantity::Rate => "rate",
            Quantity::Probability => "probability",
        }
    }

    /// The units this quantity accepts, with an example, as error messages list them.
    pub fn accepted(self) -> &'static str {
        match self {
            Quantity::Size => {
                "use B, KiB/MiB/GiB/TiB or k/K/M/G/T (powers of 1024), kB/MB/GB/TB (powers of 1000), e.g. 64KiB"
            }
            Quantity::Duration => "use ns, us, ms, s or min, e.g. 10ms",
            Quantity::Rate => {
                "use bit/s, kbit, mbit, gbit, tbit (or bps, kbps, mbps...) or a size per second (B/s, MB/s, \
                 MiB/s), e.g. 1gbit"
            }
            Quantity::Probability => "write 1e-3, 0.001 or 0.1%",
        }
    }
}

/// What is wrong with the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// Nothing but blanks.
    Empty,
    /// A unit without a number before it.
    NoNumber,
    /// The number part does not read as a finite number.
    NotANumber(String),
    /// The unit is not one this quantity accepts (empty when a unit is required).
    UnknownUnit(String),
    /// Below zero.
    Negative,
    /// A probability outside `[0, 1]`.
    OutOfRange,
    /// A size that is not a whole number of bytes.
    NotWhole,
    /// A size beyond `u64`.
    TooLarge,
    /// A size below the least the reader takes, in bytes.
    Below(u64),
    /// A size above the most the reader takes, in bytes.
    Above(u64),
    /// A size that is not a whole number of blocks of this many bytes.
    NotWholeBlocks(u64),
}

/// A quantity that could not be read: what was expected, the text given, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub quantity: Quantity,
    pub input: String,
    pub problem: Problem,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot read {} {:?}: {}", self.quantity.name(), self.input, self.reason())
    }
}

impl Error {
    /// What is wrong, without the quantity and the text (for a caller that names them itself).
    pub fn reason(&self) -> String {
        let accepted = self.quantity.accepted();
        match &self.problem {
            Problem::Empty => format!("empty value; {accepted}"),
            Problem::NoNumber => format!("no number; {accepted}"),
            Problem::NotANumber(n) => format!("{n:?} is not a number; {accepted}"),
            Problem::UnknownUnit(u) if u.is_empty() => format!("missing unit; {accepted}"),
            Problem::UnknownUnit(u) => format!("unknown unit {u:?}; {accepted}"),
            Problem::Negative => "must not be negative".to_string(),
            Problem::OutOfRange => "must lie between 0 and 1".to_string(),
            Problem::NotWhole => "not a whole number of bytes".to_string(),
            Problem::TooLarge => "too large".to_string(),
            Problem::Below(min) => format!("must be at least {min} bytes"),
            Problem::Above(max) => format!("must be at most {max} bytes"),
            Problem::NotWholeBlocks(block) => format!("not a whole number of {block}-byte blocks"),
        }
    }
}

impl std::error::Error for Error {}

fn error(quantity: Quantity, input: &str, problem: Problem) -> Error {
    Error { quantity, input: input.to_string(), problem }
}

/// Splits `"10ms"` into `("10", "ms")`: the unit is the trailing run of letters, `µ`, `/` and `%`.
fn split(quantity: Quantity, input: &str) -> Result<(&str, &str), Error> {
    let s = input.trim();
    if s.is_empty() {
        return Err(error(quantity, input, Problem::Empty));
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
        return Err(error(quantity, input, Problem::NoNumber));
    }
    Ok((num, unit.trim()))
}

/// Reads the number part as a finite `f64`.
fn float(quantity: Quantity, input: &str, num: &str) -> Result<f64, Error> {
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(error(quantity, input, Problem::NotANumber(num.to_string()))),
    }
}

fn non_negative(quantity: Quantity, input: &str, value: f64) -> Result<f64, Error> {
    if value >= 0.0 {
        Ok(value)
    } else {
        Err(error(quantity, input, Problem::Negative))
    }
}

/// Bytes per unit of a size suffix, any case; `None` if it is not one.
fn size_unit(unit: &str) -> Option<u64> {
    Some(match unit.to_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    })
}

/// A decimal number read exactly: `mantissa · 10^exp`.
struct Decimal {
    mantissa: u128,
    exp: i32,
}

/// Reads `digits[.digits][e[+-]digits]` without rounding, so that `1.5GiB` is exactly whole.
fn decimal(num: &str) -> Option<Decimal> {
    let (body, exp) = match num.find(['e', 'E']) {
        Some(i) => (&num[..i], num[i + 1..].parse::<i32>().ok()?),
        None => (num, 0),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    // Trailing zeros of the fraction carry no value and would only overflow the mantissa.
    let frac = frac.trim_end_matches('0');
    let int = int.trim_start_matches('0');
    let mut mantissa: u128 = 0;
    for c in int.chars().chain(frac.chars()) {
        let d = c.to_digit(10)?;
        mantissa = mantissa.checked_mul(10)?.checked_add(u128::from(d))?;
    }
    let exp = exp.checked_sub(i32::try_from(frac.len()).ok()?)?;
    Some(Decimal { mantissa, exp })
}

/// Reads a size in bytes: `4096`, `512B`, `64KiB` (= `64k`), `1.5GiB`, `6kB` (= 6000), `1MB` (= 10⁶).
pub fn parse_size(input: &str) -> Result<u64, Error> {
    let q = Quantity::Size;
    let (num, unit) = split(q, input)?;
    if num.starts_with('-') {
        return Err(error(q, input, Problem::Negative));
    }
    let scale = size_unit(unit).ok_or_else(|| error(q, input, Problem::UnknownUnit(unit.to_string())))?;
    let d = decimal(num).ok_or_else(|| error(q, input, Problem::NotANumber(num.to_string())))?;
    if d.mantissa == 0 {
        return Ok(0);
    }
    let too_large = || error(q, input, Problem::TooLarge);
    let mut bytes = d.mantissa.checked_mul(u128::from(scale)).ok_or_else(too_large)?;
    if d.exp >= 0 {
        let pow = 10u128.checked_pow(d.exp.unsigned_abs()).ok_or_else(too_large)?;
        bytes = bytes.checked_mul(pow).ok_or_else(too_large)?;
    } else {
        // A power of ten beyond u128 divides no non-zero mantissa·scale.
        let pow = 10u128.checked_pow(d.exp.unsigned_abs()).ok_or_else(|| error(q, input, Problem::NotWhole))?;
        if bytes % pow != 0 {
            return Err(error(q, input, Problem::NotWhole));
        }
        bytes /= pow;
    }
    u64::try_from(bytes).map_err(|_| too_large())
}

/// Reads a size as [`parse_size`] does and holds it to what the reader takes: within `bounds`
/// and a whole number of `block`-byte blocks (1 for any number of bytes).
pub fn parse_size_within(input: &str, bounds: std::ops::RangeInclusive<u64>, block: u64) -> Result<u64, Error> {
    let bytes = parse_size(input)?;
    let problem = if bytes < *bounds.start() {
        Problem::Below(*bounds.start())
    } else if bytes > *bounds.end() {
        Problem::Above(*bounds.end())
    } else if block > 1 && !bytes.is_multiple_of(block) {
        Problem::NotWholeBlocks(block)
    } else {
        return Ok(bytes);
    };
    Err(error(Quantity::Size, input, problem))
}

/// Reads a duration in seconds: `10ms`, `0.2ms`, `500us`, `500µs`, `1s`, `2min`; a bare `0` is zero.
pub fn parse_duration(input: &str) -> Result<f64, Error> {
    let q = Quantity::Duration;
    let (num, unit) = split(q, input)?;
    let v = float(q, input, num)?;
    let scale = match unit.to_lowercase().as_str() {
        "" if v == 0.0 => 1.0,
        "ns" | "nsec" => 1e-9,
        "us" | "µs" | "usec" => 1e-6,
        "ms" | "msec" => 1e-3,
        "s" | "sec" => 1.0,
        "min" => 60.0,
        _ => return Err(error(q, input, Problem::UnknownUnit(unit.to_string()))),
    };
    non_negative(q, input, v * scale)
}

/// Reads a data rate in bits per second: `1gbit`, `1Gbit/s`, `100mbps`, `125MB/s`, `10MiB/s`.
pub fn parse_rate(input: &str) -> Result<f64, Error> {
    let q = Quantity::Rate;
    let (num, unit) = split(q, input)?;
    let v = float(q, input, num)?;
    let lower = unit.to_lowercase();
    let bit_prefix =
        lower.strip_suffix("bit/s").or_else(|| lower.strip_suffix("bit")).or_else(|| lower.strip_suffix("bps"));
    let bits = match bit_prefix {
        Some(prefix) => match prefix {
            "" => Some(1.0),
            "k" => Some(1e3),
            "m" => Some(1e6),
            "g" => Some(1e9),
            "t" => Some(1e12),
            _ => None,
        }
        .map(|bits| v * bits),
        // A size per second; `v * bytes` first so that byte rates come out as they are written.
        None => unit.strip_suffix("/s").filter(|size| !size.is_empty()).and_then(size_unit).map(|b| v * b as f64 * 8.0),
    };
    let bits = bits.ok_or_else(|| error(q, input, Problem::UnknownUnit(unit.to_string())))?;
    non_negative(q, input, bits)
}

/// Reads a probability in `[0, 1]`: `1e-3`, `0.001` or `0.1%`.
pub fn parse_probability(input: &str) -> Result<f64, Error> {
    let q = Quantity::Probability;
    let (num, unit) = split(q, input)?;
    let v = float(q, input, num)?;
    let p = match unit {
        "" => v,
        "%" => v / 100.0,
        _ => return Err(error(q, input, Problem::UnknownUnit(unit.to_string()))),
    };
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(error(q, input, Problem::OutOfRange))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_within_bounds_and_whole_blocks() {
        let lun = |s| parse_size_within(s, 1..=i64::MAX as u64, 512);
        assert_eq!(lun("1GiB"), Ok(1 << 30));
        assert_eq!(lun("64M"), Ok(64 << 20));
        assert_eq!(lun("1.5G"), Ok(3 << 29));
        assert_eq!(lun("1GB"), Ok(1_000_000_000));
        assert_eq!(lun("1gb"), Ok(1_000_000_000));
        assert_eq!(lun("4096"), Ok(4096));
        assert_eq!(lun("2TB"), Ok(2_000_000_000_000));
        assert_eq!(lun("1MiB"), Ok(1 << 20));
        assert_eq!(lun("1MB").map_err(|e| e.problem), Err(Problem::NotWholeBlocks(512)));
        assert_eq!(lun("100").map_err(|e| e.problem), Err(Problem::NotWholeBlocks(512)));
        assert_eq!(lun("0").map_err(|e| e.problem), Err(Problem::Below(1)));
        assert_eq!(lun("8EiB").map_err(|e| e.problem), Err(Problem::UnknownUnit("EiB".into())));
        assert_eq!(lun("8192P").map_err(|e| e.problem), Err(Problem::UnknownUnit("P".into())));
        assert_eq!(lun("8388608T").map_err(|e| e.problem), Err(Problem::Above(i64::MAX as u64)));
        for bad in ["12", "", "-1G", "1Q", "1.0000001G"] {
            assert!(lun(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_size_within("0", 0..=1 << 40, 1), Ok(0));
        assert_eq!(parse_size_within("1TiB", 0..=1 << 40, 1), Ok(1 << 40));
        let e = parse_size_within("2TiB", 0..=1 << 40, 1).unwrap_err();
        assert_eq!(e.to_string(), "cannot read size \"2TiB\": must be at most 1099511627776 bytes");
        assert_eq!(e.reason(), "must be at most 1099511627776 bytes");
    }

    #[test]
    fn binary_suffixes_are_powers_of_1024() {
        for (s, v) in [
            ("64KiB", 64 << 10),
            ("64k", 64 << 10),
            ("64K", 64 << 10),
            ("1MiB", 1 << 20),
            ("1M", 1 << 20),
            ("1m", 1 << 20),
            ("1GiB", 1 << 30),
            ("1G", 1 << 30),
            ("2TiB", 2 << 40),
            ("2T", 2 << 40),
            ("1kib", 1 << 10),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
    }

    #[test]
    fn b_forms_are_powers_of_1000_in_any_case() {
        for (s, v) in [
            ("6kB", 6_000),
            ("6KB", 6_000),
            ("6kb", 6_000),
            ("1MB", 1_000_000),
            ("1mb", 1_000_000),
            ("1Mb", 1_000_000),
            ("1GB", 1_000_000_000),
            ("1TB", 1_000_000_000_000),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
    }

    #[test]
    fn bytes_take_b_or_nothing() {
        assert_eq!(parse_size("1460"), Ok(1460));
        assert_eq!(parse_size("1460B"), Ok(1460));
        assert_eq!(parse_size(" 1460 b "), Ok(1460));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("64 KiB"), Ok(64 << 10));
    }

    #[test]
    fn fractions_must_give_whole_bytes() {
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("1.5k"), Ok(1536));
        assert_eq!(parse_size("1.001kB"), Ok(1001));
        assert_eq!(parse_size("1.50000000000000000000000000000000000000000MiB"), Ok(3 << 19));
        assert_eq!(parse_size("1e6"), Ok(1_000_000));
        assert_eq!(parse_size(".5k"), Ok(512));
        assert_eq!(parse_size("0.1KiB").unwrap_err().problem, Problem::NotWhole);
        assert_eq!(parse_size("1.5").unwrap_err().problem, Problem::NotWhole);
        assert_eq!(parse_size("1e-30k").unwrap_err().problem, Problem::NotWhole);
    }

    #[test]
    fn bad_sizes_name_the_input_and_the_units() {
        let e = parse_size("3 apples").unwrap_err();
        assert_eq!(e.problem, Problem::UnknownUnit("apples".into()));
        let msg = e.to_string();
        assert!(msg.contains("\"3 apples\"") && msg.contains("KiB") && msg.contains("MB"), "{msg}");
        assert_eq!(parse_size("-1G").unwrap_err().problem, Problem::Negative);
        assert_eq!(parse_size("").unwrap_err().problem, Problem::Empty);
        assert_eq!(parse_size("KiB").unwrap_err().problem, Problem::NoNumber);
        assert_eq!(parse_size("inf").unwrap_err().problem, Problem::NoNumber);
        assert_eq!(parse_size("1.2.3k").unwrap_err().problem, Problem::NotANumber("1.2.3".into()));
        assert_eq!(parse_size("1Q").unwrap_err().problem, Problem::UnknownUnit("Q".into()));
        assert_eq!(parse_size("16EiB").unwrap_err().problem, Problem::UnknownUnit("EiB".into()));
        assert_eq!(parse_size("20000000T").unwrap_err().problem, Problem::TooLarge);
        assert_eq!(parse_size("1e40").unwrap_err().problem, Problem::TooLarge);
    }

    #[test]
    fn durations_take_si_units() {
        assert_eq!(parse_duration("10ms"), Ok(10e-3));
        assert_eq!(parse_duration("0.2 ms"), Ok(0.2 * 1e-3));
        assert_eq!(parse_duration("500us"), Ok(500e-6));
        assert_eq!(parse_duration("500µs"), Ok(500e-6));
        assert_eq!(parse_duration("250usec"), Ok(250e-6));
        assert_eq!(parse_duration("1e-3s"), Ok(1e-3));
        assert_eq!(parse_duration("2min"), Ok(120.0));
        assert_eq!(parse_duration("5MS"), Ok(5e-3));
        assert_eq!(parse_duration("0"), Ok(0.0));
    }

    #[test]
    fn durations_without_unit_or_negative_are_refused() {
        assert!(parse_duration("10").unwrap_err().to_string().contains("10ms"));
        assert_eq!(parse_duration("-1ms").unwrap_err().problem, Problem::Negative);
        assert_eq!(parse_duration("ms").unwrap_err().problem, Problem::NoNumber);
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("NaNms").is_err());
    }

    #[test]
    fn rates_read_bits_and_bytes() {
        assert_eq!(parse_rate("1gbit"), Ok(1e9));
        assert_eq!(parse_rate("1Gbit/s"), Ok(1e9));
        assert_eq!(parse_rate("100mbps"), Ok(100e6));
        assert_eq!(parse_rate("512kbit"), Ok(512e3));
        assert_eq!(parse_rate("1tbit"), Ok(1e12));
        assert_eq!(parse_rate("8bit/s"), Ok(8.0));
        assert_eq!(parse_rate("125MB/s"), Ok(1e9));
        assert_eq!(parse_rate("1MiB/s"), Ok(8.0 * 1048576.0));
        assert_eq!(parse_rate("1KB/s"), Ok(8000.0));
        assert!(parse_rate("1000").is_err());
        assert!(parse_rate("100m").is_err(), "bits or bytes? say mbit or MB/s");
        assert!(parse_rate("1 furlong").unwrap_err().to_string().contains("1gbit"));
        assert!(parse_rate("fast").unwrap_err().to_string().contains("1gbit"));
    }

    #[test]
    fn probabilities_stay_in_unit_interval() {
        assert_eq!(parse_probability("1e-3"), Ok(1e-3));
        assert_eq!(parse_probability("0.1%"), Ok(1e-3));
        assert_eq!(parse_probability("0"), Ok(0.0));
        assert!(parse_probability("2").unwrap_err().to_string().contains("between 0 and 1"));
        assert!(parse_probability("-0.1").is_err());
        assert!(parse_probability("1e-3ms").is_err());
        assert!(parse_probability("x").is_err());
    }
}
