//! No source file of the module (`kmod/`, its C test suite included) or of the instrumentation
//! manager (`src/`) is over [`MAX_LINES`] lines (issue 25: a file is one job; a test module
//! grows into a file of its own, `#[cfg(test)] mod tests;`). Each file over is named with its
//! length.

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 700;

/// Every file under `dir` (recursively) whose extension is one of `exts`.
fn sources(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, exts, out);
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| exts.contains(&e))
        {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_of_kmod_or_instr_manager_is_over_700_lines() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&crate_dir.join("src"), &["rs"], &mut files);
    let rust = files.len();
    // The module's sources and its C test suite (kmod/tests) with its scripts.
    sources(
        &crate_dir.join("../kmod"),
        &["c", "h", "S", "sh"],
        &mut files,
    );
    assert!(
        rust > 50 && files.len() > rust + 20,
        "found the sources ({rust} Rust, {} in all)",
        files.len()
    );
    let mut over: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let n = std::fs::read_to_string(p).unwrap().lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", p.display()))
        })
        .collect();
    over.sort();
    assert!(
        over.is_empty(),
        "over {MAX_LINES} lines: {}",
        over.join(", ")
    );
}
