//! Malformed components are refused with a reason, never loaded: each check of the validation
//! (`component_manager::validate`, `reloc::check`/`check_targets`, `ComponentManager::entry` and
//! `variable`) has a hand-made bad object here, made by patching one field of the compiled
//! `two.c` at the offset the ELF headers give, and the error names the culprit. Every refusal
//! happens before anything is allocated.

mod common;

use common::{compile, fake_target, FakeKernel};
use component_manager::parse::ParseError;
use component_manager::reloc::{RelocError, RelocType};
use component_manager::validate::{Limits, ValidateError, DEFAULT_MAX_IMAGE};
use component_manager::{ComponentError, ComponentManager, LoadOptions, NoExtra};
use object::elf;
use object::read::elf::{ElfFile64, FileHeader as _, SectionHeader as _};
use object::{LittleEndian as LE, Object as _, ObjectSection as _, ObjectSymbol as _};
use trapvec::{error_chain, SymbolKind};

const NEAR: u64 = 0x5555_5555_0000;

fn target() -> FakeKernel {
    fake_target(&[
        ("target_fn", NEAR + 0x1000, SymbolKind::Function),
        ("ext_var", NEAR + 0x4000, SymbolKind::Object),
    ])
}

fn opts() -> LoadOptions {
    LoadOptions {
        near: NEAR,
        ..LoadOptions::default()
    }
}

fn two() -> Vec<u8> {
    compile("two.c", &[])
}

/// Offsets of the fields the tests patch, read from the object's own headers.
struct Elf<'a> {
    bytes: &'a [u8],
}

/// `Elf64_Shdr` field offsets.
const SH_TYPE: usize = 4;
const SH_FLAGS: usize = 8;
const SH_SIZE: usize = 32;
const SH_INFO: usize = 44;
const SH_ADDRALIGN: usize = 48;
/// `Elf64_Sym` field offsets.
const ST_INFO: usize = 4;
const ST_SHNDX: usize = 6;
const ST_VALUE: usize = 8;
const ST_SIZE: usize = 16;
/// `Elf64_Rela` field offsets.
const R_OFFSET: usize = 0;
const R_INFO: usize = 8;
const R_ADDEND: usize = 16;

impl Elf<'_> {
    fn file(&self) -> ElfFile64<'_, LE> {
        ElfFile64::parse(self.bytes).unwrap()
    }

    fn section_index(&self, name: &str) -> usize {
        self.file()
            .section_by_name(name)
            .unwrap_or_else(|| panic!("no section {name}"))
            .index()
            .0
    }

    /// File offset of section `name`'s header.
    fn shdr(&self, name: &str) -> usize {
        let header = self.file().elf_header();
        let shoff = usize::try_from(header.e_shoff(LE)).unwrap();
        shoff + self.section_index(name) * usize::from(header.e_shentsize(LE))
    }

    /// File offset of section `name`'s contents.
    fn contents(&self, name: &str) -> usize {
        usize::try_from(
            self.file()
                .section_by_name(name)
                .unwrap()
                .file_range()
                .unwrap()
                .0,
        )
        .unwrap()
    }

    fn size(&self, name: &str) -> u64 {
        self.file().section_by_name(name).unwrap().size()
    }

    /// File offset of symbol `name`'s `Elf64_Sym`.
    fn sym(&self, name: &str) -> usize {
        let index = self
            .file()
            .symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| panic!("no symbol {name}"))
            .index()
            .0;
        self.contents(".symtab") + index * 24
    }

    fn symbol_index(&self, name: &str) -> u32 {
        let index = self
            .file()
            .symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap()
            .index()
            .0;
        u32::try_from(index).unwrap()
    }

    /// File offset of the first `.rela.text` entry whose symbol is `symbol` (a symbol index).
    fn rela_against(&self, symbol: u32) -> usize {
        let start = self.contents(".rela.text");
        let n = usize::try_from(self.size(".rela.text")).unwrap() / 24;
        (0..n)
            .map(|i| start + i * 24)
            .find(|&at| {
                u32::from_le_bytes(
                    self.bytes[at + R_INFO + 4..at + R_INFO + 8]
                        .try_into()
                        .unwrap(),
                ) == symbol
            })
            .unwrap_or_else(|| panic!("no relocation against symbol #{symbol}"))
    }

    fn section_symbol(&self, section: &str) -> u32 {
        let index = self.section_index(section);
        let file = self.file();
        let s = file.symbols().find(|s| {
            s.kind() == object::SymbolKind::Section && s.section_index().map(|i| i.0) == Some(index)
        });
        u32::try_from(
            s.unwrap_or_else(|| panic!("no section symbol for {section}"))
                .index()
                .0,
        )
        .unwrap()
    }
}

fn put(bytes: &mut [u8], at: usize, value: &[u8]) {
    bytes[at..at + value.len()].copy_from_slice(value);
}

/// Load `bytes` into a fresh manager with `limits`: the error, after checking that nothing was
/// allocated at all.
fn refuse_with(bytes: &[u8], limits: Limits) -> ComponentError {
    let (mut m, mut t) = (ComponentManager::with_limits(limits), target());
    let err = m
        .load_bytes(&mut t, "two", bytes, &opts(), &mut NoExtra)
        .expect_err("the load must fail");
    assert_eq!(t.allocs(), 0, "{err}: refused before allocating");
    err
}

fn refuse(bytes: &[u8]) -> ComponentError {
    refuse_with(bytes, Limits::default())
}

fn validate_error(err: &ComponentError) -> &ValidateError {
    match err {
        ComponentError::Validate { error, .. } => error,
        other => panic!("not a validation error: {other}"),
    }
}

fn reloc_error(err: &ComponentError) -> &RelocError {
    match err {
        ComponentError::Reloc { error, .. } => error,
        other => panic!("not a relocation error: {other}"),
    }
}

#[test]
fn the_unpatched_seed_loads() {
    let bytes = two();
    let (mut m, mut t) = (ComponentManager::new(), target());
    m.load_bytes(&mut t, "two", &bytes, &opts(), &mut NoExtra)
        .unwrap();
    assert_eq!(
        m.limits(),
        Limits {
            max_image: DEFAULT_MAX_IMAGE,
            max_align: 4096
        }
    );
}

// 1. Symbols inside their sections; bad section indices.

#[test]
fn handler_whose_value_lies_beyond_text_is_refused_naming_symbol_and_section() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    let text = elf.size(".text");
    put(
        &mut bytes,
        elf.sym("handler") + ST_VALUE,
        &(text + 0x1000).to_le_bytes(),
    );
    let err = refuse(&bytes);
    let ValidateError::SymbolOutside {
        symbol,
        section,
        section_index,
        value,
        section_size,
        ..
    } = validate_error(&err)
    else {
        panic!("{err}")
    };
    assert_eq!(
        (
            symbol.as_str(),
            section.as_str(),
            *section_index,
            *value,
            *section_size
        ),
        ("handler", ".text", 1, text + 0x1000, text)
    );
    assert!(error_chain(&err).starts_with(&format!("component two: symbol handler (#7) at .text+{:#x} (0x38 bytes) lies outside its section #1", text + 0x1000)), "{err}");
}

#[test]
fn symbol_whose_size_runs_past_its_section_is_refused() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    put(
        &mut bytes,
        elf.sym("helper") + ST_SIZE,
        &u64::MAX.to_le_bytes(),
    );
    assert!(
        matches!(validate_error(&refuse(&bytes)), ValidateError::SymbolOutside { symbol, size: u64::MAX, .. } if symbol == "helper")
    );
}

#[test]
fn variable_beyond_its_bss_is_refused_nobits_included() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    let bss = elf.size(".bss");
    put(
        &mut bytes,
        elf.sym("counter") + ST_VALUE,
        &bss.to_le_bytes(),
    );
    let err = refuse(&bytes);
    assert!(
        matches!(validate_error(&err), ValidateError::SymbolOutside { symbol, section, .. } if symbol == "counter" && section == ".bss"),
        "{err}"
    );
}

#[test]
fn symbol_with_a_bad_section_index_is_refused_naming_it() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    for shndx in [0x50u16, 0xff10] {
        put(
            &mut bytes,
            elf.sym("handler") + ST_SHNDX,
            &shndx.to_le_bytes(),
        );
        let err = refuse(&bytes);
        let ComponentError::Parse {
            error:
                ParseError::SymbolSection {
                    symbol,
                    shndx: found,
                    ..
                },
            ..
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!(
            (symbol.as_str(), *found),
            ("handler", u32::from(shndx)),
            "{err}"
        );
    }
}

// 2. Sizes and alignments.

#[test]
fn huge_bss_is_refused_before_any_allocation_naming_the_section() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    put(
        &mut bytes,
        elf.shdr(".bss") + SH_SIZE,
        &1_400_000_000_000_000_000u64.to_le_bytes(),
    );
    let err = refuse(&bytes);
    assert_eq!(
        *validate_error(&err),
        ValidateError::SectionTooLarge {
            section: ".bss".into(),
            index: 4,
            size: 1_400_000_000_000_000_000,
            limit: DEFAULT_MAX_IMAGE
        }
    );
    assert_eq!(
        error_chain(&err),
        format!(
            "component two: section .bss (#4) is {:#x} bytes, more than the image limit 0x1000000",
            1_400_000_000_000_000_000u64
        )
    );
}

#[test]
fn image_ceiling_is_the_managers_limit() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    put(
        &mut bytes,
        elf.shdr(".bss") + SH_SIZE,
        &(8u64 << 20).to_le_bytes(),
    );
    // 8 MiB of bss fits the default 16 MiB...
    let (mut m, mut t) = (ComponentManager::new(), target());
    m.load_bytes(&mut t, "two", &bytes, &opts(), &mut NoExtra)
        .unwrap();
    // ...not a 4 MiB ceiling.
    let limits = Limits {
        max_image: 4 << 20,
        ..Limits::default()
    };
    assert!(
        matches!(validate_error(&refuse_with(&bytes, limits)), ValidateError::SectionTooLarge { limit, .. } if *limit == 4 << 20)
    );
    // Sections that fit one by one but not together, and the GOT slots and stubs laid out after
    // them, count against the same ceiling.
    let err = refuse_with(
        &two(),
        Limits {
            max_image: 0x60,
            ..Limits::default()
        },
    );
    assert!(
        matches!(
            validate_error(&err),
            ValidateError::ImageTooLarge { limit: 0x60, .. }
        ),
        "{err}"
    );
    let mut m = ComponentManager::new();
    m.set_limits(Limits {
        max_image: 0x90,
        ..Limits::default()
    });
    let err = m
        .load_bytes(&mut target(), "two", &two(), &opts(), &mut NoExtra)
        .unwrap_err();
    assert!(
        error_chain(&err).starts_with("component two: the component's image needs 0x"),
        "{err}"
    );
}

#[test]
fn alignment_must_be_a_power_of_two_and_bounded() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    let at = elf.shdr(".text") + SH_ADDRALIGN;
    put(&mut bytes, at, &24u64.to_le_bytes());
    assert_eq!(
        *validate_error(&refuse(&bytes)),
        ValidateError::AlignmentNotPowerOfTwo {
            section: ".text".into(),
            index: 1,
            align: 24
        }
    );
    put(&mut bytes, at, &(1u64 << 40).to_le_bytes());
    let err = refuse(&bytes);
    assert_eq!(
        error_chain(&err),
        "component two: section .text (#1) has alignment 0x10000000000, more than the limit 0x1000"
    );
    // 0 means none.
    put(&mut bytes, at, &0u64.to_le_bytes());
    ComponentManager::new()
        .load_bytes(&mut target(), "two", &bytes, &opts(), &mut NoExtra)
        .unwrap();
}

// 3. Section types.

#[test]
fn allocated_section_of_unknown_type_is_refused() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    put(
        &mut bytes,
        elf.shdr(".rodata") + SH_TYPE,
        &0x6000_1234u32.to_le_bytes(),
    );
    assert_eq!(
        error_chain(&refuse(&bytes)),
        "component two: section .rodata (#5) is SHF_ALLOC but of type 0x60001234, which the loader does not know how to load"
    );
    // The same type on a section that is not allocated is ignored (it may be debug info).
    let mut bytes = two();
    put(
        &mut bytes,
        elf.shdr(".comment") + SH_TYPE,
        &0x6000_1234u32.to_le_bytes(),
    );
    ComponentManager::new()
        .load_bytes(&mut target(), "two", &bytes, &opts(), &mut NoExtra)
        .unwrap();
}

#[test]
fn code_the_placement_would_drop_is_refused() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    for (sh_type, what) in [(elf::SHT_NOBITS, "no contents"), (elf::SHT_NOTE, "a note")] {
        put(
            &mut bytes,
            elf.shdr(".text") + SH_TYPE,
            &sh_type.to_le_bytes(),
        );
        let err = refuse(&bytes);
        assert!(
            matches!(validate_error(&err), ValidateError::DroppedCode { section, what: w, .. } if section == ".text" && *w == what),
            "{err}"
        );
    }
    // A null type with SHF_ALLOC is no known way to load a section either.
    put(
        &mut bytes,
        elf.shdr(".text") + SH_TYPE,
        &elf::SHT_NULL.to_le_bytes(),
    );
    assert!(matches!(
        validate_error(&refuse(&bytes)),
        ValidateError::UnknownAllocType {
            index: 1,
            sh_type: 0,
            ..
        }
    ));
}

#[test]
fn relocation_section_whose_type_was_changed_is_refused_not_ignored() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    put(
        &mut bytes,
        elf.shdr(".rela.text") + SH_TYPE,
        &elf::SHT_PROGBITS.to_le_bytes(),
    );
    let err = refuse(&bytes);
    assert_eq!(
        error_chain(&err),
        "component two: section .rela.text (#2) looks like the relocations of loaded section .text (by its name) \
         but is of type 0x1, not SHT_RELA: they would not be applied"
    );
    // With its name changed too, SHF_INFO_LINK and sh_info still say what it applies to.
    let name_at = {
        let file = elf.file();
        let shstrtab = elf.contents(".shstrtab");
        let header = file
            .elf_section_table()
            .section(object::SectionIndex(2))
            .unwrap();
        shstrtab + usize::try_from(header.sh_name(LE)).unwrap()
    };
    assert_eq!(&bytes[name_at..name_at + 5], b".rela");
    bytes[name_at + 1] = b'x';
    let err = refuse(&bytes);
    assert!(
        matches!(validate_error(&err), ValidateError::NotRelocations { section, target, why: "by SHF_INFO_LINK and sh_info", .. } if section == ".xela.text" && target == ".text"),
        "{err}"
    );
    // Type, name and flags all changed: nothing says these bytes are relocations any more, and
    // the loader cannot tell them from an inert section that is not loaded (a limit of any
    // loader without a checksum over the object: trapvec records a CRC32 for that).
    let flags = elf.shdr(".rela.text") + SH_FLAGS;
    put(&mut bytes, flags, &0u64.to_le_bytes());
    ComponentManager::new()
        .load_bytes(&mut target(), "two", &bytes, &opts(), &mut NoExtra)
        .unwrap();
}

#[test]
fn rel_sections_are_refused_with_a_reason() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    put(
        &mut bytes,
        elf.shdr(".rela.eh_frame") + SH_TYPE,
        &elf::SHT_REL.to_le_bytes(),
    );
    assert_eq!(
        error_chain(&refuse(&bytes)),
        "component two: section .rela.eh_frame (#9) is SHT_REL: implicit-addend relocations are not used on x86-64 and are not supported"
    );
}

#[test]
fn relocations_sent_to_another_section_by_sh_info_are_refused() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    // .rela.text applying to .comment would be dropped with it; to .rodata, patch the wrong bytes.
    for target in [".comment", ".rodata"] {
        let index = u32::try_from(elf.section_index(target)).unwrap();
        put(
            &mut bytes,
            elf.shdr(".rela.text") + SH_INFO,
            &index.to_le_bytes(),
        );
        let err = refuse(&bytes);
        assert!(
            matches!(validate_error(&err), ValidateError::RelocationTargetMismatch { section, target: t, .. } if section == ".rela.text" && t == target),
            "{err}"
        );
    }
    put(
        &mut bytes,
        elf.shdr(".rela.text") + SH_INFO,
        &77u32.to_le_bytes(),
    );
    let err = refuse(&bytes);
    assert_eq!(
        *parse_err(&err),
        ParseError::RelocationTarget {
            section: ".rela.text".into(),
            index: 2,
            target: 77
        }
    );
}

fn parse_err(err: &ComponentError) -> &ParseError {
    match err {
        ComponentError::Parse { error, .. } => error,
        other => panic!("not a parse error: {other}"),
    }
}

// 4. Relocation places, widths and symbol indices.

#[test]
fn relocation_whose_field_runs_past_its_section_is_refused() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    let text = elf.size(".text");
    let at = elf.contents(".rela.text");
    put(&mut bytes, at + R_OFFSET, &(text - 2).to_le_bytes());
    let err = refuse(&bytes);
    assert_eq!(
        *reloc_error(&err),
        RelocError::OutOfBounds {
            kind: RelocType(elf::R_X86_64_PC32),
            section: ".text".into(),
            offset: text - 2,
            size: text
        }
    );
    put(&mut bytes, at + R_OFFSET, &u64::MAX.to_le_bytes());
    assert!(matches!(
        reloc_error(&refuse(&bytes)),
        RelocError::OutOfBounds {
            offset: u64::MAX,
            ..
        }
    ));
}

#[test]
fn relocation_symbol_index_past_the_symbol_table_is_refused() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    let at = elf.contents(".rela.text");
    put(&mut bytes, at + R_INFO + 4, &1000u32.to_le_bytes());
    let err = refuse(&bytes);
    assert_eq!(
        error_chain(&err),
        "component two: relocation #0 of .rela.text (at .text+0x6) names symbol index 1000, past the end of the symbol table (9 symbols)"
    );
}

// 5. RIP-relative targets.

#[test]
fn pc32_addend_leaving_its_section_is_refused() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    let at = elf.rela_against(elf.section_symbol(".rodata"));
    for addend in [0x10_0000i64, -0x20] {
        put(&mut bytes, at + R_ADDEND, &addend.to_le_bytes());
        let err = refuse(&bytes);
        let RelocError::TargetOutside {
            kind,
            section,
            symbol,
            addend: a,
            bound,
            ..
        } = reloc_error(&err)
        else {
            panic!("{err}")
        };
        assert_eq!(
            (kind.0, section.as_str(), symbol.as_str(), *a),
            (elf::R_X86_64_PC32, ".text", ".rodata", addend)
        );
        assert_eq!(bound, "section .rodata (0x10 bytes)");
    }
    // The last byte is still inside; one past the end (`&a[n]`) too.
    put(&mut bytes, at + R_ADDEND, &(0x10i64 - 4).to_le_bytes());
    ComponentManager::new()
        .load_bytes(&mut target(), "two", &bytes, &opts(), &mut NoExtra)
        .unwrap();
}

#[test]
fn call_addend_away_from_an_imported_function_is_refused() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    let at = elf.rela_against(elf.symbol_index("target_fn"));
    put(&mut bytes, at + R_ADDEND, &0x100i64.to_le_bytes());
    let err = refuse(&bytes);
    assert!(
        error_chain(&err).ends_with(&format!("against target_fn with addend 256: the instruction would reach outside function target_fn at {:#x}", NEAR + 0x1000)),
        "{err}"
    );
}

#[test]
fn got_load_addend_away_from_its_slot_is_refused() {
    let mut bytes = compile("two.c", &["-fPIC"]);
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    let at = elf.rela_against(elf.symbol_index("counter"));
    assert_eq!(
        u32::from_le_bytes(bytes[at + R_INFO..at + R_INFO + 4].try_into().unwrap()),
        elf::R_X86_64_REX_GOTPCRELX
    );
    put(&mut bytes, at + R_ADDEND, &4i64.to_le_bytes());
    let err = refuse(&bytes);
    assert!(
        matches!(reloc_error(&err), RelocError::TargetOutside { symbol, bound, .. } if symbol == "counter" && bound == "its GOT slot"),
        "{err}"
    );
}

// 6. Entry points and variables.

#[test]
fn entries_are_functions_in_code_and_variables_are_objects_in_data_of_their_size() {
    let (mut m, mut t) = (ComponentManager::new(), target());
    let id = m
        .load_bytes(&mut t, "two", &two(), &opts(), &mut NoExtra)
        .unwrap();
    let c = m.get(id).unwrap();
    let (_, handler) = m.entry("handler").unwrap();
    assert!(c.in_code_image(handler, 0x38));
    let (_, counter) = m.variable("counter", 4).unwrap();
    assert!(c.in_data_image(counter, 4));
    let err = m.entry("counter").unwrap_err();
    assert_eq!(error_chain(&err), format!("component two: counter at {counter:#x} cannot be executed: it lies in Bss memory, not in a code section"));
    let err = m.variable("counter", 8).unwrap_err();
    assert_eq!(error_chain(&err), format!("component two: counter at {counter:#x} cannot be accessed as a 8-byte variable: it is 4 bytes long"));
    assert!(
        matches!(m.variable("handler", 4).unwrap_err(), ComponentError::NotAVariable { symbol, .. } if symbol == "handler")
    );
    assert!(
        matches!(m.entry("nothing").unwrap_err(), ComponentError::UnknownSymbol { symbol } if symbol == "nothing")
    );
}

#[test]
fn handler_retyped_as_an_object_is_not_an_entry() {
    let mut bytes = two();
    let elf = Elf {
        bytes: &bytes.clone(),
    };
    let at = elf.sym("handler") + ST_INFO;
    bytes[at] = (elf::STB_GLOBAL << 4) | elf::STT_OBJECT;
    let (mut m, mut t) = (ComponentManager::new(), target());
    m.load_bytes(&mut t, "two", &bytes, &opts(), &mut NoExtra)
        .unwrap();
    assert!(
        matches!(m.entry("handler").unwrap_err(), ComponentError::NotAnEntry { reason, .. } if reason == "it is Object, not a function")
    );
    // An untyped label (what `as` makes of an assembly function without `.type`) is accepted.
    bytes[at] = (elf::STB_GLOBAL << 4) | elf::STT_NOTYPE;
    let (mut m, mut t) = (ComponentManager::new(), target());
    m.load_bytes(&mut t, "two", &bytes, &opts(), &mut NoExtra)
        .unwrap();
    m.entry("handler").unwrap();
}

#[test]
fn declared_handler_that_is_not_code_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("declared.c");
    std::fs::write(
        &src,
        "#include <trapvec.h>\nint hits;\nTRAPVEC_SPLICE_CALL(c, \"compute+0\", hits, \"trap\");\n",
    )
    .unwrap();
    let obj = dir.path().join("declared.o");
    let include = concat!(env!("CARGO_MANIFEST_DIR"), "/../components/include");
    assert!(std::process::Command::new("cc")
        .args(["-c", "-O2", "-I", include, "-o"])
        .arg(&obj)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    let err = refuse(&std::fs::read(&obj).unwrap());
    assert!(
        matches!(validate_error(&err), ValidateError::DeclaredHandler { at, handler, .. } if at == "compute+0" && handler == "hits"),
        "{err}"
    );
    assert!(
        error_chain(&err).ends_with("is not a function (its type is Object)"),
        "{err}"
    );
}

/// The checks refuse nothing a compiler makes: the seeds compiled the ways components are
/// (user space `-fPIC` or not, the kernel's code model with per-function sections, commons,
/// patchable entries and no unwind tables) all load.
#[test]
fn compiler_output_passes_validation_under_user_and_kernel_like_flags() {
    const KERNEL: u64 = 0xffff_ffff_a000_0000;
    let kernel_flags: &[&str] = &[
        "-mcmodel=kernel",
        "-fno-pic",
        "-mno-red-zone",
        "-ffunction-sections",
        "-fdata-sections",
        "-fcommon",
        "-fno-asynchronous-unwind-tables",
        "-fpatchable-function-entry=16,16",
    ];
    let sets: [(&[&str], u64); 4] = [
        (&[], NEAR),
        (&["-fPIC"], NEAR),
        (&["-O0", "-g"], NEAR),
        (kernel_flags, KERNEL),
    ];
    for fixture in ["two.c", "basic.c"] {
        for (flags, near) in sets {
            let bytes = compile(fixture, flags);
            let mut t = fake_target(&[("target_fn", near + 0x1000, SymbolKind::Function)]);
            let opts = LoadOptions {
                near,
                ..LoadOptions::default()
            };
            if let Err(e) =
                ComponentManager::new().load_bytes(&mut t, "seed", &bytes, &opts, &mut NoExtra)
            {
                panic!("{fixture} with {flags:?}: {e}");
            }
        }
    }
}
