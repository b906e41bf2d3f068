//! A spinner on stderr while one long request runs (a glob's batch of hundreds of splices, its
//! removal): the batch is one request, all or nothing, so there are no steps to count, only the
//! time it has taken so far. Drawn only when stderr is a terminal, `TERM` names one that can
//! draw (set, not `dumb`: a serial console captured into a log, as vmtest's guests set it, is
//! not drawn on) and the output is not `--json` (a script reading stdout or stderr never sees
//! it); cleared when the request ends.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The spinner of one request; dropping it clears the line.
pub struct Working(Option<ProgressBar>);

/// Start a spinner saying `what` (e.g. "splicing 'tcp_*' (one batch)"), unless `json`,
/// stderr is not a terminal, or `TERM` is unset, empty or `dumb`.
pub fn working(what: String, json: bool) -> Working {
    let drawable_term = std::env::var_os("TERM").is_some_and(|t| !t.is_empty() && t != "dumb");
    if json || !drawable_term || !std::io::stderr().is_terminal() {
        return Working(None);
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(what);
    // Drawn at once: a batch that ends within the first tick still showed what it was doing.
    bar.tick();
    bar.enable_steady_tick(Duration::from_millis(120));
    Working(Some(bar))
}

impl Drop for Working {
    fn drop(&mut self) {
        if let Some(bar) = self.0.take() {
            bar.finish_and_clear();
        }
    }
}
