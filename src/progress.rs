//! Progress bars for long work: drawn on a terminal, silent otherwise (CI logs, pipes).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over `total` units (bytes when `bytes`), hidden unless stderr is a terminal.
pub fn bar(total: u64, message: &str, bytes: bool) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), draw_target());
    let template = if bytes {
        "{msg:>10} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})"
    } else {
        "{msg:>10} [{bar:40}] {human_pos}/{human_len} ({per_sec}, eta {eta})"
    };
    bar.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(message.to_owned());
    bar
}

/// A spinner with a running count, for work of unknown length.
pub fn counter(message: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, draw_target());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} {human_pos} ({per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(message.to_owned());
    bar
}

fn draw_target() -> ProgressDrawTarget {
    if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}
