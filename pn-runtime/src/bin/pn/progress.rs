//! The terminal progress bar of the long-running commands (`pn convert`, `pn quantize`):
//! phase, bytes done of the total, rate, ETA, and the current tensor (or calibration tokens).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pn_runtime::quantize::Progress;
use std::sync::Mutex;

/// A bar on stderr (hidden with `quiet`), behind a mutex so worker threads can advance it.
pub fn bar(quiet: bool) -> Mutex<ProgressBar> {
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr())
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>10} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta} {wide_msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    Mutex::new(bar)
}

/// Shows progress event `p` on `bar`.
pub fn update(bar: &Mutex<ProgressBar>, p: Progress<'_>) {
    let Ok(b) = bar.lock() else { return };
    match p {
        Progress::Phase { label, total_bytes } => {
            b.set_prefix(label.to_string());
            b.set_length(total_bytes);
            b.set_position(0);
            b.reset_eta();
        }
        Progress::Calib { done, total } => {
            if done == 0 {
                b.set_prefix("calibrate");
                b.set_length(total as u64);
                b.set_position(0);
                b.reset_eta();
            } else {
                b.set_position(done as u64);
            }
            let rate = b.per_sec();
            b.set_message(format!("{done}/{total} tokens, {rate:.0} tokens/s"));
        }
        Progress::Tensor { name } => b.set_message(name.to_string()),
        Progress::Advance(n) => b.inc(n),
    }
}

/// Clears the bar from the terminal.
pub fn finish(bar: &Mutex<ProgressBar>) {
    if let Ok(b) = bar.lock() {
        b.finish_and_clear();
    }
}
