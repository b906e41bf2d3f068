//! The speed requirement of the analysis: decoding and building the basic blocks of every
//! function of vmlinux's text (instr-manager's `analyze_function_with`, the planner's own first
//! step, jump tables included) must be fast enough for every boot of an embedded device: timed
//! on one thread and on all, beside `objdump -d` over the same file in the same run (target:
//! ≥ 20× faster than objdump and under 2 s).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use instr_manager::{analyze_function_with, AnalysisOptions};
use thiserror::Error;

use instr_manager::image::CodeImage;

#[derive(Debug, Error)]
pub enum SpeedError {
    #[error("objdump -d {file}: {reason}")]
    Objdump { file: String, reason: String },
    #[error("objdump -d {file}: cannot run objdump")]
    Spawn {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

/// Counts of one full analysis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    pub functions: u64,
    pub bytes: u64,
    pub instructions: u64,
    pub blocks: u64,
    /// Functions whose decoding stopped at an invalid instruction.
    pub undecodable: u64,
}

/// The timings.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Speed {
    pub totals: Totals,
    pub one_thread_s: f64,
    pub threads: usize,
    pub all_threads_s: f64,
    /// Code bytes of the file's executable sections (what objdump decodes).
    pub file_code_bytes: u64,
    /// `None` when objdump was skipped or is missing (then `objdump_note` says why).
    pub objdump_s: Option<f64>,
    pub objdump_note: Option<String>,
}

impl Speed {
    /// objdump time / our one-thread time.
    pub fn speedup(&self) -> Option<f64> {
        self.objdump_s.map(|o| o / self.one_thread_s)
    }

    pub fn render(&self) -> String {
        use std::fmt::Write;
        let t = &self.totals;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "decode + basic blocks of vmlinux: {} functions, {:.1} MiB, {} instructions, {} blocks{}",
            t.functions,
            t.bytes as f64 / (1 << 20) as f64,
            t.instructions,
            t.blocks,
            if t.undecodable > 0 { format!(" ({} partly undecodable)", t.undecodable) } else { String::new() }
        );
        let _ = writeln!(
            s,
            "  trapvec analysis, 1 thread:  {:.3} s (target < 2 s)",
            self.one_thread_s
        );
        let _ = writeln!(
            s,
            "  trapvec analysis, {} threads: {:.3} s",
            self.threads, self.all_threads_s
        );
        match (self.objdump_s, &self.objdump_note) {
            (Some(o), _) => {
                let _ = writeln!(
                    s,
                    "  objdump -d of the same file ({:.1} MiB of code): {o:.1} s",
                    self.file_code_bytes as f64 / (1 << 20) as f64
                );
                let _ = writeln!(
                    s,
                    "  speed-up over objdump (1 thread): {:.0}x (target >= 20x)",
                    self.speedup().unwrap_or(0.0)
                );
            }
            (None, Some(n)) => {
                let _ = writeln!(s, "  objdump: {n}");
            }
            (None, None) => {}
        }
        s
    }
}

/// Analyse every function of `img` on `threads` threads.
pub fn analyse_all(img: &CodeImage, threads: usize) -> (Totals, Duration) {
    let threads = threads.max(1);
    let t0 = Instant::now();
    let parts: Vec<Totals> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let read = |a: u64, n: usize| img.read(a, n).map(<[u8]>::to_vec);
                    let opts = AnalysisOptions {
                        read: Some(&read),
                        lenient: true,
                        object_targets: None,
                    };
                    let mut tot = Totals::default();
                    for f in img.functions.iter().skip(t).step_by(threads) {
                        let bytes = img.bytes_of(f);
                        if let Ok(func) = analyze_function_with(&f.name, f.start, bytes, &opts) {
                            tot.instructions += func.insns.len() as u64;
                            tot.blocks += func.blocks.len() as u64;
                            tot.undecodable += u64::from(func.undecodable_from.is_some());
                        }
                        tot.functions += 1;
                        tot.bytes += bytes.len() as u64;
                    }
                    tot
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("an analysis thread panicked"))
            .collect()
    });
    let elapsed = t0.elapsed();
    let mut tot = Totals::default();
    for p in parts {
        tot.functions += p.functions;
        tot.bytes += p.bytes;
        tot.instructions += p.instructions;
        tot.blocks += p.blocks;
        tot.undecodable += p.undecodable;
    }
    (tot, elapsed)
}

/// Time `objdump -d file > /dev/null`.
pub fn objdump(file: &Path) -> Result<Duration, SpeedError> {
    let err = |reason: String| SpeedError::Objdump {
        file: file.display().to_string(),
        reason,
    };
    let t0 = Instant::now();
    let status = Command::new("objdump")
        .arg("-d")
        .arg(file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .status()
        .map_err(|source| SpeedError::Spawn {
            file: file.display().to_string(),
            source,
        })?;
    if !status.success() {
        return Err(err(format!("exited with {status}")));
    }
    Ok(t0.elapsed())
}

/// The whole measurement: our analysis on one thread, on `threads`, and objdump when asked.
pub fn measure(
    img: &CodeImage,
    file: &Path,
    threads: usize,
    with_objdump: bool,
) -> Result<Speed, SpeedError> {
    // Warm the caches once (the page cache already holds the file; this is the allocator).
    let _ = analyse_all(img, threads);
    let (totals, one) = analyse_all(img, 1);
    let (_, all) = analyse_all(img, threads);
    let (objdump_s, objdump_note) = if !with_objdump {
        (None, Some("skipped (--no-objdump)".to_string()))
    } else {
        let bar = crate::report::spinner("objdump -d vmlinux (for the speed comparison)");
        let r = objdump(file);
        bar.finish_and_clear();
        match r {
            Ok(d) => (Some(d.as_secs_f64()), None),
            Err(SpeedError::Objdump { reason, .. }) if reason.contains("No such file") => (
                None,
                Some("objdump is not installed (binutils)".to_string()),
            ),
            Err(e) => return Err(e),
        }
    };
    Ok(Speed {
        totals,
        one_thread_s: one.as_secs_f64(),
        threads,
        all_threads_s: all.as_secs_f64(),
        file_code_bytes: img.code_bytes() as u64,
        objdump_s,
        objdump_note,
    })
}
