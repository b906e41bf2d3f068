//! Replays the committed corpora (fuzz/corpus/<harness>/, minimised by the campaign) and the
//! inputs that once broke something (fuzz/regressions/<harness>/) through the harnesses, as
//! the fuzzer ran them: each file must pass every property of its harness.

use std::path::{Path, PathBuf};

fn files(harness: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(rd) = std::fs::read_dir(root.join(dir).join(harness)) else {
            continue;
        };
        out.extend(
            rd.map(|e| e.expect("reading a corpus folder").path())
                .filter(|p| p.is_file()),
        );
    }
    out.sort();
    out
}

fn replay(harness: &str) {
    let run = trapvec_fuzz::HARNESSES
        .iter()
        .find(|(n, _)| *n == harness)
        .expect("a harness of that name")
        .1;
    let files = files(harness);
    assert!(!files.is_empty(), "no corpus for harness `{harness}`");
    let mut failed = Vec::new();
    for f in &files {
        let data = std::fs::read(f).expect("reading a corpus file");
        if std::panic::catch_unwind(|| run(&data)).is_err() {
            failed.push(f.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "{harness}: {} of {} inputs fail: {}",
        failed.len(),
        files.len(),
        failed.join(", ")
    );
}

#[test]
fn loader_corpus_replays() {
    replay("loader");
}

#[test]
fn spec_corpus_replays() {
    replay("spec");
}

#[test]
fn protocol_corpus_replays() {
    replay("protocol");
}

#[test]
fn state_corpus_replays() {
    replay("state");
}

#[test]
fn bench_corpus_replays() {
    replay("bench");
}

#[test]
fn analysis_corpus_replays() {
    replay("analysis");
}

#[test]
fn debug_dumps_are_not_sentences_and_user_text_in_a_sentence_is_fine() {
    use trapvec_fuzz::assert_sentence;
    assert!(
        std::panic::catch_unwind(|| assert_sentence("t", "Decode(Error(\"eof\", line: 1))"))
            .is_err()
    );
    assert!(std::panic::catch_unwind(|| assert_sentence(
        "t",
        "Truncated { func: \"f\", addr: 1 }"
    ))
    .is_err());
    assert!(std::panic::catch_unwind(|| assert_sentence("t", "")).is_err());
    // Found by the protocol fuzzer: a point named `E5(x` starts a real sentence.
    assert_sentence("t", "E5(x: unknown action `y` (call, replace or count)");
    assert_sentence("t", "Function `f` (at 0x1) is too short (2 bytes)");
}

#[test]
fn landing_corpus_replays() {
    replay("landing");
}
