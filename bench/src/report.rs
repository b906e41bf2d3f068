//! `bench report`: runs cost, batch, sizes, plan and speed, and writes under the results folder
//! JSON and CSV of each, the figures as PNG and SVG ([`crate::plots`]) and `summary.md`.

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar over `len` steps (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:<32} [{bar:40}] {pos}/{len} {elapsed}/{duration}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// A spinner for a step of unknown length.
pub fn spinner(what: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_message(what.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}
