//! Numbers as people read them in tables and legends: four significant digits.

/// Four significant digits, trailing zeros dropped; exponent form for very small or large values;
/// `-` for a missing (NaN) value.
pub fn num(v: f64) -> String {
    if v.is_nan() {
        return "-".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e7) {
        return format!("{v:.3e}");
    }
    let digits = if v == 0.0 { 0 } else { (3 - v.abs().log10().floor() as i32).clamp(0, 6) as usize };
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// `v` scaled into a display unit, with the unit: `scaled(0.002, 1e3, "ms")` is `2 ms`.
pub fn scaled(v: f64, scale: f64, unit: &str) -> String {
    if unit.is_empty() {
        num(v * scale)
    } else {
        format!("{} {unit}", num(v * scale))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_print_with_four_significant_digits() {
        assert_eq!(num(1.0), "1");
        assert_eq!(num(2.1875), "2.188");
        assert_eq!(num(262.144), "262.1");
        assert_eq!(num(0.02239), "0.02239");
        assert_eq!(num(4.29251e-4), "4.293e-4");
        assert_eq!(num(f64::INFINITY), "inf");
        assert_eq!(num(f64::NEG_INFINITY), "-inf");
        assert_eq!(num(f64::NAN), "-");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(12345678.0), "1.235e7");
    }

    #[test]
    fn scaled_values_carry_their_unit() {
        assert_eq!(scaled(0.002, 1e3, "ms"), "2 ms");
        assert_eq!(scaled(6144.0, 1.0 / 1024.0, "KiB"), "6 KiB");
        assert_eq!(scaled(0.5, 1.0, ""), "0.5");
    }
}
