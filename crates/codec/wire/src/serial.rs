//! Serial number arithmetic of RFC 1982 on the 32-bit sequence numbers of iSCSI (CmdSN,
//! StatSN, DataSN: RFC 7143 §4.2.2.1), which wrap around.

/// True when `a` comes before `b`.
pub fn lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 1 << 31
}

/// True when `a` comes before `b` or equals it.
pub fn le(a: u32, b: u32) -> bool {
    a == b || lt(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_comparison_wraps_around_zero() {
        assert!(lt(1, 2));
        assert!(!lt(2, 1));
        assert!(lt(u32::MAX, 0));
        assert!(!lt(0, u32::MAX));
        assert!(!lt(5, 5));
        assert!(le(5, 5));
        assert!(le(u32::MAX, 3));
    }

    #[test]
    fn numbers_half_the_space_apart_are_not_before_each_other_in_one_direction() {
        // RFC 1982 leaves a distance of exactly 2^31 undefined; it must not be "before" both ways.
        assert!(!(lt(0, 1 << 31) && lt(1 << 31, 0)));
    }
}
