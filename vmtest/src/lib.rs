//! vmtest: runs a scenario against a real Linux kernel. It boots the Debian cloud kernel
//! (`linux-image-cloud-amd64`) under `qemu-system-x86_64 -accel tcg` with an initramfs that
//! holds busybox, the trapvec module, `trapctl`, the kernel components, static test helpers and
//! the scenario, streams the serial console, and exits with the scenario's status.
//!
//! It owns building and packing guest artifacts and booting the guest; it never touches the
//! host's running kernel (no insmod, no `uname -r`: the guest kernel is found in /boot).
//!
//! | module | owns |
//! |---|---|
//! | [`host`] | finding the guest kernel, its headers and modules, and host programs |
//! | [`build`] | building the module, components, trapctl and helpers |
//! | [`ldd`] | a program's shared libraries |
//! | [`kmods`] | guest kernel modules from modules.dep |
//! | [`cpio`] | the newc archive format |
//! | [`initramfs`] | the guest file tree, written as gzip'd cpio |
//! | [`init`] | the guest's /init script |
//! | [`console`] | reading the console: exit marker, kernel problems |
//! | [`qemu`] | booting, streaming, timeout |
//! | [`monitor`] | QEMU's monitor: where the vCPUs are at a timeout |
//! | [`runner`] | one `vmtest run` end to end |
//! | [`systemd`] | a guest whose PID 1 is systemd (`--systemd`): systemd, kmod, units, `--tree`s |
//! | [`uprobe`] | where an ELF address lies in its file (a uprobe's offset) |
//! | [`testing`] | what tests that boot guests share: skip or fail without QEMU, running a scenario, its `KEY=value` lines |

pub mod build;
pub mod console;
pub mod cpio;
pub mod host;
pub mod init;
pub mod initramfs;
pub mod kmods;
pub mod ldd;
pub mod monitor;
pub mod qemu;
pub mod runner;
pub mod systemd;
pub mod testing;
pub mod uprobe;
