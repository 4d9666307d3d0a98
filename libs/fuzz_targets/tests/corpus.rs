//! Replays every fuzz corpus (`fuzz/corpus/<target>/`) through its target's `check`, the
//! function the libFuzzer binary in `fuzz/` calls: the inputs that once found a bug, and those
//! that reach the decoders' corners, must pass on every change, in a plain `cargo test`.
//!
//! One test per target, so targets replay in parallel and a failure names its target. Like
//! `libFuzzer -runs=0 -timeout=10` before it, each test runs the empty input and then every file
//! of the corpus, in name order, each on a thread of its own named `<target>/<file>` (so a
//! panic message names the input), and gives each input 10 s: an input still running then is a
//! hang. A panic does not stop the replay, so one run lists every failing input; a hang does,
//! since the hung thread still holds the target's state.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// An input that takes longer is a hang, as scripts/fuzz-all's `-timeout=10` has it.
const TIME_LIMIT: Duration = Duration::from_secs(10);

macro_rules! replay_tests {
    ($($target:ident),* $(,)?) => {
        $(
            #[test]
            fn $target() {
                replay(stringify!($target), fuzz_targets::$target::check);
            }
        )*
        /// Every target with a replay test above.
        const REPLAYED: &[&str] = &[$(stringify!($target)),*];
    };
}

replay_tests!(
    datadir_values,
    delta_layer,
    disk_btree,
    image_layer,
    ingest_body,
    manifest,
    remote_index,
    remote_object_names,
    scan_token,
    tar_import,
    value,
    value_frame,
    wal_decoder,
);

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The names of the entries of `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Runs `check` on the empty input and on every file of the target's corpus; fails naming each
/// input that panicked, or the one that hung.
fn replay(target: &str, check: fn(&[u8])) {
    let corpus = fuzz_dir().join("corpus").join(target);
    let mut inputs: Vec<(String, Vec<u8>)> = vec![("(the empty input)".to_owned(), Vec::new())];
    for file in names_in(&corpus) {
        let bytes = std::fs::read(corpus.join(&file)).unwrap();
        inputs.push((format!("fuzz/corpus/{target}/{file}"), bytes));
    }
    let started = Instant::now();
    let mut failures = Vec::new();
    for (name, bytes) in &inputs {
        let (done, finished) = mpsc::channel();
        let bytes = bytes.clone();
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                check(&bytes);
                // The receiver is gone only if this input already timed out.
                let _ = done.send(());
            })
            .unwrap();
        match finished.recv_timeout(TIME_LIMIT) {
            Ok(()) => thread.join().unwrap(),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // The thread dropped its sender without sending: it panicked.
                let payload = thread.join().unwrap_err();
                failures.push(format!("{name}: panicked: {}", panic_message(&*payload)));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                failures.push(format!(
                    "{name}: still running after {TIME_LIMIT:?} (a hang)"
                ));
                break;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "fuzz target {target} fails on {} of {} inputs:\n  {}",
        failures.len(),
        inputs.len(),
        failures.join("\n  ")
    );
    println!(
        "{target}: {} inputs in {:.1?}",
        inputs.len(),
        started.elapsed()
    );
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "(a panic without a message)"
    }
}

/// A target added to `fuzz/` without a replay test here, or a corpus without a target, would
/// be skipped without a word; so would an empty corpus.
#[test]
fn every_fuzz_target_and_corpus_is_replayed() {
    let replayed: Vec<String> = REPLAYED.iter().map(|s| s.to_string()).collect();
    let sources: Vec<String> = names_in(&fuzz_dir().join("fuzz_targets"))
        .iter()
        .map(|name| name.trim_end_matches(".rs").to_owned())
        .collect();
    assert_eq!(
        sources, replayed,
        "fuzz/fuzz_targets/*.rs and the replay tests differ"
    );
    assert_eq!(
        names_in(&fuzz_dir().join("corpus")),
        replayed,
        "the directories of fuzz/corpus and the replay tests differ"
    );
    for target in REPLAYED {
        let corpus = fuzz_dir().join("corpus").join(target);
        assert!(
            !names_in(&corpus).is_empty(),
            "{} is empty",
            corpus.display()
        );
    }
}
