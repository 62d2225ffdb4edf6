//! Developer automation: `cargo xtask <subcommand>`.
//!
//! Each subcommand is a module with a clap `Args` struct and `run(args)`; add one variant to
//! [`Task`] and one match arm to add another (e.g. `golden`).

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod golden;
mod quant_error;
mod synth_model;
mod traffic;
mod traffic_batch;
mod traffic_count;

/// `cargo xtask`: developer tasks of the pn workspace.
#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Write a synthetic model with the real Qwen3.8-27B-PN3 shapes and types (mix P0k+19).
    SynthModel(synth_model::Args),
    /// Rerun the golden set and compare with the reviewed snapshots (xtask/golden/).
    Golden(golden::Args),
    /// Per-tensor error of pn3t/pn4t (rotated or not) against Q3_K/Q4_K on any GGUF's weights.
    QuantError(quant_error::Args),
    /// Memory traffic model of one 27B decode token on the P100 (checked against the emulator).
    Traffic(traffic::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: Result<(), Box<dyn std::error::Error>> = match cli.task {
        Task::SynthModel(args) => synth_model::run(args),
        Task::Golden(args) => golden::run(args),
        Task::QuantError(args) => quant_error::run(args),
        Task::Traffic(args) => traffic::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
