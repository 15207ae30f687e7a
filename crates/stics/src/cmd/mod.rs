//! One module per subcommand; each has an `Args` (clap) and a `run`.

pub mod bench;
pub mod gateway;
pub mod logging;
pub mod ls;
pub mod model;
pub mod mount;
pub mod nfs_mount;
pub mod quarantine;
pub mod release;
pub mod target;
pub mod wan;

/// What a storage server starts with: logging, the allocator tuned for large buffers, and a
/// multi-threaded runtime of `threads` workers.
pub fn server_runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    logging::init("info");
    crate::alloc::tune_for_storage_server();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .context("cannot start the runtime")
}
