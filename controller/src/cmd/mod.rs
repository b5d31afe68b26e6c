//! The `kube-discovery` subcommands: the clap definition, `run` (which wires
//! the controller together), `demo`, `nodes`, `render` and the shell helpers.

pub mod cli;
#[cfg(feature = "demo")]
pub mod demo;
pub mod nodes_cmd;
pub mod render_cmd;
pub mod run;
pub mod shell;
