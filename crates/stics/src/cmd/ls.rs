//! `stics ls URL`: lists the targets behind a portal and their LUNs with size and block size,
//! like libiscsi's iscsi-ls.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use stics_initiator::probe::{human_size, probe};
use stics_initiator::scsi::device_type_name;
use stics_initiator::{Config, IscsiUrl};

#[derive(clap::Args)]
pub struct Args {
    /// Portal or target: iscsi://[user[%secret]@]host[:port][/IQN[/LUN]]. Without an IQN every
    /// target found by SendTargets discovery is listed.
    pub url: String,
    /// This initiator's name (IQN) [default: iqn.2024-01.org.stics:initiator].
    #[arg(long)]
    pub initiator_name: Option<String>,
    /// Ask for CRC32C header and data digests.
    #[arg(long)]
    pub digests: bool,
    /// Print the traffic counters (commands, PDUs, bytes, round trips) at the end.
    #[arg(long)]
    pub stats: bool,
    /// Seconds allowed for connect and login.
    #[arg(long, default_value_t = 5)]
    pub timeout: u64,
    /// Connect over TLS 1.3, trusting the CA certificates in this PEM file.
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// The name the target's certificate must carry [default: the URL's host].
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    pub tls_name: Option<String>,
    /// A client certificate (PEM) for a target that verifies its clients (with --tls-key).
    #[arg(long, value_name = "PEM", requires_all = ["tls_ca", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    super::logging::init("warn");
    let url = IscsiUrl::parse(&args.url)?;
    let mut cfg = Config::default();
    if let Some(n) = args.initiator_name {
        cfg.initiator_name = n;
    }
    cfg.offer.header_digest = args.digests;
    cfg.offer.data_digest = args.digests;
    cfg.login_timeout = Duration::from_secs(args.timeout.max(1));
    if let Some(ca) = args.tls_ca {
        let o = stics_tls::ClientOptions { ca, name: args.tls_name, cert: args.tls_cert, key: args.tls_key };
        cfg.tls = Some(stics_tls::Connector::new(&o)?);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (targets, counters) = rt.block_on(probe(&url, &cfg)).with_context(|| format!("listing {url}"))?;
    for t in &targets {
        let portal = t.entry.addresses.first().cloned().unwrap_or_else(|| url.portal());
        println!("Target:{} Portal:{}", t.entry.name, portal);
        for l in &t.luns {
            match l.capacity {
                Some(c) => println!(
                    "Lun:{:<4} Type:{} (Size:{} Blocks:{} BlockSize:{})",
                    l.lun,
                    device_type_name(l.device_type),
                    human_size(c.num_blocks * u64::from(c.block_size)),
                    c.num_blocks,
                    c.block_size
                ),
                None => println!("Lun:{:<4} Type:{}", l.lun, device_type_name(l.device_type)),
            }
        }
    }
    if args.stats {
        eprintln!("{counters}");
    }
    Ok(())
}
