//! Table 1's kernel rows: the same mechanisms on a kernel point, measured in the VM (QEMU TCG,
//! through `vmtest`) by `scenarios/kernel_cost.sh`: nanoseconds per `getppid()` with
//! `__x64_sys_getppid+5` unpatched, spliced by jmp and by trap (empty handler), and under a
//! kprobe (and a jump-optimised kprobe where the kernel makes one). Emulated time: every row is
//! labelled so, and only the ratios between rows of one guest are reported as results.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The guest scenario.
pub const SCENARIO: &str = include_str!("../scenarios/kernel_cost.sh");

/// One emulated row.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VmRow {
    /// `unpatched`, `jmp_rel32`, `trap`, `kprobe`, `kprobe_quiet`, `kprobe_optimized`.
    pub key: String,
    pub name: String,
    /// Emulated nanoseconds per call.
    pub ns: f64,
}

/// The kernel rows of one guest.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VmCost {
    pub kernel: String,
    pub point: String,
    pub rows: Vec<VmRow>,
    /// What the guest could not measure.
    pub notes: Vec<String>,
}

fn name_of(key: &str) -> &'static str {
    match key {
        "unpatched" => "getppid(), unpatched",
        "jmp_rel32" => "jmp splice hit (call, empty handler)",
        "trap" => "trap splice hit (int 0xf5, call, empty handler)",
        "kprobe" => "kprobe (int3, trace event on, tracing_on=1: a ring-buffer write per hit)",
        "kprobe_quiet" => "kprobe (int3, trace event on, tracing_on=0: no ring-buffer write)",
        "kprobe_optimized" => "kprobe, jump-optimised (trace event on)",
        _ => "other",
    }
}

/// Why the kernel rows could not be measured; each names the line, row or step at fault.
#[derive(Debug, thiserror::Error)]
pub enum VmCostError {
    #[error("bad row line `{line}`")]
    BadRow { line: String },
    #[error("bad time in `{line}`")]
    BadTime { line: String },
    #[error("the guest printed no `{row}` row")]
    MissingRow { row: &'static str },
    #[error("writing the scenario")]
    Scenario(#[source] std::io::Error),
    #[error("running the scenario in the VM")]
    Run(#[source] Box<vmtest::runner::RunError>),
    #[error("{summary}")]
    Failed { summary: String },
}

impl VmCost {
    /// Read the `BENCH-VM-*` lines of a console log.
    pub fn parse(console: &str, kernel: &str) -> Result<VmCost, VmCostError> {
        let mut rows = Vec::new();
        let mut notes = Vec::new();
        for line in console.lines() {
            let line = line.trim_end_matches('\r');
            if let Some(rest) = line.split_once("BENCH-VM-ROW ").map(|(_, r)| r) {
                let mut f = rest.split_whitespace();
                let (Some(key), Some(ns)) = (f.next(), f.next()) else {
                    return Err(VmCostError::BadRow {
                        line: line.to_string(),
                    });
                };
                let ns: f64 = ns.parse().map_err(|_| VmCostError::BadTime {
                    line: line.to_string(),
                })?;
                rows.push(VmRow {
                    key: key.to_string(),
                    name: name_of(key).to_string(),
                    ns,
                });
            } else if let Some(rest) = line.split_once("BENCH-VM-NOTE ").map(|(_, r)| r) {
                notes.push(rest.to_string());
            }
        }
        for need in ["unpatched", "jmp_rel32", "trap", "kprobe", "kprobe_quiet"] {
            if !rows.iter().any(|r| r.key == need) {
                return Err(VmCostError::MissingRow { row: need });
            }
        }
        Ok(VmCost {
            kernel: kernel.to_string(),
            point: "__x64_sys_getppid+5".into(),
            rows,
            notes,
        })
    }

    fn ns(&self, key: &str) -> Option<f64> {
        self.rows.iter().find(|r| r.key == key).map(|r| r.ns)
    }

    /// Emulated overhead over the unpatched call.
    pub fn overhead(&self, key: &str) -> Option<f64> {
        Some(self.ns(key)? - self.ns("unpatched")?)
    }

    /// trap / jmp overhead in the guest.
    pub fn trap_over_jmp(&self) -> Option<f64> {
        Some(self.overhead("trap")? / self.overhead("jmp_rel32")?.max(1e-3))
    }

    /// trap / kprobe overhead in the guest, like with like: the kprobe with tracing off (no
    /// ring-buffer write per hit) against trapvec's empty handler.
    pub fn trap_over_kprobe(&self) -> Option<f64> {
        Some(self.overhead("trap")? / self.overhead("kprobe_quiet")?)
    }

    /// trap / kprobe overhead with the kprobe's event written to the ring buffer on every hit.
    pub fn trap_over_kprobe_tracing(&self) -> Option<f64> {
        Some(self.overhead("trap")? / self.overhead("kprobe")?)
    }

    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = format!(
            "\nkernel rows, {} at {} (EMULATED under QEMU TCG: compare ratios only)\n",
            self.kernel, self.point
        );
        for r in &self.rows {
            let _ = writeln!(s, "  {:<52} {:>9.0} ns emulated", r.name, r.ns);
        }
        for n in &self.notes {
            let _ = writeln!(s, "  note: {n}");
        }
        if let Some(r) = self.trap_over_jmp() {
            let _ = writeln!(s, "  trap / jmp overhead in the guest:    {r:.1}x");
        }
        if let Some(r) = self.trap_over_kprobe() {
            let _ = writeln!(
                s,
                "  trap / kprobe overhead in the guest: {r:.2}x (kprobe with tracing_on=0)"
            );
        }
        if let Some(r) = self.trap_over_kprobe_tracing() {
            let _ = writeln!(
                s,
                "  trap / kprobe overhead in the guest: {r:.2}x (kprobe with tracing_on=1, a ring-buffer write per hit)"
            );
        }
        s
    }
}

/// Boot the newest cloud kernel (or `kernel`) with the module and run the scenario.
pub fn measure(repo: &Path, kernel: Option<PathBuf>) -> Result<VmCost, VmCostError> {
    let dir = tempfile::tempdir().map_err(VmCostError::Scenario)?;
    let scenario = dir.path().join("kernel_cost.sh");
    std::fs::write(&scenario, SCENARIO).map_err(VmCostError::Scenario)?;
    let opts = vmtest::runner::RunOptions {
        repo: repo.to_path_buf(),
        scenario,
        files: Vec::new(),
        timeout: Duration::from_secs(900),
        load_module: true,
        kernel,
        keep_initramfs: None,
        append: Vec::new(),
        qemu_args: Vec::new(),
        extra_modules: Vec::new(),
        memory_mib: 512,
    };
    let mut console = Vec::new();
    let report =
        vmtest::runner::run(&opts, &mut console).map_err(|e| VmCostError::Run(Box::new(e)))?;
    if report.exit_code() != 0 {
        return Err(VmCostError::Failed {
            summary: report.summary(opts.timeout),
        });
    }
    VmCost::parse(&String::from_utf8_lossy(&console), &report.kernel_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_notes_are_read_from_a_console_with_noise() {
        let console =
            "[ 2.1] trapvec: loaded\r\nBENCH-VM-ROW unpatched 900\r\nBENCH-VM-ROW jmp_rel32 1000\n\
            BENCH-VM-ROW trap 3900\nBENCH-VM-ROW kprobe 6900\nBENCH-VM-ROW kprobe_quiet 4900\n\
            BENCH-VM-NOTE the kprobe was not jump-optimised\n";
        let v = VmCost::parse(console, "6.1.0").unwrap();
        assert_eq!(v.rows.len(), 5);
        assert_eq!(v.overhead("trap"), Some(3000.0));
        assert_eq!(v.trap_over_jmp(), Some(30.0));
        // Like with like: the kprobe that writes no event (4000 ns over), not the one that does.
        assert_eq!(v.trap_over_kprobe(), Some(0.75));
        assert_eq!(v.trap_over_kprobe_tracing(), Some(0.5));
        assert!(v.render().contains("0.75x (kprobe with tracing_on=0)"));
        assert_eq!(v.notes, ["the kprobe was not jump-optimised"]);
        assert!(v.render().contains("EMULATED"));
    }

    #[test]
    fn the_kprobe_without_its_ring_buffer_write_is_a_required_row() {
        let console = "BENCH-VM-ROW unpatched 900\nBENCH-VM-ROW jmp_rel32 1000\n\
            BENCH-VM-ROW trap 3900\nBENCH-VM-ROW kprobe 6900\n";
        let err = VmCost::parse(console, "6.1.0").unwrap_err();
        assert_eq!(err.to_string(), "the guest printed no `kprobe_quiet` row");
    }

    #[test]
    fn a_missing_row_is_an_error_naming_it() {
        let err =
            VmCost::parse("BENCH-VM-ROW unpatched 1\nBENCH-VM-ROW trap 2\n", "k").unwrap_err();
        assert!(
            matches!(err, VmCostError::MissingRow { row: "jmp_rel32" }),
            "{err}"
        );
        assert_eq!(err.to_string(), "the guest printed no `jmp_rel32` row");
    }
}
