//! Code the process benchmarks splice, assembled and compiled at run time (the bench runs where
//! trapvec is developed, so `cc` is there): a shared object with the benchmark functions and the
//! minimal C SIGSEGV handler that only advances RIP (the floor of the trap mechanism), and a
//! component with an empty handler.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;
use thiserror::Error;

/// Building or loading the fixtures failed.
#[derive(Debug, Error)]
pub enum FixtureError {
    #[error("cannot run cc")]
    NoCompiler(#[source] std::io::Error),
    #[error("cc failed building the {what}: {stderr}")]
    Compile { what: &'static str, stderr: String },
    #[error("writing {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("dlopen {path}: {reason}")]
    Dlopen { path: PathBuf, reason: String },
    #[error("symbol `{0}` not found in the fixture")]
    Symbol(String),
}

type Result<T> = std::result::Result<T, FixtureError>;

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| FixtureError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// The functions, the floor handler and the `int $0xf5` used to measure it.
const FIXTURE_C: &str = r#"
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#include <ucontext.h>

__attribute__((noinline)) int bench_target(int x)
{
	__asm__ volatile("" ::: "memory");
	return x + 1;
}

/* The same code again, for the uprobe row (a uprobe and a trap splice on one function would
 * overwrite each other's bytes). */
__attribute__((noinline)) int bench_target2(int x)
{
	__asm__ volatile("" ::: "memory");
	return x + 1;
}

/* A 3-byte function (`xor eax,eax; ret`) followed by int3 padding: a jmp splice there needs a
 * `jmp rel8` to a springboard in the padding. */
__asm__(".text\n"
	".p2align 4, 0xcc\n"
	".globl bench_short\n"
	".type bench_short, @function\n"
	"bench_short:\n"
	"\txor %eax, %eax\n"
	"\tret\n"
	".size bench_short, .-bench_short\n"
	".p2align 5, 0xcc\n"
	".globl bench_short_next\n"
	".type bench_short_next, @function\n"
	"bench_short_next:\n"
	"\tret\n"
	".size bench_short_next, .-bench_short_next\n");

static void floor_handler(int sig, siginfo_t *si, void *ctx)
{
	ucontext_t *uc = ctx;
	(void)sig;
	(void)si;
	uc->uc_mcontext.gregs[REG_RIP] += 2;
}

static struct sigaction floor_old;

int floor_install(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = floor_handler;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	return sigaction(SIGSEGV, &sa, &floor_old);
}

int floor_restore(void)
{
	return sigaction(SIGSEGV, &floor_old, 0);
}

__attribute__((noinline)) void floor_trap(void)
{
	__asm__ volatile("int $0xf5" ::: "memory");
}

__attribute__((noinline)) void int3_trap(void)
{
	__asm__ volatile("int3" ::: "memory");
}

/* `int $3` in its 2-byte form (CD 03; gas writes `int $3` as CC): #BP like int3, so SIGTRAP,
 * with RIP after both bytes. */
__attribute__((noinline)) void int3_long_trap(void)
{
	__asm__ volatile(".byte 0xcd, 0x03" ::: "memory");
}

/* Traps the SIGTRAP handler saw whose two bytes before RIP were not CD 03. */
unsigned long int3_long_strays;

static void int3_handler(int sig, siginfo_t *si, void *ctx)
{
	ucontext_t *uc = ctx;
	const unsigned char *ip = (const unsigned char *)uc->uc_mcontext.gregs[REG_RIP];
	(void)sig; (void)si;
	/* What an agent using CD 03 must do to tell its own trap from a debugger's CC: read the
	 * bytes before RIP (the same work for both floors, so their rows compare). */
	if (ip[-2] != 0xcd || ip[-1] != 0x03)
		int3_long_strays++;
}

static struct sigaction int3_old;

int int3_install(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = int3_handler;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	return sigaction(SIGTRAP, &sa, &int3_old);
}

int int3_restore(void)
{
	return sigaction(SIGTRAP, &int3_old, 0);
}
"#;

const HANDLER_C: &str = r#"
#include <trapvec.h>
void empty_handler(struct trapvec_regs *regs, void *cookie) { (void)regs; (void)cookie; }
"#;

/// The benchmark functions (loaded into this process) and the empty handler component.
pub struct Fixture {
    /// Holds the files; removed when the fixture is dropped (the library stays mapped).
    _dir: TempDir,
    /// The component (`empty_handler`).
    pub handler: PathBuf,
    /// The shared object with the benchmark functions.
    pub so: PathBuf,
    lib: Library,
}

/// A `dlopen`ed library, never closed (its code may still be spliced or running).
pub struct Library(*mut libc::c_void);

impl Library {
    /// The address of `name`.
    pub fn sym(&self, name: &str) -> Result<usize> {
        let n = CString::new(name).map_err(|_| FixtureError::Symbol(name.to_string()))?;
        // SAFETY: `self.0` is a handle dlopen returned and nothing closes; `n` is NUL-terminated.
        let p = unsafe { libc::dlsym(self.0, n.as_ptr()) };
        if p.is_null() {
            return Err(FixtureError::Symbol(name.to_string()));
        }
        Ok(p as usize)
    }
}

fn cc(args: &[&str], what: &'static str) -> Result<()> {
    let out = Command::new("cc")
        .args(args)
        .output()
        .map_err(FixtureError::NoCompiler)?;
    if !out.status.success() {
        return Err(FixtureError::Compile {
            what,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(())
}

fn repo_include() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../components/include")
}

impl Fixture {
    /// Compile the functions and the handler with `cc`, and load the functions.
    pub fn build() -> Result<Fixture> {
        let tmp = temp_dir()?;
        let dir = tmp.path();
        let c = dir.join("fixture.c");
        write(&c, FIXTURE_C)?;
        let so = dir.join("libbenchfix.so");
        cc(
            &["-shared", "-fPIC", "-O2", "-o", path_str(&so), path_str(&c)],
            "fixture",
        )?;
        let h = dir.join("handler.c");
        write(&h, HANDLER_C)?;
        let handler = dir.join("handler.o");
        let inc = repo_include();
        cc(
            &[
                "-c",
                "-O2",
                "-fPIC",
                "-I",
                path_str(&inc),
                "-o",
                path_str(&handler),
                path_str(&h),
            ],
            "handler",
        )?;
        let lib = dlopen(&so)?;
        Ok(Fixture {
            _dir: tmp,
            handler,
            so,
            lib,
        })
    }

    /// The address of one of the benchmark functions.
    pub fn sym(&self, name: &str) -> Result<usize> {
        self.lib.sym(name)
    }
}

/// Load a shared object (`RTLD_NOW`).
pub fn dlopen(path: &Path) -> Result<Library> {
    let bad = |reason: &str| FixtureError::Dlopen {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    let p =
        CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| bad("NUL in the path"))?;
    // SAFETY: `p` is a NUL-terminated path of a library this module just built; its
    // constructors are the compiler's.
    let h = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW) };
    if h.is_null() {
        return Err(bad("the loader refused it"));
    }
    Ok(Library(h))
}

/// A fresh directory of its own for each build (a library being loaded is never rewritten).
fn temp_dir() -> Result<TempDir> {
    tempfile::Builder::new()
        .prefix("trapvec-bench-")
        .tempdir()
        .map_err(|source| FixtureError::Io {
            path: std::env::temp_dir(),
            source,
        })
}

/// A shared object with `n` small functions `f0 .. f{n-1}` (`push rbp; mov rbp,rsp; lea eax,[rdi+1];
/// pop rbp; ret`), for batch timings.
pub fn many_functions(n: usize) -> Result<(TempDir, Library)> {
    let tmp = temp_dir()?;
    let dir = tmp.path();
    let mut s = String::from("\t.text\n");
    for i in 0..n {
        s.push_str(&format!(
            "\t.globl f{i}\n\t.type f{i},@function\nf{i}:\n\tpush %rbp\n\tmov %rsp, %rbp\n\tlea 1(%rdi), %eax\n\tpop %rbp\n\tret\n\t.size f{i}, .-f{i}\n"
        ));
    }
    let src = dir.join("many.S");
    write(&src, &s)?;
    let so = dir.join("libmany.so");
    cc(
        &["-shared", "-nostdlib", "-o", path_str(&so), path_str(&src)],
        "many functions",
    )?;
    let h = dlopen(&so)?;
    Ok((tmp, h))
}
