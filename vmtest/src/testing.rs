//! What tests that boot guests share: whether this machine can boot one ([`can_boot`]), where
//! the repository is ([`repo_root`]), running a scenario through the `vmtest` binary
//! ([`Scenario`]) and reading the `KEY=value` lines it prints ([`Run`]).
//!
//! A test that cannot boot a guest here (no QEMU, no Debian cloud kernel with its headers and
//! modules, no busybox) says why and passes vacuously; with `CI=true` that is a failure instead,
//! so that CI never goes green without having booted anything. Everything here panics on
//! failure: it is for tests, where a panic with the reason is the report.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::host;

/// What to do about the missing pieces, appended to every skip and CI failure.
pub const INSTALL_HINT: &str = "run .ci/install-deps";

/// Whether a test that boots a guest should go on: `true` when it can; otherwise `false` after
/// printing `skipping <what>: <reasons>`, or a panic with the reasons when `CI=true`.
///
/// `what` names the test's kind in the message, e.g. `"VM test"` or `"kernel scenario"`.
pub fn can_boot(what: &str) -> bool {
    decide(what, &missing_for_boot())
}

/// [`boot_verdict`] acted on: true to run, false (printed) to skip, a panic under `CI=true`.
fn decide(what: &str, missing: &[String]) -> bool {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    match boot_verdict(what, missing, ci) {
        BootVerdict::Run => true,
        BootVerdict::Skip(why) => {
            eprintln!("{why}");
            false
        }
        BootVerdict::Fail(why) => panic!("{why}"),
    }
}

/// [`can_boot`] for a test that boots a given kernel series (`"6.12"`), whatever
/// [`host::GUEST_KERNEL_ENV`] says: with `CI=true` a missing kernel is a failure.
pub fn can_boot_kernel(what: &str, series: &str) -> bool {
    let mut missing = missing_for_boot();
    if let Err(e) = host::KernelInstall::choose(series) {
        missing.push(e.to_string());
    }
    decide(what, &missing)
}

/// Why this machine cannot boot a guest, one reason per missing piece (QEMU, the guest kernel
/// with its headers and modules, busybox); empty when it can.
pub fn missing_for_boot() -> Vec<String> {
    let mut missing = Vec::new();
    if let Err(e) = host::find_program("qemu-system-x86_64", "install qemu-system-x86") {
        missing.push(e.to_string());
    }
    if let Err(e) = host::KernelInstall::newest() {
        missing.push(e.to_string());
    }
    if let Err(e) = host::find_program("busybox", "install busybox-static") {
        missing.push(e.to_string());
    }
    missing
}

/// What [`can_boot`] decides, with the message it prints or panics with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootVerdict {
    /// Nothing is missing.
    Run,
    /// Something is missing and this is not CI: the test passes vacuously.
    Skip(String),
    /// Something is missing and `CI=true`: the test fails.
    Fail(String),
}

/// The decision behind [`can_boot`] for the `missing` pieces, on CI or not.
pub fn boot_verdict(what: &str, missing: &[String], ci: bool) -> BootVerdict {
    if missing.is_empty() {
        return BootVerdict::Run;
    }
    let why = missing.join("; ");
    if ci {
        BootVerdict::Fail(format!(
            "CI=true and the {what}s cannot run: {why} ({INSTALL_HINT})"
        ))
    } else {
        BootVerdict::Skip(format!("skipping {what}: {why} ({INSTALL_HINT})"))
    }
}

/// The workspace root that this crate was built from (the parent of `vmtest/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("vmtest/ lies in the workspace")
        .to_owned()
}

/// `cargo build --release ARGS --message-format=json` in the workspace: its messages, parsed.
/// Panics with cargo's stderr when the build fails.
fn cargo_build_release(args: &[&str]) -> Vec<serde_json::Value> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--release"])
        .args(args)
        .arg("--message-format=json")
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo build --release {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .collect()
}

/// Build the release trapd and return its path (from cargo's compiler-artifact message), for
/// the tests that run it in the guest.
pub fn build_trapd() -> PathBuf {
    cargo_build_release(&["-p", "trapd", "--bin", "trapd"])
        .iter()
        // The crate's library is named trapd too: the binary is the artifact with an executable.
        .filter(|m| m["target"]["name"] == "trapd")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo names the trapd executable")
}

/// Build the release LD_PRELOAD agent and return the path of `libtrapvec_agent.so`, for the
/// tests that run `trapctl cover --process` in the guest (trapctl finds it through
/// `$TRAPVEC_AGENT`).
pub fn build_agent() -> PathBuf {
    cargo_build_release(&["-p", "trapvec-agent"])
        .iter()
        .filter_map(|m| m["filenames"].as_array())
        .flatten()
        .filter_map(|f| f.as_str())
        .find(|f| f.ends_with("/libtrapvec_agent.so"))
        .map(PathBuf::from)
        .expect("cargo names libtrapvec_agent.so")
}

/// Builds `tvraw` into `dir`: the scenarios' raw-request helper
/// (`vmtest/tests/fixtures/tvraw.c`), static, against `kmod/trapvec_abi.h`, so that a scenario can
/// send the module requests trapctl never would. Returns its path.
pub fn tvraw(dir: &Path) -> PathBuf {
    let out = dir.join("tvraw");
    let root = repo_root();
    let cc = Command::new("cc")
        .args(["-static", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("kmod"))
        .arg("-o")
        .arg(&out)
        .arg(root.join("vmtest/tests/fixtures/tvraw.c"))
        .output()
        .expect("running cc");
    assert!(
        cc.status.success(),
        "cc tvraw.c: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    out
}

/// A helper kernel module of the tests, `vmtest/kmods/<dir>/<name>.ko`, built against the guest
/// kernel ([`guest_module_for`] the kernel [`host::GUEST_KERNEL_ENV`] names). Panics with the
/// reason.
pub fn guest_module(dir: &str, name: &str) -> PathBuf {
    guest_module_for(&host::guest_kernel(), dir, name)
}

/// [`guest_module`] built against the kernel `kernel` (a series such as `"6.12"`, or a vmlinuz
/// path), for a test that boots that kernel with [`Scenario::kernel`]: built under the build
/// lock and copied, before the lock is let go, to `target/vmtest/kmods/<version>/`, so that a
/// test of the other kernel running beside it (both tests of one binary run in parallel) cannot
/// overwrite the file this test packs. Panics with the reason.
pub fn guest_module_for(kernel: &str, dir: &str, name: &str) -> PathBuf {
    let kernel = host::KernelInstall::choose(kernel).unwrap_or_else(|e| panic!("{e}"));
    let builder =
        crate::build::Builder::new(&repo_root(), &kernel).unwrap_or_else(|e| panic!("{e}"));
    let _lock = builder.lock().unwrap_or_else(|e| panic!("{e}"));
    let built = builder
        .external_module(&repo_root().join("vmtest/kmods").join(dir), name)
        .unwrap_or_else(|e| panic!("{e} ({INSTALL_HINT})"));
    let out = repo_root()
        .join("target/vmtest/kmods")
        .join(&kernel.version);
    crate::build::copy_into(&built, &out).unwrap_or_else(|e| panic!("{e}"))
}

/// The benchmark peers of `vmtest/peers/` for `vmtest/scenarios/peers.sh`, built into `dir`
/// ([`crate::build::peers`]): the paths to pass with `--file`. Panics with the reason.
pub fn peers(dir: &Path) -> Vec<PathBuf> {
    let kernel = host::KernelInstall::newest().unwrap_or_else(|e| panic!("{e}"));
    crate::build::peers(&repo_root(), &kernel, dir)
        .unwrap_or_else(|e| panic!("{e} ({INSTALL_HINT})"))
}

/// [`peers`] built against the kernel `kernel` (a series such as `"6.12"`, or a vmlinuz path),
/// for a test that boots it with [`Scenario::kernel`]. Panics with the reason.
pub fn peers_for(kernel: &str, dir: &Path) -> Vec<PathBuf> {
    let kernel = host::KernelInstall::choose(kernel).unwrap_or_else(|e| panic!("{e}"));
    crate::build::peers(&repo_root(), &kernel, dir)
        .unwrap_or_else(|e| panic!("{e} ({INSTALL_HINT})"))
}

/// A `vmtest run` to make: a scenario script, `--file`s to copy into the guest and other
/// arguments of `vmtest run` (`--timeout`, `--no-load`, `--with-module`, …).
#[derive(Debug)]
pub struct Scenario {
    script: PathBuf,
    args: Vec<OsString>,
    /// Holds an inline script's file for as long as the scenario lives.
    _dir: Option<tempfile::TempDir>,
}

impl Scenario {
    /// The script `vmtest/scenarios/<name>` of this repository.
    pub fn named(name: &str) -> Self {
        Self::at(repo_root().join("vmtest/scenarios").join(name))
    }

    /// The script at `path`.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Scenario {
            script: path.into(),
            args: Vec::new(),
            _dir: None,
        }
    }

    /// A script given as text (written to a temporary file).
    pub fn inline(text: &str) -> Self {
        let dir = tempfile::tempdir().expect("creating a directory for the inline scenario");
        let script = dir.path().join("scenario.sh");
        std::fs::write(&script, text)
            .unwrap_or_else(|e| panic!("writing {}: {e}", script.display()));
        Scenario {
            script,
            args: Vec::new(),
            _dir: Some(dir),
        }
    }

    /// Copy `path` into the guest as `/files/<its name>`.
    #[must_use]
    pub fn file(self, path: impl AsRef<Path>) -> Self {
        self.arg("--file").arg(path.as_ref())
    }

    /// Boot this kernel (a series such as `"6.12"`, or a vmlinuz path) instead of the default.
    #[must_use]
    pub fn kernel(self, kernel: &str) -> Self {
        self.args(["--kernel", kernel])
    }

    /// Run the guest's vCPUs in one host thread (`-accel tcg,thread=single`) instead of one
    /// thread each: for a guest that rewrites much text with `text_poke_bp()` (a 6.12 livepatch,
    /// the function tracer). Every livepatch transition rewrites all `cond_resched()` call sites
    /// (static calls, `text_poke_bp()` one site at a time, twice per transition); under
    /// multi-threaded TCG a vCPU now and then executes an int3 the kernel has already taken out
    /// again. 6.12's `kprobe_int3_handler()` does not back such a CPU up, and the guest dies with
    /// `Oops: int3` in whatever function the other vCPU was running. Seen without trapvec loaded
    /// (a livepatch enabled and disabled in a loop died in its 4th cycle, in
    /// `__virt_addr_valid`); with one TCG thread, 12 cycles ran clean. 6.1's backs the CPU up to
    /// the int3, which the vCPU can keep running: memory holds the new instruction, the vCPU's
    /// cached translation the int3, and it loops there with interrupts off, the writer waiting
    /// for it in `text_poke_sync()` (a soft lockup). Seen without trapvec loaded, twice in 500
    /// enable/disable cycles of the function tracer on 1,000 functions (at
    /// `tsc_verify_tsc_adjust+0x0` in the idle loop, at `can_migrate_task+0x0` under a runqueue
    /// lock); `singlestep` on and off in the QEMU monitor, which makes QEMU translate afresh, set
    /// the looping vCPU free. With one TCG thread, 1,452 cycles ran clean.
    #[must_use]
    pub fn single_tcg_thread(self) -> Self {
        self.qemu_arg("-accel").qemu_arg("tcg,thread=single")
    }

    /// Test another trapvec.ko than the tree's: when the environment variable `env` names one,
    /// pack it and name it on the kernel command line as `<param>.module=NAME`, for the scenario
    /// to load instead (how a test shows what it catches on a module built without the fix).
    #[must_use]
    pub fn module_under_test(self, env: &str, param: &str) -> Self {
        let Ok(path) = std::env::var(env) else {
            return self;
        };
        let path = PathBuf::from(path);
        let name = path
            .file_name()
            .expect("a module file name")
            .to_string_lossy()
            .into_owned();
        self.file(&path).append(&format!("{param}.module={name}"))
    }

    /// Give the guest `secs` seconds for boot, scenario and power-off together.
    #[must_use]
    pub fn timeout(self, secs: u64) -> Self {
        self.arg("--timeout").arg(secs.to_string())
    }

    /// Words for the guest kernel's command line, after vmtest's own (`--append`), e.g.
    /// `preempt=full`.
    #[must_use]
    pub fn append(self, words: &str) -> Self {
        self.arg("--append").arg(words)
    }

    /// One more QEMU argument, after vmtest's own (`--qemu-arg`), e.g. `-singlestep`.
    #[must_use]
    pub fn qemu_arg(self, arg: &str) -> Self {
        self.arg(format!("--qemu-arg={arg}"))
    }

    /// One more argument of `vmtest run`.
    #[must_use]
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// More arguments of `vmtest run`.
    #[must_use]
    pub fn args<A: Into<OsString>>(mut self, args: impl IntoIterator<Item = A>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// The command `<vmtest> run --scenario <script> --repo <root> <args>`.
    pub fn command(&self, vmtest: impl AsRef<Path>) -> Command {
        let mut cmd = Command::new(vmtest.as_ref());
        cmd.arg("run")
            .arg("--scenario")
            .arg(&self.script)
            .arg("--repo")
            .arg(repo_root())
            .args(&self.args);
        cmd
    }

    /// Run it with the `vmtest` binary at `vmtest` (in this crate's integration tests,
    /// `env!("CARGO_BIN_EXE_vmtest")`) and print what it said: the test's output is the log.
    ///
    /// A run that times out is run once more, and the second run's result is the test's. The
    /// guests of this machine have been seen to stall under QEMU TCG with no console output
    /// and no kernel report at all, once while the kernel was still booting, before any of our
    /// code ran: a stall that happens twice in a row still fails the test. Each stall is
    /// printed and appended, with the scenario and its console's last lines, to
    /// `target/vmtest/stalls.log`, so that a flaky hang of our own stays on record.
    pub fn run(&self, vmtest: impl AsRef<Path>) -> Run {
        self.run_recording_stalls(
            vmtest.as_ref(),
            &repo_root().join("target/vmtest/stalls.log"),
        )
    }

    /// [`Scenario::run`], with its stalls appended to `log`.
    fn run_recording_stalls(&self, vmtest: &Path, log: &Path) -> Run {
        let run = self.run_once(vmtest);
        if run.status != Some(crate::runner::EXIT_TIMEOUT) {
            return run;
        }
        let tail: Vec<&str> = run
            .stderr
            .lines()
            .filter(|l| l.starts_with("  | ") || l.starts_with("  @ "))
            .collect();
        let record = format!(
            "{} timed out (unix time {}); its console's last lines and its vCPUs:\n{}\n",
            self.script.display(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            tail.join("\n")
        );
        eprintln!("vmtest STALL: {record}vmtest: running it once more");
        println!("vmtest STALL: {record}vmtest: running it once more");
        let appended = log
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| {
                use std::io::Write;
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)?
                    .write_all(record.as_bytes())
            });
        if let Err(e) = appended {
            eprintln!("vmtest: recording the stall in {}: {e}", log.display());
        }
        self.run_once(vmtest)
    }

    /// [`Scenario::run`] without the second boot: for a test whose scenario is meant to time
    /// out.
    pub fn run_once(&self, vmtest: impl AsRef<Path>) -> Run {
        let vmtest = vmtest.as_ref();
        let mut cmd = self.command(vmtest);
        log::debug!("running {cmd:?}");
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
        let run = Run {
            status: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        println!("--- vmtest stdout ---\n{}", run.stdout);
        println!("--- vmtest stderr ---\n{}", run.stderr);
        run
    }
}

/// Allocation kinds (mem.c's names) a live splice holds; each is back at its start count once
/// every splice is removed ("block" too, once a QUIESCE has reclaimed the freed blocks).
pub const LIVE_KINDS: [&str; 4] = ["entry", "patch", "alias", "pending"];

/// What a `vmtest run` produced: its exit status, the guest console (stdout) and vmtest's
/// own report (stderr).
#[derive(Debug, Clone)]
pub struct Run {
    /// `vmtest`'s exit status (the scenario's, or [`crate::runner::EXIT_TIMEOUT`], …).
    pub status: Option<i32>,
    /// The guest's console, with the scenario's output.
    pub stdout: String,
    /// vmtest's summary and build output.
    pub stderr: String,
}

impl Run {
    /// The value of the first `KEY=value` line (console carriage returns removed).
    pub fn value(&self, key: &str) -> Option<&str> {
        self.stdout
            .lines()
            .map(|l| l.trim_end_matches('\r'))
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
    }

    /// [`Run::value`], which must be there.
    pub fn expect(&self, key: &str) -> &str {
        self.value(key)
            .unwrap_or_else(|| panic!("the scenario printed no {key}=...; see its output above"))
    }

    /// [`Run::expect`]'s first word as a number.
    pub fn number(&self, key: &str) -> u64 {
        let v = self.expect(key);
        v.split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{key}={v} is not a number"))
    }

    /// The figures of `KEY=k=v k=v ...`, each value a number.
    pub fn pairs(&self, key: &str) -> HashMap<String, u64> {
        self.expect(key)
            .split_whitespace()
            .map(|kv| {
                let (k, v) = kv
                    .split_once('=')
                    .unwrap_or_else(|| panic!("{key}: {kv} is not key=value"));
                let v = v
                    .parse()
                    .unwrap_or_else(|_| panic!("{key}: {k}={v} is not a number"));
                (k.to_owned(), v)
            })
            .collect()
    }

    /// `KEY=` the module's allocation counters (mem.c's lines "<kind> <objects> <bytes>",
    /// joined): kind -> objects.
    pub fn allocations(&self, key: &str) -> HashMap<String, u64> {
        let words: Vec<&str> = self.expect(key).split_whitespace().collect();
        assert_eq!(words.len() % 3, 0, "{key}: not kind/objects/bytes triples");
        words
            .chunks(3)
            .map(|w| {
                let objects = w[1]
                    .parse()
                    .unwrap_or_else(|_| panic!("{key}: {} is not a number", w[1]));
                (w[0].to_owned(), objects)
            })
            .collect()
    }

    /// The text of every line that says `TAG: text` (a command's output the scenario passed
    /// on, one line each), trimmed.
    pub fn tagged(&self, tag: &str) -> Vec<&str> {
        let tag = format!("{tag}: ");
        self.stdout
            .lines()
            .filter_map(|l| l.split_once(tag.as_str()).map(|(_, s)| s.trim()))
            .collect()
    }

    /// What `scenario.sh`'s `count_sample PREFIX` printed holds: for __x64_sys_getppid and
    /// __x64_sys_getsid, ppidloop made its calls, the count splice's hits equal a kprobe's on
    /// the same function, and they are the calls made (others may call it rarely: at most 1%
    /// more).
    pub fn assert_count_sample(&self, prefix: &str) {
        for name in ["getppid", "getsid"] {
            let key = format!("{prefix}_SAMPLE_{name}");
            let v = self.pairs(&key);
            let get = |k: &str| *v.get(k).unwrap_or_else(|| panic!("{key} has no {k}"));
            let (calls, hits, kprobe) = (get("calls"), get("hits"), get("kprobe"));
            assert!(calls > 0, "{name}: ppidloop made its calls");
            assert_eq!(
                hits, kprobe,
                "{name}: the splice's hits equal a kprobe's on the same function"
            );
            assert!(
                hits >= calls && hits <= calls + calls / 100,
                "{name}: {hits} hits for {calls} calls made (others may call it rarely)"
            );
        }
    }

    /// The module's allocations of the kinds a live splice holds ([`LIVE_KINDS`]) are at
    /// `PREFIX_ALLOCS_end` what they were at `PREFIX_ALLOCS_start`.
    pub fn assert_live_allocations_back(&self, prefix: &str) {
        let start = self.allocations(&format!("{prefix}_ALLOCS_start"));
        let end = self.allocations(&format!("{prefix}_ALLOCS_end"));
        for kind in LIVE_KINDS {
            assert_eq!(
                end.get(kind),
                start.get(kind),
                "the module's {kind} allocations are back at their start count"
            );
        }
    }

    /// What `scenario.sh`'s `unload PREFIX` printed holds: the module unloaded with nothing
    /// allocated.
    pub fn assert_unloaded_clean(&self, prefix: &str) {
        assert_eq!(
            self.expect(&format!("{prefix}_RMMOD")),
            "yes",
            "the module unloads"
        );
        let line = self.expect(&format!("{prefix}_UNLOAD_LINE"));
        assert!(
            line.ends_with("unloaded, 0 allocations outstanding"),
            "nothing left at unload: {line}"
        );
    }

    /// The scenario ran to its end with status 0 and the kernel reported no problem.
    pub fn assert_passed(&self) {
        assert_eq!(
            self.status,
            Some(0),
            "vmtest failed; stderr:\n{}",
            self.stderr
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for `vmtest` that times out (124, with a console tail) on its first run and
    /// exits with `then` on its second.
    fn stalling_vmtest(dir: &Path, then: i32) -> PathBuf {
        let bin = dir.join("vmtest");
        let count = dir.join("runs");
        let script = format!(
            "#!/bin/sh\necho x >> {c}\nif [ \"$(wc -l < {c})\" -eq 1 ]; then echo 'vmtest: last console lines:' >&2; echo '  | PEERS_MASS_CANDIDATES n=1000' >&2; exit 124; fi\necho DONE=yes\nexit {then}\n",
            c = count.display()
        );
        std::fs::write(&bin, script).unwrap();
        std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        bin
    }

    #[test]
    fn a_run_that_times_out_is_run_once_more_and_the_stall_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("logs/stalls.log");
        let run = Scenario::inline("exit 0\n")
            .run_recording_stalls(&stalling_vmtest(dir.path(), 0), &log);
        assert_eq!(
            (run.status, run.value("DONE")),
            (Some(0), Some("yes")),
            "the second run's result"
        );
        let recorded = std::fs::read_to_string(&log).unwrap();
        assert!(
            recorded.contains("scenario.sh timed out")
                && recorded.contains("  | PEERS_MASS_CANDIDATES n=1000"),
            "{recorded}"
        );
        // A second run that fails is the test's failure; one that times out again, too.
        let dir = tempfile::tempdir().unwrap();
        let run = Scenario::inline("exit 0\n")
            .run_recording_stalls(&stalling_vmtest(dir.path(), 124), &log);
        assert_eq!(run.status, Some(124));
        assert_eq!(
            std::fs::read_to_string(&log)
                .unwrap()
                .matches("timed out")
                .count(),
            2
        );
    }

    fn run_with(stdout: &str) -> Run {
        Run {
            status: Some(0),
            stdout: stdout.to_owned(),
            stderr: String::new(),
        }
    }

    #[test]
    fn nothing_missing_means_run_on_ci_and_off() {
        assert_eq!(boot_verdict("VM test", &[], false), BootVerdict::Run);
        assert_eq!(boot_verdict("VM test", &[], true), BootVerdict::Run);
    }

    #[test]
    fn missing_pieces_skip_with_every_reason_off_ci() {
        let missing = ["qemu is not installed".to_owned(), "no kernel".to_owned()];
        assert_eq!(
            boot_verdict("kernel scenario", &missing, false),
            BootVerdict::Skip(
                "skipping kernel scenario: qemu is not installed; no kernel (run .ci/install-deps)"
                    .into()
            )
        );
    }

    #[test]
    fn missing_pieces_fail_with_every_reason_on_ci() {
        let missing = ["busybox is not installed".to_owned()];
        assert_eq!(
            boot_verdict("VM test", &missing, true),
            BootVerdict::Fail(
                "CI=true and the VM tests cannot run: busybox is not installed (run .ci/install-deps)".into()
            )
        );
    }

    #[test]
    fn repo_root_holds_the_workspace_and_this_crate() {
        let root = repo_root();
        assert!(root.join("Cargo.toml").is_file(), "{}", root.display());
        assert!(
            root.join("vmtest/src/testing.rs").is_file(),
            "{}",
            root.display()
        );
    }

    #[test]
    fn value_is_the_first_key_line_without_console_carriage_returns() {
        let run = run_with("boot noise\r\nMSS=948\r\nMSS_AFTER=32741\nMSS=1\n");
        assert_eq!(run.value("MSS"), Some("948"));
        assert_eq!(run.value("MSS_AFTER"), Some("32741"));
        assert_eq!(
            run.value("MS"),
            None,
            "a key is matched whole, up to its `=`"
        );
        assert_eq!(run.value("boot noise"), None);
    }

    #[test]
    fn number_reads_the_first_word() {
        let run = run_with("BENCH_NS=1234 ns per hit\nEMPTY=\n");
        assert_eq!(run.number("BENCH_NS"), 1234);
        assert!(std::panic::catch_unwind(|| run.number("EMPTY")).is_err());
        assert!(std::panic::catch_unwind(|| run.expect("ABSENT")).is_err());
    }

    #[test]
    fn command_passes_script_repo_files_and_arguments_in_order() {
        let scenario = Scenario::inline("exit 0\n")
            .file("/tmp/data")
            .timeout(40)
            .arg("--no-load");
        let cmd = scenario.command("/bin/vmtest");
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(cmd.get_program(), "/bin/vmtest");
        assert_eq!(args[..2], ["run", "--scenario"]);
        assert_eq!(
            std::fs::read_to_string(&args[2]).unwrap(),
            "exit 0\n",
            "the inline script is on disk"
        );
        let root = repo_root().to_string_lossy().into_owned();
        assert_eq!(
            args[3..],
            [
                "--repo",
                &root,
                "--file",
                "/tmp/data",
                "--timeout",
                "40",
                "--no-load"
            ]
        );
    }

    #[test]
    fn named_scenario_is_under_vmtest_scenarios() {
        let cmd = Scenario::named("kernel_mss.sh").command("vmtest");
        let script = PathBuf::from(cmd.get_args().nth(2).unwrap());
        assert_eq!(script, repo_root().join("vmtest/scenarios/kernel_mss.sh"));
        assert!(script.is_file());
    }
}
