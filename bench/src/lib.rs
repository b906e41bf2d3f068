//! bench: jmp-vs-trap benchmarking and kernel-code analysis, the trap-based-modification paper's
//! Table 1, Fig. 4 and Fig. 5 redone on today's hardware and kernel with trapvec's real planner.
//!
//! | module | owns |
//! |---|---|
//! | [`vmlinux`] | extracting vmlinux from a vmlinuz (every compression extract-vmlinux tries) |
//! | [`timing`] | rdtsc measurement, pinning, medians |
//! | [`fixtures`] | the C code the process benchmarks splice, compiled at run time |
//!
//! It measures and analyses; it never changes the host's kernel. Process benchmarks splice only
//! code of the benchmark process itself; kernel rows run in a VM through `vmtest`.

pub mod batch;
pub mod cost;
pub mod coverage;
pub mod fixtures;
pub mod groups;
pub mod image;
pub mod kernel;
pub mod plots;
pub mod report;
pub mod sets;
pub mod sizes;
pub mod speed;
pub mod timing;
pub mod uprobe;
pub mod vmcost;
pub mod vmlinux;
