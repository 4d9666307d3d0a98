//! The progress line of a long transfer (`import`, `basebackup`): bytes so far, of how many
//! when the total is known, the time taken and the rate, on stderr, rewritten in place twice a
//! second and once more, final, when the transfer ends.
//!
//! Only when stderr is a terminal: a line rewritten with carriage returns is for a person
//! watching. Redirected to a file or a pipe (a script, a test, a CI log) stderr gets no progress
//! at all, so what is there is the error, if any, on one line.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const EVERY: Duration = Duration::from_millis(500);
const MIB: f64 = (1 << 20) as f64;

/// A progress line being drawn, or nothing when stderr is not a terminal.
pub struct Progress {
    drawing: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

impl Progress {
    /// Starts the line of `what` counting `bytes` (which the transfer adds to) against `total`.
    pub fn start(what: &'static str, bytes: Arc<AtomicU64>, total: Option<u64>) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress { drawing: None };
        }
        let done = Arc::new(AtomicBool::new(false));
        let finished = done.clone();
        let started = Instant::now();
        let thread = std::thread::spawn(move || loop {
            let last = finished.load(Ordering::Acquire);
            let text = line(
                what,
                bytes.load(Ordering::Relaxed),
                total,
                started.elapsed().as_secs_f64(),
            );
            // Back to the line's start, the line, then erase what a longer one left.
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r{text}\x1b[K{}", if last { "\n" } else { "" });
            let _ = stderr.flush();
            drop(stderr);
            if last {
                return;
            }
            std::thread::park_timeout(EVERY);
        });
        Progress {
            drawing: Some((done, thread)),
        }
    }

    /// Draws the final line and returns once it is out, so an error printed next comes after it.
    pub fn finish(self) {
        if let Some((done, thread)) = self.drawing {
            done.store(true, Ordering::Release);
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// `import: 45.2 of 88.9 MiB (51%) in 0.5 s, 98.6 MiB/s`, or without ` of ... (..%)` when the
/// total is not known.
pub fn line(what: &str, bytes: u64, total: Option<u64>, secs: f64) -> String {
    let mib = bytes as f64 / MIB;
    let rate = mib / secs.max(0.001);
    let amount = match total {
        Some(total) => {
            // The total may be an estimate a little short of the end: never past 100 %.
            let percent = bytes
                .saturating_mul(100)
                .checked_div(total)
                .map_or(100, |p| p.min(100));
            format!("{mib:.1} of {:.1} MiB ({percent}%)", total as f64 / MIB)
        }
        None => format!("{mib:.1} MiB"),
    };
    format!("{what}: {amount} in {secs:.1} s, {rate:.1} MiB/s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_bytes_of_the_total_time_and_rate() {
        assert_eq!(
            line("import", 45 << 20, Some(90 << 20), 0.5),
            "import: 45.0 of 90.0 MiB (50%) in 0.5 s, 90.0 MiB/s"
        );
        assert_eq!(
            line("basebackup", 3 << 19, None, 2.0),
            "basebackup: 1.5 MiB in 2.0 s, 0.8 MiB/s"
        );
        // An estimate overrun, an empty total, no time at all: no panic, no nonsense.
        assert!(line("import", 100, Some(50), 1.0).contains("(100%)"));
        assert!(line("import", 0, Some(0), 0.0).contains("(100%)"));
        assert!(line("import", 1 << 20, None, 0.0).ends_with("1000.0 MiB/s"));
    }
}
