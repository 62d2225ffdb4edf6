//! Developer automation: `cargo xtask golden` and friends.

fn main() {
    eprintln!("usage: cargo xtask <golden|synth-model>");
    std::process::exit(2);
}
