//! LUN sizes read as every stics subcommand reads sizes, and whole 512-byte blocks on top.

use stics_block::parse_size;

#[test]
fn binary_and_decimal_suffixes() {
    assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
    assert_eq!(parse_size("64M").unwrap(), 64 << 20);
    assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
    assert_eq!(parse_size("1GB").unwrap(), 1_000_000_000);
    assert_eq!(parse_size("1gb").unwrap(), 1_000_000_000);
    assert_eq!(parse_size("4096").unwrap(), 4096);
    assert_eq!(parse_size("2TB").unwrap(), 2_000_000_000_000);
}

#[test]
fn sizes_must_be_whole_blocks() {
    // 10^6 bytes is 1953.125 blocks.
    assert!(parse_size("1MB").is_err());
    assert!(parse_size("1MiB").is_ok());
    assert!(parse_size("0").is_err());
    assert!(parse_size("100").is_err());
    assert!(parse_size("1.0000001G").is_err());
}
