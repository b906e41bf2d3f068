//! Symbols as real binaries have them, spliced in this test process: assembly without `.type`
//! or `.size` (the last symbol of `.text`, bytes after a `ret` that nothing reaches), IFUNCs
//! (libc's `wcslen`, which this process never calls on its own), versioned and object-qualified
//! names.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::OnceLock;

use instr_manager::point::resolve_point;
use instr_manager::session::{ComponentHandle, Session};
use instr_manager::Mechanism::{self, Jmp, Trap};
use trapvec::{SymbolKind, Target};

mod common;

use common::{compile_component, fixture_source, load_shared_object, serial, session_with};

/// Builds and loads `libbare.so` (from `fixtures/bare.S`) and builds a component counting calls
/// (`count_calls`, variable `calls`), once.
fn handlers() -> &'static PathBuf {
    static F: OnceLock<PathBuf> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        load_shared_object(&fixture_source("bare.S"), &dir.join("libbare.so"));
        let src = dir.join("count.c");
        std::fs::write(
            &src,
            "#include <trapvec.h>\nunsigned long calls;\n\
             void count_calls(struct trapvec_regs *regs, void *cookie)\n\
             { (void)regs; (void)cookie; __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED); }\n",
        )
        .unwrap();
        let handlers = dir.join("count.o");
        compile_component(&src, &handlers);
        handlers
    })
}

fn session() -> (Session, ComponentHandle) {
    session_with(handlers())
}

fn calls(c: &ComponentHandle) -> u64 {
    let a = c.symbol("calls").unwrap();
    // SAFETY: a u64 variable of the loaded component.
    unsafe { std::ptr::read_volatile(a as *const u64) }
}

fn dlsym(name: &str) -> u64 {
    let name = CString::new(name).unwrap();
    // SAFETY: a NUL-terminated name; RTLD_DEFAULT searches every loaded object.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as u64 }
}

/// Splice `at` (in function `func`, `int f(int)`) with count_calls by `mech`, call it 25 times,
/// check results, exact hits and the restored bytes.
fn count_bare(at: &str, func: &str, x: i32, want: i32, mech: Mechanism) {
    let (s, c) = session();
    let addr = dlsym(func);
    assert_ne!(addr, 0, "{func}");
    // SAFETY: the fixture functions have the C signature `int f(int)`.
    let f: extern "C" fn(i32) -> i32 =
        unsafe { std::mem::transmute(usize::try_from(addr).unwrap()) };
    let original = s.with(|sp| sp.target().read(addr, 5).unwrap());
    let before = calls(&c);
    let h = s
        .splice_call(at, &c, "count_calls", mech)
        .unwrap_or_else(|e| panic!("{at} by {mech}: {e}"));
    for _ in 0..25 {
        assert_eq!(f(x), want, "{at} by {mech}");
    }
    assert_eq!(h.hits().unwrap(), 25, "{at} by {mech}");
    assert_eq!(calls(&c) - before, 25, "{at} by {mech}: handler runs");
    h.remove().unwrap();
    assert_eq!(
        s.with(|sp| sp.target().read(addr, 5).unwrap()),
        original,
        "{at} by {mech}: restored"
    );
}

#[test]
fn assembly_without_type_or_size_is_spliced_by_trap_and_jmp() {
    let _serial = serial();
    for mech in [Trap, Jmp] {
        count_bare("bare_first", "bare_first", 41, 42, mech);
        count_bare("bare_last", "bare_last", 40, 42, mech);
        count_bare("libbare.so:bare_last", "bare_last", 1, 3, mech);
    }
}

#[test]
fn sizeless_last_function_ends_with_its_section() {
    let _serial = serial();
    let (s, _c) = session();
    let sym = s
        .with(|sp| sp.target().symbols().lookup("bare_last").cloned())
        .expect("bare_last");
    assert_eq!(sym.kind, SymbolKind::Function, "NOTYPE in .text");
    assert_eq!(
        sym.size, 6,
        "push rbp; lea eax,[rdi+2]; pop rbp; ret, up to the end of .text"
    );
    let first = s
        .with(|sp| sp.target().symbols().lookup("bare_first").cloned())
        .unwrap();
    assert_eq!(first.size, 7, "up to bare_last, the stray byte included");
}

#[test]
fn ifunc_resolves_to_the_implementation_the_linker_chose_and_is_spliced() {
    let _serial = serial();
    let (s, c) = session();
    let sym = s
        .with(|sp| sp.target().symbols().lookup("wcslen").cloned())
        .expect("wcslen");
    assert_eq!(sym.kind, SymbolKind::Function);
    assert_eq!(
        sym.addr,
        dlsym("wcslen"),
        "the implementation dlsym binds, not the resolver"
    );
    let text: Vec<libc::wchar_t> = "trapvec\0".chars().map(|ch| ch as libc::wchar_t).collect();
    for (at, mech) in [("wcslen", Trap), ("libc.so.6:wcslen", Jmp)] {
        let before = calls(&c);
        let h = s
            .splice_call(at, &c, "count_calls", mech)
            .unwrap_or_else(|e| panic!("{at} by {mech}: {e}"));
        for _ in 0..25 {
            // SAFETY: a NUL-terminated wide string.
            assert_eq!(unsafe { libc::wcslen(text.as_ptr()) }, 7);
        }
        assert_eq!(h.hits().unwrap(), 25, "{at} by {mech}");
        assert_eq!(calls(&c) - before, 25);
        h.remove().unwrap();
    }
}

#[test]
fn versions_and_ambiguity_resolve_as_the_dynamic_linker_binds() {
    let _serial = serial();
    let (s, _c) = session();
    let libc_handle = {
        let name = CString::new("libc.so.6").unwrap();
        // SAFETY: libc is loaded; RTLD_NOLOAD only returns its handle.
        unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) }
    };
    assert!(!libc_handle.is_null());
    let (name, ver) = (
        CString::new("memcpy").unwrap(),
        CString::new("GLIBC_2.2.5").unwrap(),
    );
    // SAFETY: a live handle and NUL-terminated strings.
    let old = unsafe { libc::dlvsym(libc_handle, name.as_ptr(), ver.as_ptr()) } as u64;
    s.with(|sp| {
        let t = sp.target();
        let site = |text: &str| {
            resolve_point(&text.parse().unwrap(), t.symbols(), t.info(), |_| 0).map(|p| p.site)
        };
        assert_eq!(site("memcpy@GLIBC_2.2.5").unwrap(), old);
        assert_eq!(
            site("memcpy").unwrap(),
            dlsym("memcpy"),
            "unversioned: the default version"
        );
        let err = site("libnosuch:memcpy").unwrap_err().to_string();
        assert!(err.contains("libc.so.6"), "{err}");
    });
    // Two libraries define `dup_fn`, the program does not: which one is meant?
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("dup.S"),
        ".text\n.globl dup_fn\ndup_fn:\n  ret\n",
    )
    .unwrap();
    for lib in ["libdupone.so", "libduptwo.so"] {
        load_shared_object(&dir.path().join("dup.S"), &dir.path().join(lib));
    }
    s.refresh_symbols().unwrap();
    s.with(|sp| {
        let t = sp.target();
        let site = |text: &str| {
            resolve_point(&text.parse().unwrap(), t.symbols(), t.info(), |_| 0).map(|p| p.site)
        };
        let err = site("dup_fn").unwrap_err().to_string();
        assert!(
            err.contains("ambiguous")
                && err.contains("libdupone.so:dup_fn at 0x")
                && err.contains("libduptwo.so:dup_fn at 0x"),
            "{err}"
        );
        assert!(site("libduptwo:dup_fn").is_ok());
    });
    // SAFETY: balances the dlopen above.
    unsafe { libc::dlclose(libc_handle) };
}
