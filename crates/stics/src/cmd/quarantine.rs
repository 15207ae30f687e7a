//! `stics quarantine`: what a gateway of a shared LUN kept of the writes it made under a token the
//! SG broke (files in `LOG.quarantine/`): `show` lists a file's runs, `apply` writes them to a
//! device, for an operator who decides they should land after all.

use std::path::PathBuf;

use anyhow::Context;
use bytes::Bytes;
use stics_shared::quarantine::Quarantine;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(clap::Subcommand)]
pub enum What {
    /// List a quarantine file's segment, generation and runs of blocks.
    Show {
        /// A file from a gateway's LOG.quarantine/ directory.
        file: PathBuf,
    },
    /// Write a quarantine file's runs to a device (any device spec; a shared LUN through one
    /// of its gateways, since its SG refuses plain writes to segments a gateway holds). What
    /// the device holds there now is overwritten.
    Apply {
        /// A file from a gateway's LOG.quarantine/ directory.
        file: PathBuf,
        /// Where to write them: iscsi://…, file:PATH, …
        #[arg(long, value_name = "DEVICE-SPEC")]
        to: String,
    },
}

fn read(file: &PathBuf) -> anyhow::Result<Quarantine> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    Quarantine::decode(&bytes).with_context(|| format!("{} is no quarantine file stics can read", file.display()))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    super::logging::init("warn");
    match args.what {
        What::Show { file } => {
            let q = read(&file)?;
            println!(
                "segment {} (generation {}): {} blocks of {} bytes in {} runs",
                q.segment,
                q.generation,
                q.blocks(),
                q.block_size,
                q.runs.len()
            );
            for (lba, data, blocks) in &q.runs {
                let what = if data.is_some() { "data" } else { "zeros" };
                println!("  blocks {lba}+{blocks}: {what}");
            }
            Ok(())
        }
        What::Apply { file, to } => {
            let q = read(&file)?;
            let spec: stics_stack::DeviceSpec = to.parse().context("--to")?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async {
                let ctx = stics_stack::OpenContext::default();
                let dev = stics_stack::open(&spec, &ctx).await.with_context(|| format!("cannot open {to}"))?;
                let bs = dev.geometry().block_size;
                anyhow::ensure!(
                    bs == q.block_size,
                    "the file holds {}-byte blocks and {to} has {bs}-byte blocks",
                    q.block_size
                );
                let mut r = Ok(());
                for (lba, data, blocks) in &q.runs {
                    r = match data {
                        Some(d) => dev.write(*lba, Bytes::from(d.clone()), true).await,
                        None => dev.write_zeros(*lba, *blocks).await,
                    };
                    if r.is_err() {
                        break;
                    }
                }
                let r = match r {
                    Ok(()) => dev.flush().await,
                    e => e,
                };
                ctx.close().await;
                r.with_context(|| format!("writing to {to}"))?;
                println!("{}: {} blocks of segment {} written to {to}", file.display(), q.blocks(), q.segment);
                Ok(())
            })
        }
    }
}
