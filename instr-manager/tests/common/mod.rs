//! What the in-process test binaries share: building fixtures at test time (a shared object
//! loaded into the test process, a handler component), one test at a time, a session.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;

use instr_manager::session::{ComponentHandle, Session};

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `instr-manager/tests/fixtures/<name>`.
pub fn fixture_source(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[allow(dead_code, reason = "each test binary uses part of the common helpers")]
/// Assemble `src` into the shared object `so` (no libc) and load it into this process for
/// good, its symbols global.
pub fn load_shared_object(src: &Path, so: &Path) {
    let out = Command::new("cc")
        .args(["-shared", "-nostdlib", "-o"])
        .arg(so)
        .arg(src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: loading a library we just built (no constructors); it stays loaded.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!h.is_null());
}

/// Compile the component `src` into `obj` as process components are built.
pub fn compile_component(src: &Path, obj: &Path) {
    let out = Command::new("cc")
        .args(["-c", "-O2", "-fPIC", "-I"])
        .arg(repo().join("components/include"))
        .arg("-o")
        .arg(obj)
        .arg(src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The tests of one binary splice the same functions and count exact hits: one at a time.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A session over this process with fresh symbols and the component `handlers` loaded.
pub fn session_with(handlers: &Path) -> (Session, ComponentHandle) {
    let s = Session::open().unwrap();
    s.refresh_symbols().unwrap();
    let c = s.load(handlers).unwrap();
    (s, c)
}
