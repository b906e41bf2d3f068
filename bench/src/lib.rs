//! bench: jmp-vs-trap benchmarking and kernel-code analysis, the trap-based-modification paper's
//! Table 1, Fig. 4 and Fig. 5 redone on today's hardware and kernel with trapvec's real planner.
//!
//! | module | owns |
//! |---|---|
//! | [`cost`] | Table 1: cycles per hit of each mechanism on this machine (process backend) |
//! | [`uprobe`] | the uprobe row: a probe through tracefs `uprobe_events`, removed on drop |
//! | [`vmcost`] | Table 1's kernel rows, measured in the VM (emulated) |
//! | [`batch`] | issue 2's batch figure: apply/remove N splices in one batch |
//! | [`peers`] | issue 13: beside BPF fentry, ftrace and livepatch (VM) and Frida (host); the goals |
//! | [`frida`] | the Frida rows: CModule onEnter hits and 1,000-function attach vs trapvec |
//! | [`vmlinux`] | extracting vmlinux from a vmlinuz (every compression extract-vmlinux tries) |
//! | [`kernel`] | the installed kernel: image, kallsyms from the VM (cached), network driver modules |
//! | [`groups`] | the paper's groups of kernel code, by symbol name |
//! | [`sets`] | the sets of functions reported on |
//! | [`sizes`] | Fig. 4: instruction-length histograms |
//! | [`coverage`] | Fig. 5: the planner at every boundary, coverage, expected cost vs distance |
//! | [`speed`] | decode + basic blocks of all of vmlinux, timed beside `objdump -d` |
//! | [`plots`] | the figures as PNG and SVG (plotters) |
//! | [`report`] | the results folder: JSON, CSV, plots, `summary.md`; progress bars |
//! | [`timing`] | rdtsc measurement, pinning, medians |
//! | [`fixtures`] | the C code the process benchmarks splice, compiled at run time |
//!
//! The code images it analyses (vmlinux + kallsyms, relocatables, other ELFs) are
//! [`instr_manager::image`]'s, shared with `trapctl inspect`.
//!
//! It measures and analyses; it never changes the host's kernel. Process benchmarks splice only
//! code of the benchmark process itself; kernel rows run in a VM through `vmtest`.

pub mod batch;
pub mod cost;
pub mod coverage;
pub mod fixtures;
pub mod frida;
pub mod groups;
pub mod kernel;
pub mod livecover;
pub mod peers;
pub mod plots;
pub mod report;
pub mod script;
pub mod sets;
pub mod sizes;
pub mod speed;
pub mod timing;
pub mod uprobe;
pub mod vmcost;
pub mod vmlinux;
