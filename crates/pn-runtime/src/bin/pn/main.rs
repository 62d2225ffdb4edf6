//! `pn`: run, inspect and serve Qwen3.5/3.8 hybrid models in the PN format.
//!
//! Each subcommand lives in its own module with an `Args` struct (clap derive) and a
//! `run(args) -> Result<(), Box<dyn std::error::Error>>` function; this file only dispatches.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Command-line interface of the pn inference engine.
#[derive(Parser)]
#[command(name = "pn", version, about = "Run Qwen3.5/3.8 hybrid models in the PN format")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    // One variant per subcommand, e.g. `Inspect(inspect::Args)`.
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        // Command::Inspect(args) => inspect::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
