//! The Rust mirror of the ioctl interface (`trapvec::abi`) has the layout and the numbers of
//! `kmod/trapvec_abi.h`, as a C compiler sees them.
//!
//! The test writes a C program that includes the header and prints, for every field listed
//! below, its offset and size, the size of every struct, and every constant; it compiles the
//! program with `cc`, runs it, and compares each line with `offset_of!`/`size_of` on the Rust
//! side. A field listed here but missing in C fails the C compile; a field present in C but not
//! here changes the struct size, which is compared too.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use trapvec::abi::*;

/// Rows `(C struct, field, offset, size)` and sizes `(C struct, size)`.
type RustLayout = (
    Vec<(&'static str, &'static str, u64, u64)>,
    Vec<(&'static str, u64)>,
);

/// One measured item: `("struct trapvec_info.vector", (offset, size))` or `("sizeof struct …", (0, size))`.
type Layout = BTreeMap<String, (u64, u64)>;

/// `(C struct, Rust layout rows)`: every field with its offset and size.
macro_rules! layout {
    ($($ty:ty => $c:literal { $($field:ident),* $(,)? })*) => {{
        let mut rows: Vec<(&'static str, &'static str, u64, u64)> = Vec::new();
        let mut sizes: Vec<(&'static str, u64)> = Vec::new();
        $(
            let value = <$ty>::default();
            $(
                rows.push(($c, stringify!($field), core::mem::offset_of!($ty, $field) as u64,
                           core::mem::size_of_val(&value.$field) as u64));
            )*
            sizes.push(($c, core::mem::size_of::<$ty>() as u64));
        )*
        (rows, sizes)
    }};
}

fn rust_layout() -> RustLayout {
    layout! {
        TrapvecInfo => "trapvec_info" {
            abi_version, vector, entry, old_handler, gate_handler, code_base, code_size, data_base,
            data_size, code_used, data_used, module_base, module_size, live_patches,
            dispatch_entries, unknown_traps, retried_traps,
        }
        TrapvecRead => "trapvec_read" { addr, buf, len, flags }
        TrapvecAlloc => "trapvec_alloc" { kind, pad, size, id, addr }
        TrapvecWrite => "trapvec_write" { id, offset, buf, len, pad }
        TrapvecBlock => "trapvec_block" { id }
        TrapvecPatch => "trapvec_patch" { addr, len, pad, old_bytes, new_bytes }
        TrapvecCheck => "trapvec_check" { addr, len, reason, error, flags, culprit }
        TrapvecCheckMany => "trapvec_check_many" { checks, count, flags }
        TrapvecApply => "trapvec_apply" { patches, count, flags, failed_index, reason, error, pad, found, culprit }
        TrapvecDispatchEntry => "trapvec_dispatch_entry" { site, dest, handler, cookie }
        TrapvecDispatchAdd => "trapvec_dispatch_add" { entries, count, failed_index }
        TrapvecDispatchRemove => "trapvec_dispatch_remove" { sites, count, failed_index }
        TrapvecDispatchReplace => "trapvec_dispatch_replace" { entries, counts, count, failed_index }
        TrapvecHits => "trapvec_hits" { site, hits, missed }
        TrapvecListEntry => "trapvec_list_entry" { site, dest, handler, cookie, hits, missed }
        TrapvecList => "trapvec_list" { entries, capacity, count, start }
        TrapvecQuiesce => "trapvec_quiesce" { reclaimed_blocks, reclaimed_bytes }
        TrapvecState => "trapvec_state" { buf, len, size, generation }
        TrapvecReturnAdd => "trapvec_return_add" { handler, cookie, maxactive, clock, slot, generation, entry, entry_cookie }
        TrapvecReturnRemove => "trapvec_return_remove" { slot, generation, busy }
        TrapvecReturnStats => "trapvec_return_stats" { slot, generation, returns, missed, active, clock, pad, sum, max, buckets }
        TrapvecKeyAdd => "trapvec_key_add" { by, slot, generation, pad, entry, entry_cookie }
        TrapvecKeyRemove => "trapvec_key_remove" { slot, generation }
        TrapvecKeyEntry => "trapvec_key_entry" { key, count }
        TrapvecKeyStats => "trapvec_key_stats" { slot, generation, entries, capacity, count, by, pad, overflow, hits }
        TrapvecWatch => "trapvec_watch" { flags, pad }
        TrapvecModevent => "trapvec_modevent" { seq, state, timeout_ms, text_base, text_size, name }
        TrapvecModack => "trapvec_modack" { seq, error, pad }
    }
}

/// Every number of the header, by its C name.
fn rust_constants() -> Vec<(&'static str, u64)> {
    vec![
        ("TRAPVEC_ABI_VERSION", u64::from(TRAPVEC_ABI_VERSION)),
        ("TRAPVEC_IOC_MAGIC", u64::from(TRAPVEC_IOC_MAGIC)),
        ("TRAPVEC_PATCH_MAX", TRAPVEC_PATCH_MAX as u64),
        ("TRAPVEC_XFER_MAX", u64::from(TRAPVEC_XFER_MAX)),
        ("TRAPVEC_BATCH_MAX", u64::from(TRAPVEC_BATCH_MAX)),
        ("TRAPVEC_NO_INDEX", u64::from(TRAPVEC_NO_INDEX)),
        ("TRAPVEC_STATE_MAX", u64::from(TRAPVEC_STATE_MAX)),
        (
            "TRAPVEC_CHECK_NO_KPROBE",
            u64::from(TRAPVEC_CHECK_NO_KPROBE),
        ),
        ("TRAPVEC_BLOCK_CODE", u64::from(TRAPVEC_BLOCK_CODE)),
        ("TRAPVEC_BLOCK_DATA", u64::from(TRAPVEC_BLOCK_DATA)),
        ("TRAPVEC_REASON_NONE", u64::from(TRAPVEC_REASON_NONE)),
        (
            "TRAPVEC_REASON_BAD_LENGTH",
            u64::from(TRAPVEC_REASON_BAD_LENGTH),
        ),
        (
            "TRAPVEC_REASON_NOT_TEXT",
            u64::from(TRAPVEC_REASON_NOT_TEXT),
        ),
        (
            "TRAPVEC_REASON_OWN_MODULE",
            u64::from(TRAPVEC_REASON_OWN_MODULE),
        ),
        (
            "TRAPVEC_REASON_ENTRY_TEXT",
            u64::from(TRAPVEC_REASON_ENTRY_TEXT),
        ),
        (
            "TRAPVEC_REASON_NOINSTR_TEXT",
            u64::from(TRAPVEC_REASON_NOINSTR_TEXT),
        ),
        ("TRAPVEC_REASON_THUNK", u64::from(TRAPVEC_REASON_THUNK)),
        (
            "TRAPVEC_REASON_KPROBE_BLACKLIST",
            u64::from(TRAPVEC_REASON_KPROBE_BLACKLIST),
        ),
        ("TRAPVEC_REASON_FTRACE", u64::from(TRAPVEC_REASON_FTRACE)),
        (
            "TRAPVEC_REASON_JUMP_LABEL",
            u64::from(TRAPVEC_REASON_JUMP_LABEL),
        ),
        (
            "TRAPVEC_REASON_STATIC_CALL",
            u64::from(TRAPVEC_REASON_STATIC_CALL),
        ),
        (
            "TRAPVEC_REASON_BUG_ENTRY",
            u64::from(TRAPVEC_REASON_BUG_ENTRY),
        ),
        ("TRAPVEC_REASON_EXTABLE", u64::from(TRAPVEC_REASON_EXTABLE)),
        (
            "TRAPVEC_REASON_NOT_BOUNDARY",
            u64::from(TRAPVEC_REASON_NOT_BOUNDARY),
        ),
        (
            "TRAPVEC_REASON_CROSSES_SYMBOL",
            u64::from(TRAPVEC_REASON_CROSSES_SYMBOL),
        ),
        (
            "TRAPVEC_REASON_KPROBE_REFUSED",
            u64::from(TRAPVEC_REASON_KPROBE_REFUSED),
        ),
        (
            "TRAPVEC_REASON_LIVE_PATCH",
            u64::from(TRAPVEC_REASON_LIVE_PATCH),
        ),
        (
            "TRAPVEC_REASON_MISMATCH",
            u64::from(TRAPVEC_REASON_MISMATCH),
        ),
        (
            "TRAPVEC_REASON_ALTERNATIVE",
            u64::from(TRAPVEC_REASON_ALTERNATIVE),
        ),
        ("TRAPVEC_REASON_KPROBE", u64::from(TRAPVEC_REASON_KPROBE)),
        (
            "TRAPVEC_REASON_CPUIDLE_TEXT",
            u64::from(TRAPVEC_REASON_CPUIDLE_TEXT),
        ),
        (
            "TRAPVEC_REASON_STATIC_CALL_TRAMP",
            u64::from(TRAPVEC_REASON_STATIC_CALL_TRAMP),
        ),
        (
            "TRAPVEC_REASON_KPROBE_SLOT",
            u64::from(TRAPVEC_REASON_KPROBE_SLOT),
        ),
        (
            "TRAPVEC_REASON_BPF_TEXT",
            u64::from(TRAPVEC_REASON_BPF_TEXT),
        ),
        (
            "TRAPVEC_REASON_FTRACE_TRAMPOLINE",
            u64::from(TRAPVEC_REASON_FTRACE_TRAMPOLINE),
        ),
        (
            "TRAPVEC_REASON_MODULE_INIT",
            u64::from(TRAPVEC_REASON_MODULE_INIT),
        ),
        (
            "TRAPVEC_REASON_LOCKDOWN",
            u64::from(TRAPVEC_REASON_LOCKDOWN),
        ),
        (
            "TRAPVEC_REASON_MODULES_DISABLED",
            u64::from(TRAPVEC_REASON_MODULES_DISABLED),
        ),
        (
            "TRAPVEC_REASON_NO_DISPATCH",
            u64::from(TRAPVEC_REASON_NO_DISPATCH),
        ),
        (
            "TRAPVEC_REASON_FOREIGN_TRAP",
            u64::from(TRAPVEC_REASON_FOREIGN_TRAP),
        ),
        (
            "TRAPVEC_REASON_RETURN_IN_WINDOW",
            u64::from(TRAPVEC_REASON_RETURN_IN_WINDOW),
        ),
        (
            "TRAPVEC_REASON_NOT_A_JUMP",
            u64::from(TRAPVEC_REASON_NOT_A_JUMP),
        ),
        (
            "TRAPVEC_REASON_JUMP_TARGET",
            u64::from(TRAPVEC_REASON_JUMP_TARGET),
        ),
        (
            "TRAPVEC_REASON_EXTABLE_FIXUP",
            u64::from(TRAPVEC_REASON_EXTABLE_FIXUP),
        ),
        (
            "TRAPVEC_REASON_DEAD_CPU",
            u64::from(trapvec::abi::TRAPVEC_REASON_DEAD_CPU),
        ),
        (
            "TRAPVEC_REASON_ENDBR",
            u64::from(trapvec::abi::TRAPVEC_REASON_ENDBR),
        ),
        ("TRAPVEC_REASON_MAX", u64::from(TRAPVEC_REASON_MAX)),
        ("TRAPVEC_READ_ORIGINAL", u64::from(TRAPVEC_READ_ORIGINAL)),
        ("TRAPVEC_IOC_INFO", u64::from(TRAPVEC_IOC_INFO)),
        ("TRAPVEC_IOC_READ", u64::from(TRAPVEC_IOC_READ)),
        ("TRAPVEC_IOC_ALLOC", u64::from(TRAPVEC_IOC_ALLOC)),
        ("TRAPVEC_IOC_WRITE", u64::from(TRAPVEC_IOC_WRITE)),
        ("TRAPVEC_IOC_SEAL", u64::from(TRAPVEC_IOC_SEAL)),
        ("TRAPVEC_IOC_FREE", u64::from(TRAPVEC_IOC_FREE)),
        ("TRAPVEC_IOC_CHECK", u64::from(TRAPVEC_IOC_CHECK)),
        (
            "TRAPVEC_IOC_CHECK_MANY",
            u64::from(trapvec::abi::TRAPVEC_IOC_CHECK_MANY),
        ),
        (
            "TRAPVEC_IOC_LIST_HIT",
            u64::from(trapvec::abi::TRAPVEC_IOC_LIST_HIT),
        ),
        ("TRAPVEC_IOC_APPLY", u64::from(TRAPVEC_IOC_APPLY)),
        (
            "TRAPVEC_IOC_DISPATCH_REPLACE",
            u64::from(TRAPVEC_IOC_DISPATCH_REPLACE),
        ),
        (
            "TRAPVEC_IOC_DISPATCH_ADD",
            u64::from(TRAPVEC_IOC_DISPATCH_ADD),
        ),
        (
            "TRAPVEC_IOC_DISPATCH_REMOVE",
            u64::from(TRAPVEC_IOC_DISPATCH_REMOVE),
        ),
        ("TRAPVEC_IOC_HITS", u64::from(TRAPVEC_IOC_HITS)),
        ("TRAPVEC_IOC_LIST", u64::from(TRAPVEC_IOC_LIST)),
        ("TRAPVEC_IOC_QUIESCE", u64::from(TRAPVEC_IOC_QUIESCE)),
        ("TRAPVEC_IOC_STATE_GET", u64::from(TRAPVEC_IOC_STATE_GET)),
        ("TRAPVEC_IOC_STATE_PUT", u64::from(TRAPVEC_IOC_STATE_PUT)),
        ("TRAPVEC_RETURN_SLOTS", u64::from(TRAPVEC_RETURN_SLOTS)),
        (
            "TRAPVEC_RETURN_INSTANCES",
            u64::from(TRAPVEC_RETURN_INSTANCES),
        ),
        ("TRAPVEC_RETURN_BUCKETS", TRAPVEC_RETURN_BUCKETS as u64),
        ("TRAPVEC_CLOCK_NONE", u64::from(TRAPVEC_CLOCK_NONE)),
        ("TRAPVEC_CLOCK_WALL", u64::from(TRAPVEC_CLOCK_WALL)),
        ("TRAPVEC_CLOCK_CPU", u64::from(TRAPVEC_CLOCK_CPU)),
        ("TRAPVEC_IOC_RETURN_ADD", u64::from(TRAPVEC_IOC_RETURN_ADD)),
        (
            "TRAPVEC_IOC_RETURN_REMOVE",
            u64::from(TRAPVEC_IOC_RETURN_REMOVE),
        ),
        (
            "TRAPVEC_IOC_RETURN_STATS",
            u64::from(TRAPVEC_IOC_RETURN_STATS),
        ),
        ("TRAPVEC_KEY_SLOTS", u64::from(TRAPVEC_KEY_SLOTS)),
        ("TRAPVEC_KEY_TABLE", u64::from(TRAPVEC_KEY_TABLE)),
        ("TRAPVEC_KEY_BYTES", TRAPVEC_KEY_BYTES as u64),
        ("TRAPVEC_KEY_PID", u64::from(TRAPVEC_KEY_PID)),
        ("TRAPVEC_KEY_TGID", u64::from(TRAPVEC_KEY_TGID)),
        ("TRAPVEC_KEY_COMM", u64::from(TRAPVEC_KEY_COMM)),
        ("TRAPVEC_KEY_CPU", u64::from(TRAPVEC_KEY_CPU)),
        ("TRAPVEC_IOC_KEY_ADD", u64::from(TRAPVEC_IOC_KEY_ADD)),
        ("TRAPVEC_IOC_KEY_REMOVE", u64::from(TRAPVEC_IOC_KEY_REMOVE)),
        ("TRAPVEC_IOC_KEY_STATS", u64::from(TRAPVEC_IOC_KEY_STATS)),
        ("TRAPVEC_APPLY_DEFERRED", u64::from(TRAPVEC_APPLY_DEFERRED)),
        (
            "TRAPVEC_MODEVENT_COMING",
            u64::from(TRAPVEC_MODEVENT_COMING),
        ),
        ("TRAPVEC_MODEVENT_GOING", u64::from(TRAPVEC_MODEVENT_GOING)),
        ("TRAPVEC_MODNAME_LEN", TRAPVEC_MODNAME_LEN as u64),
        ("TRAPVEC_IOC_WATCH", u64::from(TRAPVEC_IOC_WATCH)),
        ("TRAPVEC_IOC_MODEVENT", u64::from(TRAPVEC_IOC_MODEVENT)),
        ("TRAPVEC_IOC_MODACK", u64::from(TRAPVEC_IOC_MODACK)),
    ]
}

fn header_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../kmod")
}

/// Compile `src` (a C program that includes the header) with `cc`, run it, return its output.
fn run_c(src: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("abi.c");
    let exe = dir.path().join("abi");
    std::fs::write(&c, src).unwrap();
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(header_dir())
        .arg("-o")
        .arg(&exe)
        .arg(&c)
        .output()
        .expect("running cc (the ABI test needs a C compiler)");
    assert!(
        out.status.success(),
        "cc failed on kmod/trapvec_abi.h:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// Compile and run the C side; parse `name offset size` lines.
fn c_layout(
    rows: &[(&str, &str, u64, u64)],
    sizes: &[(&str, u64)],
    consts: &[(&str, u64)],
) -> Layout {
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"trapvec_abi.h\"\nint main(void)\n{\n",
    );
    for (s, f, _, _) in rows {
        writeln!(
            src,
            "\tprintf(\"struct {s}.{f} %zu %zu\\n\", offsetof(struct {s}, {f}), sizeof(((struct {s} *)0)->{f}));"
        )
        .unwrap();
    }
    for (s, _) in sizes {
        writeln!(
            src,
            "\tprintf(\"sizeof struct {s} 0 %zu\\n\", sizeof(struct {s}));"
        )
        .unwrap();
    }
    for (name, _) in consts {
        writeln!(
            src,
            "\tprintf(\"{name} 0 %llu\\n\", (unsigned long long)({name}));"
        )
        .unwrap();
    }
    src.push_str("\treturn 0;\n}\n");

    run_c(&src)
        .lines()
        .map(|l| {
            let mut w = l.rsplitn(3, ' ');
            let size = w.next().unwrap().parse().unwrap();
            let offset = w.next().unwrap().parse().unwrap();
            (w.next().unwrap().to_string(), (offset, size))
        })
        .collect()
}

#[test]
fn rust_ioctl_structs_and_numbers_match_the_c_header() {
    let (rows, sizes) = rust_layout();
    let consts = rust_constants();
    let c = c_layout(&rows, &sizes, &consts);

    let mut rust = Layout::new();
    for (s, f, off, size) in &rows {
        rust.insert(format!("struct {s}.{f}"), (*off, *size));
    }
    for (s, size) in &sizes {
        rust.insert(format!("sizeof struct {s}"), (0, *size));
    }
    for (name, value) in &consts {
        rust.insert((*name).to_string(), (0, *value));
    }
    let mismatches: Vec<String> = rust
        .iter()
        .filter(|(k, v)| c.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: Rust (offset, size|value) {v:?}, C {:?}", c.get(k)))
        .collect();
    assert!(
        mismatches.is_empty(),
        "layout differs from kmod/trapvec_abi.h:\n{}",
        mismatches.join("\n")
    );
    assert_eq!(rust.len(), c.len());
    // Sanity: the comparison covered every struct and constant.
    assert_eq!(sizes.len(), 28);
    assert!(rows.len() > 60);
}

#[test]
fn ioctl_numbers_agree_with_nix_request_code_readwrite() {
    // nix's own _IOWR encoding, independent of abi::iowr.
    let nix =
        |nr: u8, size: usize| -> u64 { nix::request_code_readwrite!(TRAPVEC_IOC_MAGIC, nr, size) };
    assert_eq!(
        u64::from(TRAPVEC_IOC_INFO),
        nix(0, size_of::<TrapvecInfo>())
    );
    assert_eq!(
        u64::from(TRAPVEC_IOC_APPLY),
        nix(7, size_of::<TrapvecApply>())
    );
    assert_eq!(
        u64::from(TRAPVEC_IOC_QUIESCE),
        nix(12, size_of::<TrapvecQuiesce>())
    );
    assert_eq!(
        u64::from(TRAPVEC_IOC_RETURN_STATS),
        nix(34, size_of::<TrapvecReturnStats>())
    );
    assert_eq!(
        u64::from(TRAPVEC_IOC_KEY_ADD),
        nix(35, size_of::<TrapvecKeyAdd>())
    );
    assert_eq!(
        u64::from(TRAPVEC_IOC_KEY_REMOVE),
        nix(36, size_of::<TrapvecKeyRemove>())
    );
    assert_eq!(
        u64::from(TRAPVEC_IOC_KEY_STATS),
        nix(37, size_of::<TrapvecKeyStats>())
    );
    assert_eq!(
        u64::from(TRAPVEC_IOC_STATE_PUT),
        nix(14, size_of::<TrapvecState>())
    );
}

/// The header's one list of refusal reasons, `(number, NAME)`, as `cc` expands `TRAPVEC_REASONS()`.
fn c_reasons() -> Vec<(u32, String)> {
    let src = "#include <stdio.h>\n#include \"trapvec_abi.h\"\n\
               #define ROW(n, name, meaning) printf(\"%d %s\\n\", (n), #name);\n\
               int main(void)\n{\n\tTRAPVEC_REASONS(ROW)\n\treturn 0;\n}\n";
    run_c(src)
        .lines()
        .map(|l| {
            let (n, name) = l.split_once(' ').unwrap();
            (n.parse().unwrap(), name.to_string())
        })
        .collect()
}

/// `pub const TRAPVEC_REASON_<NAME>: u32 = <n>;` in `trapvec/src/abi.rs`, as written there.
fn rust_reason_constants() -> BTreeMap<String, u32> {
    include_str!("../src/abi.rs")
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("pub const TRAPVEC_REASON_")?;
            let (name, value) = rest.split_once(": u32 = ")?;
            Some((name.to_string(), value.trim_end_matches(';').parse().ok()?))
        })
        .filter(|(name, _)| name != "MAX")
        .collect()
}

/// The variants of `SiteRefusal` (`trapvec/src/kernel/mod.rs`), in the header's spelling
/// (`KprobeRefused` -> `KPROBE_REFUSED`), but for the two that are no verdict of the module.
fn site_refusal_variants() -> Vec<String> {
    let src = include_str!("../src/kernel/mod.rs");
    let start = src
        .find("pub enum SiteRefusal {")
        .expect("SiteRefusal in kernel/mod.rs");
    let body = &src[start..src[start..].find("\n}\n").unwrap() + start];
    body.lines()
        .skip(1)
        .filter_map(|l| {
            let l = l.strip_prefix("    ")?;
            if !l.starts_with(|c: char| c.is_ascii_uppercase()) {
                return None;
            }
            let name: String = l.chars().take_while(char::is_ascii_alphanumeric).collect();
            (name != "Unknown" && name != "CheckFailed").then(|| screaming(&name))
        })
        .collect()
}

/// `NotAJump` -> `NOT_A_JUMP`.
fn screaming(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if i > 0 && c.is_ascii_uppercase() {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// The header's `TRAPVEC_REASONS()` list is the one source of the refusal reasons; the Rust side
/// (the constants in `abi.rs`, `SiteRefusal` and its two conversions) is checked against it here,
/// reason by reason, in both directions.
#[test]
fn refusal_reasons_match_the_headers_list() {
    let c = c_reasons();
    let consts = rust_reason_constants();
    let variants = site_refusal_variants();
    let mut wrong = Vec::new();

    for (i, (n, name)) in c.iter().enumerate() {
        if *n as usize != i {
            wrong.push(format!(
                "{name}: number {n} in the header's list, at position {i}"
            ));
        }
        match consts.get(name) {
            Some(v) if v == n => {}
            Some(v) => wrong.push(format!("{name}: {n} in the header, {v} in abi.rs")),
            None => wrong.push(format!("{name} ({n}): no TRAPVEC_REASON_{name} in abi.rs")),
        }
        if *n == TRAPVEC_REASON_NONE {
            if let Some(r) = trapvec::kernel::SiteRefusal::from_abi(*n, 0) {
                wrong.push(format!("{name} ({n}): SiteRefusal::from_abi gives {r:?}"));
            }
            continue;
        }
        let Some(r) = trapvec::kernel::SiteRefusal::from_abi(*n, -1) else {
            wrong.push(format!("{name} ({n}): SiteRefusal::from_abi gives None"));
            continue;
        };
        let debug = format!("{r:?}");
        let variant: String = debug
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect();
        if screaming(&variant) != *name {
            wrong.push(format!("{name} ({n}): SiteRefusal::from_abi gives {debug}"));
        }
        if r.code() != Some(*n) {
            wrong.push(format!(
                "{name} ({n}): SiteRefusal::{variant}.code() is {:?}",
                r.code()
            ));
        }
    }
    for (name, v) in &consts {
        if !c.iter().any(|(_, n)| n == name) {
            wrong.push(format!("{name} ({v}): in abi.rs, not in the header's list"));
        }
    }
    for v in &variants {
        if !c.iter().any(|(_, n)| n == v) {
            wrong.push(format!(
                "{v}: a SiteRefusal variant with no reason in the header's list"
            ));
        }
    }
    if let Some((max, _)) = c.last() {
        if *max != TRAPVEC_REASON_MAX {
            wrong.push(format!(
                "MAX: the header's list ends at {max}, abi.rs says {TRAPVEC_REASON_MAX}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "refusal reasons differ from kmod/trapvec_abi.h's TRAPVEC_REASONS():\n{}",
        wrong.join("\n")
    );
    // Sanity: the comparison saw the whole list and every variant.
    assert!(c.len() > 30, "the header's list has {} reasons", c.len());
    assert_eq!(
        variants.len(),
        c.len() - 1,
        "one SiteRefusal variant per reason but NONE"
    );
}
