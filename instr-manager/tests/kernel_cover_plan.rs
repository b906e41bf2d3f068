//! Host-side reproduction of `trapctl cover` on the kernel's TCP group (issue 27): the real
//! vmlinux's text and kallsyms in a [`FakeKernel`], its basic blocks found as `trapctl cover`
//! finds them ([`kernel_blocks`]), and one best-effort batch of count splices at every block's
//! site, applied as the kernel cover path applies it (a spec of address points with the
//! command's owner, [`ops::apply`] with `best_effort`). Ignored: it needs a vmlinux and its
//! kallsyms, named by
//! - `TRAPVEC_VMLINUX`: the ELF (`bench`'s extractor, or `lz4 -dc` of a Debian 6.1 bzImage's
//!   payload);
//! - `TRAPVEC_KALLSYMS`: its symbols as `/proc/kallsyms` lists them (the guest's, or
//!   `kallsyms-finder` of vmlinux-to-elf on the ELF: addresses without KASLR).
//!
//! `TRAPVEC_PLAN_ROUNDS` (default 1): how many times the batch is planned and applied, each on
//! a fresh splicer (for `perf record`); `TRAPVEC_PLAN_OUT`: a file to write every request's
//! plan or refusal to (`plan_each`, in order), to compare planners.
//!
//! Each round times what `trapctl cover`'s `arm_ms` covers on its direct route (trapctl's
//! `cmd/cover/kernel.rs`): the spec file read and parsed ([`Spec::from_path`], in
//! `ops::execute`), the apply, and the state saved ([`StateLog::save`], `Kernel::save` in
//! `commit_or_undo`), printed as `arm_ms` with its parts: `spec_read_ms`, `apply_ms` (of it the
//! batch's own `plan_ms` with `check_ms`, `build_ms`, `commit_ms`, and `apply_rest_ms`, the
//! rest), `save_ms`. The state log is one that continues the snapshot (a module used before:
//! the save works out the change line, finds it larger than the snapshot and compacts), or with
//! `TRAPVEC_STATE_FRESH=1` none (a module just loaded: the save compacts at once). With
//! `TRAPVEC_WHOLE_ROWS=1` the apply reports a whole row per splice, as before `trapctl cover`
//! asked for a `brief` one; `reply_ms` and `reply_bytes` are the report serialized (by trapd)
//! and parsed back (by trapctl), as it goes through trapd. The snapshot
//! is handed to a closure that copies it, as `put_state` copies it to the module;
//! `TRAPVEC_STATE_OUT`: a file to write the first round's snapshot to, to compare savers.
//!
//! ```text
//! TRAPVEC_VMLINUX=/tmp/kc/vmlinux TRAPVEC_KALLSYMS=/tmp/kc/ks.out \
//!   cargo test --release -p instr-manager --test kernel_cover_plan -- --ignored --nocapture
//! ```

use std::io::Write;
use std::time::Instant;

use instr_manager::cover::kernel_blocks;
use instr_manager::glob::{matching_functions, FunctionGlob};
use instr_manager::owner::Owner;
use instr_manager::plan::Mechanism;
use instr_manager::splicer::state_log::StateLog;
use instr_manager::splicer::Splicer;
use instr_manager::{ops, Action, Spec, SpliceRequest};
use object::{Object, ObjectSection};
use trapvec::fake::FakeKernel;
use trapvec::Target;

/// The globs of the issue's `trapctl cover` run.
const TCP_GROUP: [&str; 9] = [
    "tcp_*",
    "__tcp_*",
    "tcp4_*",
    "tcp6_*",
    "tcpv4_*",
    "tcpv6_*",
    "bictcp_*",
    "cubictcp_*",
    "do_tcp_*",
];

/// Bytes around each function loaded besides its own: the gaps the batch's reads of
/// neighbouring functions span ([`trapvec::target::READ_GAP_MAX`]) and reads just past an end.
const MARGIN: u64 = trapvec::target::READ_GAP_MAX + 64;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "needs a vmlinux and its kallsyms (TRAPVEC_VMLINUX, TRAPVEC_KALLSYMS)"]
fn kernel_cover_plan_of_the_tcp_group() {
    let vmlinux = std::fs::read(std::env::var("TRAPVEC_VMLINUX").expect("TRAPVEC_VMLINUX"))
        .expect("reading the vmlinux");
    let kallsyms =
        std::fs::read_to_string(std::env::var("TRAPVEC_KALLSYMS").expect("TRAPVEC_KALLSYMS"))
            .expect("reading the kallsyms");
    let rounds: usize = std::env::var("TRAPVEC_PLAN_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let symbols = trapvec::kernel::kallsyms::parse(&kallsyms).expect("parsing the kallsyms");
    let kernel = FakeKernel::with_only_symbols(symbols);
    let elf = object::File::parse(&*vmlinux).expect("parsing the vmlinux");
    let text = elf.section_by_name(".text").expect(".text");
    let (text_lo, data) = (text.address(), text.data().expect(".text's bytes"));
    let text_hi = text_lo + data.len() as u64;

    let globs: Vec<FunctionGlob> = TCP_GROUP
        .iter()
        .map(|g| FunctionGlob::new(g).expect("a glob"))
        .collect();
    let funcs = matching_functions(kernel.symbols(), &globs);
    {
        let mut st = kernel.state();
        for f in &funcs {
            let extent = kernel.symbols().function_extent(f);
            let lo = f.addr.saturating_sub(MARGIN).max(text_lo);
            let hi = (f.addr + extent + MARGIN).min(text_hi);
            if lo >= hi {
                // Init text, outside .text: the kernel freed it (its blocks are refused unread).
                continue;
            }
            let at = |a: u64| usize::try_from(a - text_lo).expect("inside .text");
            for (a, &b) in (lo..hi).zip(&data[at(lo)..at(hi)]) {
                st.memory.insert(a, b);
            }
        }
    }
    let t = Instant::now();
    let read = |a: u64, n: usize| kernel.read_code(a, n).ok();
    let blocks = kernel_blocks(&funcs, kernel.symbols(), &read, true);
    let decode_ms = t.elapsed().as_secs_f64() * 1000.0;
    let owner = Owner::current("trapctl cover tcp_* (host-side reproduction)").expect("owner");
    let requests: Vec<SpliceRequest> = blocks
        .iter()
        .filter(|b| b.block.site.is_ok())
        .map(|b| {
            let mut r =
                SpliceRequest::new(format!("{:#x}", b.site), Action::Count, Mechanism::Trap);
            r.options.owner = Some(owner.clone());
            r
        })
        .collect();
    // As `trapctl cover` writes it: JSON (the TOML reader took 55 ms of the arm).
    let spec_text = ops::expand::spec_json(&requests).expect("spec text");
    let dir =
        std::env::temp_dir().join(format!("trapvec-kernel-cover-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let spec_path = dir.join("cover.json");
    std::fs::write(&spec_path, &spec_text).expect("writing the spec");
    let fresh = std::env::var("TRAPVEC_STATE_FRESH").is_ok_and(|v| v == "1");
    let rows = match std::env::var("TRAPVEC_WHOLE_ROWS").is_ok_and(|v| v == "1") {
        true => ops::Rows::Whole,
        false => ops::Rows::Brief,
    };
    println!(
        "KERNEL_COVER_PLAN functions={} blocks={} requests={} decode_ms={decode_ms:.1}",
        funcs.len(),
        blocks.len(),
        requests.len()
    );

    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1000.0;
    let (mut plan, mut check, mut apply) = (Vec::new(), Vec::new(), Vec::new());
    let (mut arm, mut rest, mut save) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // Every round on the machine as it was: the text unpatched, nothing live.
        let k = kernel.clone();
        let reads_before = k.state().reads.len();
        let log_path = dir.join(format!("state-{round}.log"));
        let (mut sp, mut log, _) = StateLog::load(&log_path, k.clone(), &[]).expect("the log");
        if !fresh {
            log.save(&mut sp, |_, _| Ok(()))
                .expect("the empty state saved");
        }
        let mut blob = Vec::new();
        let t_arm = Instant::now();
        let t = Instant::now();
        let spec = Spec::from_path(&spec_path).expect("the spec");
        let spec_read_ms = ms(t);
        let t = Instant::now();
        let (report, made) = ops::apply_as(&mut sp, &spec, true, rows).expect("the batch");
        let apply_ms = ms(t);
        let t = Instant::now();
        let saved = log
            .save(&mut sp, |_, bytes| {
                blob = bytes.to_vec();
                Ok(())
            })
            .expect("the state saved");
        let save_ms = ms(t);
        let arm_ms = ms(t_arm);
        // Through trapd the report is the reply: serialized by trapd, parsed by trapctl.
        let t = Instant::now();
        let reply = serde_json::to_vec(&report).expect("the reply");
        let back: ops::ApplyReport = serde_json::from_slice(&reply).expect("the reply read");
        let reply_ms = ms(t);
        assert_eq!(back.spliced.len(), report.spliced.len());
        assert_eq!(back.placed.len(), report.placed.len());
        let timings = report.timings.expect("timings");
        let apply_rest_ms = apply_ms - timings.plan_ms - timings.build_ms - timings.commit_ms;
        let reads = k.state().reads.len() - reads_before;
        if round == 0 {
            if let Ok(out) = std::env::var("TRAPVEC_STATE_OUT") {
                std::fs::write(out, &blob).expect("writing the snapshot");
            }
            let mut by_len = std::collections::BTreeMap::<usize, usize>::new();
            for &(_, n) in &k.state().reads[reads_before..] {
                *by_len.entry(n).or_default() += 1;
            }
            let mut by_len: Vec<_> = by_len.into_iter().collect();
            by_len.sort_by_key(|&(_, c)| std::cmp::Reverse(c));
            println!(
                "KERNEL_COVER_PLAN reads by length (len, count): {:?}",
                &by_len[..by_len.len().min(6)]
            );
        }
        println!(
            "KERNEL_COVER_PLAN round={round} spliced={} refused={} arm_ms={arm_ms:.1} spec_read_ms={spec_read_ms:.1} apply_ms={apply_ms:.1} plan_ms={:.1} check_ms={:.1} build_ms={:.1} commit_ms={:.1} apply_rest_ms={apply_rest_ms:.1} save_ms={save_ms:.1} ({saved:?}, snapshot {} bytes) reads={reads} reply_ms={reply_ms:.1} reply_bytes={}",
            report.spliced.len() + report.placed.len(),
            report.refused.len(),
            timings.plan_ms,
            timings.check_ms,
            timings.build_ms,
            timings.commit_ms,
            blob.len(),
            reply.len()
        );
        plan.push(timings.plan_ms);
        check.push(timings.check_ms);
        apply.push(apply_ms);
        arm.push(arm_ms);
        rest.push(apply_rest_ms);
        save.push(save_ms);
        ops::undo(&mut sp, &made).expect("undo");
        assert!(
            k.state().patched.is_empty(),
            "the batch undone leaves the text as it was"
        );
    }
    println!(
        "KERNEL_COVER_PLAN medians of {rounds}: arm_ms={:.1} apply_ms={:.1} plan_ms={:.1} check_ms={:.1} apply_rest_ms={:.1} save_ms={:.1} per_request_us={:.1}",
        median(&mut arm),
        median(&mut apply),
        median(&mut plan),
        median(&mut check),
        median(&mut rest),
        median(&mut save),
        median(&mut plan) * 1000.0 / requests.len().max(1) as f64
    );
    let _ = std::fs::remove_dir_all(&dir);

    if let Ok(out) = std::env::var("TRAPVEC_PLAN_OUT") {
        let sp = Splicer::new(kernel.clone());
        let mut f = std::io::BufWriter::new(std::fs::File::create(out).expect("the out file"));
        let reads_before = kernel.state().reads.len();
        let t = Instant::now();
        let planned = sp.plan_each(&requests);
        println!(
            "KERNEL_COVER_PLAN plan_each alone: {:.1} ms, {} reads",
            t.elapsed().as_secs_f64() * 1000.0,
            kernel.state().reads.len() - reads_before
        );
        for (r, res) in requests.iter().zip(planned) {
            match res {
                Ok((p, plan)) => writeln!(f, "{} {:?} {plan:?}", r.at, p.site),
                Err(e) => writeln!(f, "{} refused: {}", r.at, trapvec::error_chain(&e)),
            }
            .expect("writing");
        }
    }
}
