//! One module per subcommand; each has an `Args` (clap) and a `run`.

pub mod gateway;
pub mod logging;
pub mod ls;
pub mod model;
pub mod mount;
pub mod target;
pub mod wan;
