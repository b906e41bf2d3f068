//! Points: the text a user writes (`sym`, `sym+0x10`, `sym+16`, `0xffffffff81000000`), parsed
//! into a [`PointSpec`] and resolved against a [`SymbolTable`] into the containing function and
//! the site address.
//!
//! A name may be qualified by the object defining it and by its version, as uprobes and the
//! dynamic linker spell them: `libsqlite3.so.0:sqlite3_step`, `pthread_cond_wait@GLIBC_2.3.2`
//! (a kernel module's name qualifies the same way: `nf_conntrack:nf_ct_delete`). A name given
//! without them resolves as a link would bind it ([`choose`]): the main image's definition
//! first, versions hidden from links (`name@VER`) only when asked for; several definitions
//! left after that are refused as ambiguous, each candidate named. `name@0xADDRESS` names the
//! function of that name at that address: one of the copies of a name that several static
//! functions share (kallsyms repeats such names), as a glob's expansion names each of them. In a
//! process ADDRESS may also be the address in the object's file (as `nm` prints it), which
//! stays the same from run to run where the run-time address moves with ASLR: `trapctl cover
//! --process` names a shared static name's copies so. The two cannot name different copies of
//! one object: its bias is the same for every copy.
//!
//! With [`TargetInfo::has_fentry`], a point at a function's entry moves past what the kernel owns
//! there ([`kernel_entry_len`]): the ftrace site (a 5-byte `call __fentry__`, or the 5-byte NOP
//! ftrace turns it into), which the kernel rewrites by itself, and, where the kernel is built with
//! IBT (6.12: `CONFIG_X86_KERNEL_IBT`), the `endbr64` before it, on which every indirect call must
//! land: entry+5 on 6.1, entry+9 on 6.12. Neither is ever spliced, so the function still starts
//! with its `endbr64` while a replacement is live.

use std::fmt;
use std::str::FromStr;

use trapvec::{Symbol, SymbolKind, SymbolTable, TargetInfo};

use crate::error::PlanError;

/// Length of the ftrace `__fentry__` site at a function's entry.
pub const FENTRY_LEN: u64 = 5;

/// The 5-byte NOP ftrace writes over `call __fentry__` (`nop dword [rax+rax*1+0x0]`).
pub const NOP5: [u8; 5] = [0x0F, 0x1F, 0x44, 0x00, 0x00];

/// Whether `bytes` (at least 5, from a function's entry) start with an ftrace site: a 5-byte
/// `call rel32` or the 5-byte NOP.
pub fn is_fentry_site(bytes: &[u8]) -> bool {
    bytes.len() >= 5 && (bytes[0] == 0xE8 || bytes[..5] == NOP5)
}

/// `endbr64`: with IBT, an indirect branch must land on it or the CPU raises #CP.
pub const ENDBR64: [u8; 4] = [0xF3, 0x0F, 0x1E, 0xFA];

/// What a kernel with IBT writes over the `endbr64` of a function nothing calls indirectly
/// (objtool's sealing, `gen_endbr_poison()`: `osp nopl (%rax)`). It stays the entry's first
/// instruction, so a point at the entry moves past it as past an `endbr64`.
pub const ENDBR_POISON: [u8; 4] = [0x66, 0x0F, 0x1F, 0x00];

/// Whether `bytes` start with an `endbr64` or its sealed form.
pub fn starts_with_endbr(bytes: &[u8]) -> bool {
    bytes.starts_with(&ENDBR64) || bytes.starts_with(&ENDBR_POISON)
}

/// How many bytes [`kernel_entry_len`] needs from a function's entry.
pub const KERNEL_ENTRY_MAX: usize = ENDBR64.len() + 5;
const _: () = assert!(KERNEL_ENTRY_MAX as u64 == ENDBR64.len() as u64 + FENTRY_LEN);

/// How many bytes at a kernel function's entry belong to the kernel: an `endbr64`, then an
/// ftrace site, each optional (0, 4, 5 or 9). `bytes` starts at the entry (short reads give 0
/// for what they do not hold).
pub fn kernel_entry_len(bytes: &[u8]) -> u64 {
    let endbr = if starts_with_endbr(bytes) {
        ENDBR64.len()
    } else {
        0
    };
    endbr as u64
        + if is_fentry_site(&bytes[endbr..]) {
            FENTRY_LEN
        } else {
            0
        }
}

/// A point as written by the user.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PointSpec {
    /// `[object:]name[@version|@0xADDRESS][+offset]` (offset in decimal or `0x` hex).
    Symbol {
        name: String,
        offset: u64,
        /// The object defining it: a path, a file name, or a file name's start up to a dot
        /// (`libc` matches `libc.so.6`); a module name in the kernel.
        object: Option<String>,
        /// `VER` of `name@VER` or `name@@VER`.
        version: Option<String>,
        /// `ADDRESS` of `name@0xADDRESS`: the function of that name at that address (no version
        /// starts with `0x`); in a process, its run-time address or its address in its file.
        addr: Option<u64>,
    },
    /// `0xADDRESS`.
    Address(u64),
}

impl fmt::Display for PointSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PointSpec::Symbol {
                name,
                offset,
                object,
                version,
                addr,
            } => {
                if let Some(o) = object {
                    write!(f, "{o}:")?;
                }
                f.write_str(name)?;
                if let Some(v) = version {
                    write!(f, "@{v}")?;
                }
                if let Some(a) = addr {
                    write!(f, "@{a:#x}")?;
                }
                if *offset != 0 {
                    write!(f, "+{offset:#x}")?;
                }
                Ok(())
            }
            PointSpec::Address(a) => write!(f, "{a:#x}"),
        }
    }
}

fn parse_number(s: &str) -> Option<u64> {
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

impl FromStr for PointSpec {
    type Err = PlanError;

    fn from_str(text: &str) -> Result<Self, PlanError> {
        let bad = |reason: &str| PlanError::BadPointSpec {
            text: text.to_string(),
            reason: reason.to_string(),
        };
        let t = text.trim();
        if t.is_empty() {
            return Err(bad("empty"));
        }
        // Paths may hold `:` only before the last one (C and mangled C++ names hold none), and
        // `+` anywhere (`libstdc++.so.6`): the offset's `+` is the first after the last `:`.
        let (object, rest) = match t.rsplit_once(':') {
            Some((o, r)) => (Some(o), r),
            None => (None, t),
        };
        let (name, offset) = match rest.split_once('+') {
            Some((n, o)) => {
                let off = parse_number(o.trim())
                    .ok_or_else(|| bad(&format!("offset `{}` is not a number", o.trim())))?;
                (n.trim(), Some(off))
            }
            None => (rest, None),
        };
        if name.is_empty() {
            return Err(bad("no symbol before `+`"));
        }
        if object.is_none() && (name.starts_with("0x") || name.starts_with("0X")) {
            if offset.is_some() {
                return Err(bad("an address takes no offset"));
            }
            return parse_number(name)
                .map(PointSpec::Address)
                .ok_or_else(|| bad(&format!("`{name}` is not a hex address")));
        }
        let (object, name) = match object {
            Some(o) if o.trim().is_empty() => {
                return Err(bad(&format!("no object before `:{}`", name.trim())))
            }
            Some(o) => (Some(o.trim().to_string()), name.trim()),
            None => (None, name),
        };
        let (name, version, addr) = match name.split_once('@') {
            Some((n, v)) if v.starts_with("0x") || v.starts_with("0X") => {
                let a = parse_number(v).ok_or_else(|| {
                    bad(&format!(
                        "`{v}` after `@` is not a hex address (`name@0xADDRESS`)"
                    ))
                })?;
                (n, None, Some(a))
            }
            Some((n, v)) => {
                let v = v.trim_start_matches('@');
                if v.is_empty() || v.contains('@') {
                    return Err(bad("a version is written `name@VERSION`"));
                }
                (n, Some(v.to_string()), None)
            }
            None => (name, None, None),
        };
        if name.is_empty() {
            return Err(bad("no symbol name"));
        }
        if name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(bad("addresses are written in hex with `0x`"));
        }
        if let Some(c) = name
            .chars()
            .find(|c| c.is_whitespace() || matches!(c, '-' | '*' | '[' | ']' | ',' | ';' | '/'))
        {
            return Err(bad(&format!("`{c}` cannot appear in a symbol name")));
        }
        Ok(PointSpec::Symbol {
            name: name.to_string(),
            offset: offset.unwrap_or(0),
            object,
            version,
            addr,
        })
    }
}

/// A point resolved to its function and site.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResolvedPoint {
    /// The point in canonical form (`sym`, `sym+0x10`, `0xADDR`), for messages; the text as
    /// the user wrote it stays with the caller (e.g. [`crate::SpliceRequest::at`]).
    pub spec_text: String,
    /// The containing function, with `size` set to its extent.
    pub function: Symbol,
    /// The address that will be spliced.
    pub site: u64,
}

/// Whether `origin` (a path, or a kernel module's name) is the object a user named `object`:
/// the same path, the same file name, or a file name starting with `object` and a dot.
pub fn object_matches(origin: &str, object: &str) -> bool {
    let file = origin.rsplit('/').next().unwrap_or(origin);
    origin == object
        || file == object
        || file
            .strip_prefix(object)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// Whether any symbol of `symbols` lies in an object matching `object` (a kernel module:
/// whether it is loaded, as far as the table knows).
pub fn object_loaded(symbols: &SymbolTable, object: &str) -> bool {
    symbols.iter().any(|s| {
        s.origin
            .as_deref()
            .is_some_and(|g| object_matches(g, object))
    })
}

/// The symbol a name stands for, as a link would bind it. Candidates are every symbol called
/// `name`, kept if they lie in `object` and carry `version` when those are given; without a
/// version, hidden versions (`name@VER`) drop out while another candidate remains. Aliases (one
/// address) count once. Of several left, the main image's single definition wins, as the
/// executable's definitions interpose on libraries'; otherwise the name is ambiguous.
pub fn choose<'a>(
    text: &str,
    name: &str,
    object: Option<&str>,
    version: Option<&str>,
    symbols: &'a SymbolTable,
) -> Result<&'a Symbol, PlanError> {
    let all = symbols.lookup_all(name);
    let in_object = |o: &str| {
        all.iter()
            .any(|s| s.origin.as_deref().is_some_and(|g| object_matches(g, o)))
    };
    let listed = |syms: &[&Symbol], what: fn(&Symbol) -> String| {
        let mut v: Vec<String> = syms.iter().map(|s| what(s)).collect();
        v.sort();
        v.dedup();
        v.join(", ")
    };
    let origin = |s: &Symbol| s.origin.clone().unwrap_or_else(|| "the main image".into());
    // Nothing of the object at all (a pass over the table, on the way to an error only).
    if let Some(o) = object.filter(|&o| !in_object(o) && !object_loaded(symbols, o)) {
        return Err(PlanError::ObjectNotLoaded {
            text: text.to_string(),
            object: o.to_string(),
            found: if all.is_empty() {
                String::new()
            } else {
                format!("; `{name}` is in {}", listed(&all, origin))
            },
        });
    }
    if all.is_empty() {
        return Err(PlanError::UnknownSymbol {
            text: text.to_string(),
            name: name.to_string(),
        });
    }
    let mut cands = all.clone();
    if let Some(o) = object {
        cands.retain(|s| {
            s.origin
                .as_deref()
                .is_some_and(|origin| object_matches(origin, o))
        });
        if cands.is_empty() {
            let found = listed(&all, origin);
            return Err(PlanError::NotInObject {
                text: text.into(),
                name: name.into(),
                object: o.into(),
                found,
            });
        }
    }
    match version {
        Some(v) => {
            let before = cands.clone();
            cands.retain(|s| s.version.as_deref().map(|sv| sv.trim_start_matches('@')) == Some(v));
            if cands.is_empty() {
                let found = listed(&before, |s| {
                    s.version.clone().unwrap_or_else(|| "none".into())
                });
                return Err(PlanError::NoSuchVersion {
                    text: text.into(),
                    name: name.into(),
                    version: v.into(),
                    found,
                });
            }
        }
        None if cands.iter().any(|s| !s.is_hidden_version()) => {
            cands.retain(|s| !s.is_hidden_version())
        }
        None => {}
    }
    let distinct = |syms: &[&'a Symbol]| {
        let mut d = syms.to_vec();
        d.sort_by_key(|s| s.addr);
        d.dedup_by_key(|s| s.addr);
        d
    };
    let distinct_all = distinct(&cands);
    if let [only] = distinct_all.as_slice() {
        return Ok(only);
    }
    let main: Vec<&Symbol> = cands
        .iter()
        .copied()
        .filter(|s| s.origin.is_none())
        .collect();
    if let [only] = distinct(&main).as_slice() {
        log::debug!(
            "`{name}`: the main image's definition at {:#x} wins over {} others",
            only.addr,
            distinct_all.len() - 1
        );
        return Ok(only);
    }
    Err(ambiguous(text, name, &distinct_all))
}

/// `name` names every one of `candidates`: each listed as `object:name at 0xADDRESS`.
fn ambiguous(text: &str, name: &str, candidates: &[&Symbol]) -> PlanError {
    PlanError::Ambiguous {
        text: text.into(),
        name: name.into(),
        candidates: candidates
            .iter()
            .map(|s| {
                format!(
                    "{}:{} at {:#x}",
                    s.origin.as_deref().unwrap_or("main"),
                    s.versioned_name(),
                    s.addr
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The kernel's init memory, `[__init_begin, __init_end)` of vmlinux (the main image), when
/// `symbols` has both (kallsyms does). The kernel frees it once boot is over
/// (`free_initmem()`): the `__init` functions kallsyms still lists there are no longer code, so
/// a point in one is refused ([`PlanError::InitFreed`]) before anything reads its bytes. A
/// module's init code is freed too, but kallsyms drops its symbols then.
pub fn freed_init(symbols: &SymbolTable) -> Option<(u64, u64)> {
    let at = |name: &str| {
        symbols
            .lookup_all(name)
            .into_iter()
            .find(|s| s.origin.is_none())
            .map(|s| s.addr)
    };
    let (lo, hi) = (at("__init_begin")?, at("__init_end")?);
    (lo < hi).then_some((lo, hi))
}

/// Whether `f` is a function of vmlinux's freed init memory ([`freed_init`]), on a kernel
/// target (`info.has_fentry`).
pub fn in_freed_init(f: &Symbol, symbols: &SymbolTable, info: &TargetInfo) -> bool {
    info.has_fentry
        && f.origin.is_none()
        && freed_init(symbols).is_some_and(|(lo, hi)| (lo..hi).contains(&f.addr))
}

/// The function `name` at `addr` of `symbols` (in `object` when given): `name@0xADDRESS`, at
/// its run-time address or, in a process, its address in its file
/// ([`SymbolTable::file_address`]).
fn copy_at<'a>(
    text: &str,
    name: &str,
    object: Option<&str>,
    addr: u64,
    symbols: &'a SymbolTable,
) -> Result<&'a Symbol, PlanError> {
    let all = symbols.lookup_all(name);
    let in_object = |s: &&Symbol| {
        object.is_none_or(|o| s.origin.as_deref().is_some_and(|g| object_matches(g, o)))
    };
    let mine: Vec<&Symbol> = all.iter().copied().filter(in_object).collect();
    if let Some(s) = mine.iter().find(|s| s.addr == addr) {
        return Ok(s);
    }
    // A file address: the same number may be a copy's in the program and in a library; an
    // unqualified name binds to the program's, as [`choose`] does. Names of one run-time
    // address are one function (glibc's `lio_listio@GLIBC_2.4` and `lio_listio@@GLIBC_2.34`):
    // one candidate, the default version's name first.
    let mut in_file: Vec<&Symbol> = mine
        .iter()
        .copied()
        .filter(|s| symbols.file_address(s) == Some(addr))
        .collect();
    in_file.sort_by_key(|s| (s.addr, s.is_hidden_version()));
    in_file.dedup_by_key(|s| s.addr);
    let main: Vec<&Symbol> = in_file
        .iter()
        .copied()
        .filter(|s| s.origin.is_none())
        .collect();
    match (in_file.as_slice(), main.as_slice()) {
        ([only], _) | (_, [only]) => return Ok(only),
        ([], _) => {}
        (several, _) => return Err(ambiguous(text, name, several)),
    }
    if all.is_empty() {
        return Err(PlanError::UnknownSymbol {
            text: text.to_string(),
            name: name.to_string(),
        });
    }
    let mut found: Vec<String> = all
        .iter()
        .map(|s| {
            let at = match symbols.file_address(s) {
                Some(f) if f != s.addr => format!("{:#x} ({f:#x} in its file)", s.addr),
                _ => format!("{:#x}", s.addr),
            };
            match &s.origin {
                Some(o) => format!("{o}:{}@{at}", s.name),
                None => format!("{}@{at}", s.name),
            }
        })
        .collect();
    found.sort();
    found.dedup();
    Err(PlanError::NotAtAddress {
        text: text.to_string(),
        name: name.to_string(),
        addr,
        found: found.join(", "),
    })
}

/// Resolve `spec`. A kernel function in freed init memory is refused ([`freed_init`]).
/// `entry_len(entry)` says how many bytes at the entry of the function starting
/// at `entry` the kernel owns (typically [`kernel_entry_len`] over the target's bytes); it is
/// consulted only with `info.has_fentry` and for a point at a function's entry.
pub fn resolve_point(
    spec: &PointSpec,
    symbols: &SymbolTable,
    info: &TargetInfo,
    entry_len: impl Fn(u64) -> u64,
) -> Result<ResolvedPoint, PlanError> {
    let text = spec.to_string();
    let (function, mut site) = match spec {
        PointSpec::Symbol {
            name,
            offset,
            object,
            version,
            addr,
        } => {
            let sym = match addr {
                Some(a) => copy_at(&text, name, object.as_deref(), *a, symbols)?,
                None => choose(&text, name, object.as_deref(), version.as_deref(), symbols)?,
            };
            match sym.kind {
                SymbolKind::Function => {}
                SymbolKind::Ifunc => {
                    return Err(PlanError::UnresolvedIfunc {
                        text,
                        name: name.clone(),
                        addr: sym.addr,
                    })
                }
                _ => {
                    return Err(PlanError::NotAFunction {
                        text,
                        name: name.clone(),
                        addr: sym.addr,
                    })
                }
            }
            let size = symbols.function_extent(sym);
            if size == 0 {
                return Err(PlanError::UnknownExtent {
                    text,
                    name: name.clone(),
                    addr: sym.addr,
                });
            }
            if *offset >= size {
                return Err(PlanError::OffsetPastEnd {
                    text,
                    name: name.clone(),
                    offset: *offset,
                    size,
                });
            }
            (
                Symbol {
                    size,
                    ..sym.clone()
                },
                sym.addr + offset,
            )
        }
        PointSpec::Address(addr) => {
            let sym = symbols
                .function_containing(*addr)
                .ok_or(PlanError::NoFunctionAt {
                    text: text.clone(),
                    addr: *addr,
                })?;
            let size = symbols.function_extent(&sym);
            (Symbol { size, ..sym }, *addr)
        }
    };
    if in_freed_init(&function, symbols, info) {
        log::debug!(
            "point `{text}`: `{}` at {:#x} is init code, freed after boot",
            function.name,
            function.addr
        );
        return Err(PlanError::InitFreed {
            text,
            name: function.name,
            addr: function.addr,
        });
    }
    if info.has_fentry && site == function.addr {
        let skip = entry_len(site);
        if skip > 0 && function.size > skip {
            log::debug!(
                "point `{text}`: moved past the entry (endbr64, ftrace site) of `{}` to {:#x}",
                function.name,
                site + skip
            );
            site += skip;
        }
    }
    log::debug!(
        "point `{text}` resolved to {site:#x} in `{}` [{:#x}, {:#x})",
        function.name,
        function.addr,
        function.addr + function.size
    );
    Ok(ResolvedPoint {
        spec_text: text,
        function,
        site,
    })
}

#[cfg(test)]
mod tests;
