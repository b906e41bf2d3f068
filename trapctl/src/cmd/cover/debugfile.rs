//! What `--lcov` checks of a debug file before it reads lines from it: its GNU build-id and its
//! function symbols, against what the coverage report recorded of the code it covered. A file
//! that does not match is named with the first thing that disagrees, never read for lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use object::Object as _;
use trapvec::{Symbol, SymbolKind, SymbolTable};

/// Why a debug file gives no lines: it cannot be had (no file, not ELF, no line table: the
/// report then holds symbol+offset records and says why), or it is not the covered code's.
#[derive(Debug)]
pub(super) enum NoLines {
    Unavailable(String),
    Mismatch(String),
}

impl NoLines {
    pub fn why(&self) -> &str {
        match self {
            NoLines::Unavailable(w) | NoLines::Mismatch(w) => w,
        }
    }
}

/// A debug file's build-id and function symbols.
pub(super) struct DebugFile {
    pub path: PathBuf,
    pub build_id: Option<String>,
    pub symbols: SymbolTable,
}

/// `bytes` in lower-case hex.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The GNU build-id of the ELF file at `path` (hex), if it can be read and has one.
pub(super) fn build_id_of(path: &Path) -> Option<String> {
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    file.build_id().ok().flatten().map(hex)
}

impl DebugFile {
    pub fn read(path: &Path) -> Result<DebugFile, NoLines> {
        let unavailable = |why: String| NoLines::Unavailable(format!("{}: {why}", path.display()));
        let data = std::fs::read(path).map_err(|e| unavailable(e.to_string()))?;
        let file = object::File::parse(&*data)
            .map_err(|e| unavailable(format!("not an ELF file: {e}")))?;
        let build_id = file.build_id().ok().flatten().map(hex);
        let symbols = trapvec::elfsyms::read_elf_symbols(&data, 0, None)
            .map_err(|e| unavailable(format!("its symbols cannot be read: {e}")))?;
        Ok(DebugFile {
            path: path.to_path_buf(),
            build_id,
            symbols: SymbolTable::new(symbols),
        })
    }

    /// Refuse the file when its build-id is not `recorded` (when both are known).
    pub fn check_build_id(&self, recorded: Option<&str>, what: &str) -> Result<(), NoLines> {
        match (recorded, &self.build_id) {
            (Some(want), Some(have)) if !want.eq_ignore_ascii_case(have) => {
                Err(NoLines::Mismatch(format!(
                    "{} has build-id {have}, {what} had {want}: not its debug file",
                    self.path.display()
                )))
            }
            _ => Ok(()),
        }
    }

    /// The function symbols called `name`.
    fn functions(&self, name: &str) -> Vec<&Symbol> {
        self.symbols
            .lookup_all(name)
            .into_iter()
            .filter(|s| s.kind == SymbolKind::Function)
            .collect()
    }

    /// Refuse the file unless every function of `functions` (name, address, end of its last
    /// block) is a function of the file at that address whose extent holds its blocks.
    pub fn check_functions(
        &self,
        functions: &BTreeMap<(String, u64), u64>,
        what: &str,
    ) -> Result<(), NoLines> {
        for ((name, addr), end) in functions {
            let Some(f) = self.functions(name).into_iter().find(|f| f.addr == *addr) else {
                return Err(NoLines::Mismatch(format!(
                    "{} has no function `{name}` at {addr:#x}, where {what} had it: not its debug file",
                    self.path.display()
                )));
            };
            let extent = self.symbols.function_extent(f);
            if *end > f.addr + extent {
                return Err(NoLines::Mismatch(format!(
                    "function `{name}` at {addr:#x} is {extent} bytes in {}, but {what} had blocks of it up to +{:#x}: not its debug file",
                    self.path.display(),
                    end - addr
                )));
            }
        }
        Ok(())
    }

    /// vmlinux's KASLR slide, the run-time address of its code less the file's, from the
    /// functions of a report (name and run-time address): `text`, the run-time `_text`, less
    /// the file's `_text` when the report recorded it, else the slide on which every function
    /// whose name the file gives once agrees. Then every function must be a function of the
    /// file of that name at its address less the slide (a static function whose name the file
    /// gives several times is found so, exactly); the first that is not is named.
    pub fn kaslr_slide(
        &self,
        functions: &BTreeSet<(String, u64)>,
        text: Option<u64>,
    ) -> Result<u64, NoLines> {
        let path = self.path.display();
        let slide = match text {
            Some(text) => {
                let file = self
                    .symbols
                    .lookup("_text")
                    .ok_or_else(|| NoLines::Mismatch(format!("{path} has no `_text` symbol")))?;
                text.wrapping_sub(file.addr)
            }
            None => {
                let mut first: Option<(&str, u64)> = None;
                for (name, addr) in functions {
                    let [f] = self.functions(name)[..] else {
                        continue;
                    };
                    let slide = addr.wrapping_sub(f.addr);
                    match first {
                        None => first = Some((name, slide)),
                        Some((n, s)) if s != slide => {
                            return Err(NoLines::Mismatch(format!(
                                "`{n}` and `{name}` are not one KASLR slide away from {path} ({s:#x} and {slide:#x}): not the covered kernel's debug file"
                            )))
                        }
                        Some(_) => {}
                    }
                }
                let Some((_, slide)) = first else {
                    let name = functions.iter().next().map_or("", |(n, _)| n.as_str());
                    return Err(NoLines::Mismatch(format!(
                        "no function of the report is named once in {path} (`{name}` is not), so the KASLR slide cannot be found exactly"
                    )));
                };
                slide
            }
        };
        for (name, addr) in functions {
            let at = addr.wrapping_sub(slide);
            if !self.functions(name).iter().any(|f| f.addr == at) {
                return Err(NoLines::Mismatch(format!(
                    "{path} has no function `{name}` at {at:#x} (its run-time address {addr:#x} less the KASLR slide {slide:#x}): not the covered kernel's debug file"
                )));
            }
        }
        Ok(slide)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(symbols: &[(&str, u64)]) -> DebugFile {
        DebugFile {
            path: "vmlinux.dbg".into(),
            build_id: Some("abcd".into()),
            symbols: SymbolTable::new(
                symbols
                    .iter()
                    .map(|&(name, addr)| Symbol {
                        name: name.into(),
                        addr,
                        size: 0x20,
                        kind: SymbolKind::Function,
                        origin: None,
                        version: None,
                    })
                    .collect(),
            ),
        }
    }

    fn funcs(list: &[(&str, u64)]) -> BTreeSet<(String, u64)> {
        list.iter().map(|&(n, a)| (n.to_string(), a)).collect()
    }

    /// Two static `helper`s: each is found at its own address by the slide the others give.
    #[test]
    fn a_name_given_twice_is_found_by_the_slide_of_the_others() {
        let f = file(&[
            ("_text", 0x1000),
            ("tcp_a", 0x1100),
            ("helper", 0x1200),
            ("helper", 0x1300),
        ]);
        let slide = 0x3000_0000;
        let run = funcs(&[("tcp_a", 0x1100 + slide), ("helper", 0x1300 + slide)]);
        assert_eq!(f.kaslr_slide(&run, None).unwrap(), slide);
        assert_eq!(f.kaslr_slide(&run, Some(0x1000 + slide)).unwrap(), slide);
        // `helper` 0x10 off: named.
        let bad = funcs(&[("tcp_a", 0x1100 + slide), ("helper", 0x1310 + slide)]);
        let e = f.kaslr_slide(&bad, None).unwrap_err();
        assert!(
            matches!(&e, NoLines::Mismatch(w) if w.contains("no function `helper` at 0x1310")),
            "{e:?}"
        );
        // Only names given twice: no exact slide without `_text`.
        let only = funcs(&[("helper", 0x1300 + slide)]);
        assert!(f
            .kaslr_slide(&only, None)
            .unwrap_err()
            .why()
            .contains("`helper` is not"));
        assert_eq!(f.kaslr_slide(&only, Some(0x1000 + slide)).unwrap(), slide);
        // Two unique names on two slides.
        let two = funcs(&[("tcp_a", 0x1100 + slide), ("_text", 0x1000 + slide + 0x40)]);
        assert!(f
            .kaslr_slide(&two, None)
            .unwrap_err()
            .why()
            .contains("not one KASLR slide"));
    }

    #[test]
    fn a_build_id_or_a_function_that_disagrees_is_named() {
        let f = file(&[("main", 0x1100)]);
        assert!(f.check_build_id(Some("ABCD"), "the program").is_ok());
        assert!(f.check_build_id(None, "the program").is_ok());
        let e = f.check_build_id(Some("beef"), "the program").unwrap_err();
        assert_eq!(
            e.why(),
            "vmlinux.dbg has build-id abcd, the program had beef: not its debug file"
        );
        let mut want = BTreeMap::new();
        want.insert(("main".to_string(), 0x1100), 0x1120);
        assert!(f.check_functions(&want, "the program").is_ok());
        want.insert(("main".to_string(), 0x1100), 0x1121);
        assert!(f
            .check_functions(&want, "the program")
            .unwrap_err()
            .why()
            .contains("`main` at 0x1100 is 32 bytes"));
        want.clear();
        want.insert(("other".to_string(), 0x1100), 0x1101);
        assert!(f
            .check_functions(&want, "the program")
            .unwrap_err()
            .why()
            .contains("no function `other` at 0x1100"));
    }
}
