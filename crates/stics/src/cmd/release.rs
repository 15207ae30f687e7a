//! `stics release URL --holder KEY`: breaks the persistent reservation a writer that is gone for
//! good holds on a LUN (a gateway whose log was lost), so that the LUN can be used alone.

use std::time::Duration;

use anyhow::Context;
use stics_initiator::{Config, IscsiUrl, Lun, LunOptions};

#[derive(clap::Args)]
pub struct Args {
    /// The LUN: iscsi://[user[%secret]@]host[:port]/IQN/LUN.
    pub url: String,
    /// The reservation key of the writer to break, as a gateway's refusal names it (0x… or
    /// decimal). Nothing is done unless this key holds the reservation.
    #[arg(long, value_parser = parse_key)]
    pub holder: u64,
    /// Seconds allowed for connect and login.
    #[arg(long, default_value_t = 5)]
    pub timeout: u64,
}

fn parse_key(s: &str) -> Result<u64, String> {
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|e| format!("{s:?} is not a reservation key: {e}"))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    super::logging::init("warn");
    let url = IscsiUrl::parse(&args.url)?;
    let config = Config { login_timeout: Duration::from_secs(args.timeout.max(1)), ..Config::default() };
    let opts = LunOptions { config, ..LunOptions::default() };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let lun = Lun::open(&url, &opts).await.with_context(|| format!("cannot open {}", args.url))?;
        let r = lun.release_holder(args.holder).await;
        lun.close().await;
        r.with_context(|| format!("cannot release the reservation of key {:#x}", args.holder))?;
        println!("{}: no reservation of key {:#x} is left", args.url, args.holder);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_are_read_in_hex_or_decimal() {
        assert_eq!(super::parse_key("0x1f"), Ok(31));
        assert_eq!(super::parse_key("31"), Ok(31));
        assert!(super::parse_key("0xzz").is_err());
    }
}
