//! Bad components: each is refused with a distinct error naming the culprit, and the target is
//! left with no live allocation.

mod common;

use common::{compile, fake_target, FakeKernel};
use component_manager::parse::ParseError;
use component_manager::reloc::{RelocError, RelocType};
use component_manager::{ComponentError, ComponentManager, LoadOptions, NoExtra};
use object::{Object as _, ObjectSection as _};
use trapvec::{error_chain, BlockKind, SymbolKind};

const NEAR: u64 = 0x5555_5555_0000;
const FAR_VAR: u64 = 0x7fff_f7e0_0010;

fn target() -> FakeKernel {
    fake_target(&[
        ("target_fn", NEAR + 0x1000, SymbolKind::Function),
        ("far_var", FAR_VAR, SymbolKind::Object),
    ])
}

fn opts() -> LoadOptions {
    LoadOptions {
        near: NEAR,
        ..LoadOptions::default()
    }
}

/// Load `bytes` as `name` into a fresh manager and target; the error, and the target to inspect.
fn refuse(name: &str, bytes: &[u8], opts: &LoadOptions) -> (ComponentError, FakeKernel) {
    let (mut m, mut t) = (ComponentManager::new(), target());
    let err = m
        .load_bytes(&mut t, name, bytes, opts, &mut NoExtra)
        .expect_err("the load must fail");
    assert_eq!(t.live_blocks(), 0, "{err}: nothing stays allocated");
    assert_eq!(m.iter().count(), 0);
    (err, t)
}

fn parse_error(err: &ComponentError) -> &ParseError {
    match err {
        ComponentError::Parse { error, .. } => error,
        other => panic!("not a parse error: {other}"),
    }
}

/// File offset of the first `Elf64_Rela` of `.rela.text`.
fn first_rela_text(bytes: &[u8]) -> usize {
    let file = object::File::parse(bytes).unwrap();
    let (offset, _) = file
        .section_by_name(".rela.text")
        .unwrap()
        .file_range()
        .unwrap();
    usize::try_from(offset).unwrap()
}

#[test]
fn truncated_files_are_refused_naming_what_could_not_be_read() {
    let bytes = compile("basic.c", &[]);
    let (err, t) = refuse("basic", &bytes[..10], &opts());
    assert_eq!(
        error_chain(&err),
        "component basic: file is 10 bytes, too short for an ELF identification (16 bytes)"
    );
    assert_eq!(t.allocs(), 0);
    let (err, _) = refuse("basic", &bytes[..40], &opts());
    assert!(
        error_chain(&err).starts_with("component basic: cannot read the ELF header (64 bytes): "),
        "{err}"
    );
    // The section headers are at the end of a `cc -c` object: cutting the tail loses them.
    let (err, _) = refuse("basic", &bytes[..bytes.len() - 1], &opts());
    assert!(
        error_chain(&err).starts_with("component basic: cannot read the section headers: "),
        "{err}"
    );
    for len in [0, 1, 16, 63, 64, 200, bytes.len() / 2] {
        let (err, t) = refuse("basic", &bytes[..len], &opts());
        assert!(
            matches!(
                parse_error(&err),
                ParseError::TooShort { .. } | ParseError::Malformed { .. }
            ),
            "{len}: {err}"
        );
        assert_eq!(t.allocs(), 0);
    }
}

#[test]
fn wrong_machine_is_refused_naming_it() {
    let mut bytes = compile("basic.c", &[]);
    bytes[18..20].copy_from_slice(&object::elf::EM_AARCH64.to_le_bytes());
    let (err, _) = refuse("basic", &bytes, &opts());
    assert_eq!(
        error_chain(&err),
        "component basic: machine is EM_AARCH64 (183), expected EM_X86_64"
    );
    assert_eq!(
        *parse_error(&err),
        ParseError::Machine {
            name: "EM_AARCH64",
            value: 183
        }
    );
}

#[test]
fn objects_that_are_not_relocatable_64_bit_little_endian_elf_are_refused() {
    let good = compile("basic.c", &[]);
    let mut dyn_ = good.clone();
    dyn_[16..18].copy_from_slice(&object::elf::ET_DYN.to_le_bytes());
    let (err, _) = refuse("basic", &dyn_, &opts());
    assert_eq!(error_chain(&err), "component basic: type is ET_DYN (3), expected ET_REL (a relocatable object, as `cc -c` makes)");
    let mut class32 = good.clone();
    class32[4] = object::elf::ELFCLASS32;
    assert_eq!(
        *parse_error(&refuse("basic", &class32, &opts()).0),
        ParseError::Class {
            name: "ELFCLASS32",
            value: 1
        }
    );
    let mut big = good.clone();
    big[5] = object::elf::ELFDATA2MSB;
    assert!(matches!(
        parse_error(&refuse("basic", &big, &opts()).0),
        ParseError::Encoding { value: 2, .. }
    ));
    let (err, _) = refuse("notes", b"just some text, not an object file", &opts());
    assert_eq!(
        error_chain(&err),
        "component notes: not an ELF file (first bytes 6a 75 73 74)"
    );
}

#[test]
fn thread_local_variable_is_refused_as_an_unsupported_relocation() {
    let bytes = compile("tls.c", &[]);
    let (err, t) = refuse("tls", &bytes, &opts());
    let ComponentError::Reloc { error, .. } = &err else {
        panic!("{err}")
    };
    let RelocError::Unsupported {
        kind,
        section,
        offset,
    } = &**error
    else {
        panic!("{err}")
    };
    assert_eq!(
        (*kind, section.as_str()),
        (RelocType(object::elf::R_X86_64_TPOFF32), ".text")
    );
    assert_eq!(
        error_chain(&err),
        format!(
            "component tls: relocation R_X86_64_TPOFF32 (23) at .text+{offset:#x} is not supported"
        )
    );
    assert_eq!(t.allocs(), 0, "refused before allocating");
}

#[test]
fn patched_relocation_type_is_refused_naming_number_section_and_offset() {
    let mut bytes = compile("basic.c", &[]);
    let rela = first_rela_text(&bytes);
    let r_offset = u64::from_le_bytes(bytes[rela..rela + 8].try_into().unwrap());
    bytes[rela + 8..rela + 12].copy_from_slice(&object::elf::R_X86_64_GOTTPOFF.to_le_bytes());
    let (err, _) = refuse("basic", &bytes, &opts());
    assert_eq!(error_chain(&err), format!("component basic: relocation R_X86_64_GOTTPOFF (22) at .text+{r_offset:#x} is not supported"));
    bytes[rela + 8..rela + 12].copy_from_slice(&250u32.to_le_bytes());
    let (err, _) = refuse("basic", &bytes, &opts());
    assert_eq!(error_chain(&err), format!("component basic: relocation of unknown type 250 at .text+{r_offset:#x} is not supported"));
}

#[test]
fn unresolved_symbols_are_all_named() {
    let bytes = compile("unresolved.c", &[]);
    let (err, t) = refuse("unresolved", &bytes, &opts());
    assert_eq!(
        error_chain(&err),
        "component unresolved: unresolved symbols: missing_one, missing_two \
         (searched the loaded components, the caller's extra symbols and the target)"
    );
    assert_eq!(t.allocs(), 0);
}

#[test]
fn crc_mismatch_is_refused_naming_both_values() {
    let bytes = compile("basic.c", &[]);
    let actual = crc32fast::hash(&bytes);
    let expected = actual ^ 0x8000_0001;
    let (err, t) = refuse(
        "basic",
        &bytes,
        &LoadOptions {
            expected_crc32: Some(expected),
            ..opts()
        },
    );
    assert_eq!(
        error_chain(&err),
        format!("component basic: CRC32 of the file is {actual:#010x}, expected {expected:#010x}")
    );
    assert_eq!(t.allocs(), 0);
}

#[test]
fn duplicate_global_definition_is_refused_naming_both_components() {
    let (mut m, mut t) = (ComponentManager::new(), target());
    m.load_bytes(
        &mut t,
        "basic",
        &compile("basic.c", &[]),
        &opts(),
        &mut NoExtra,
    )
    .unwrap();
    let err = m
        .load_bytes(
            &mut t,
            "duplicate",
            &compile("duplicate.c", &[]),
            &opts(),
            &mut NoExtra,
        )
        .unwrap_err();
    assert_eq!(
        error_chain(&err),
        "component duplicate: global symbol calls_target is already defined by component basic"
    );
    assert_eq!((t.allocs(), t.live_blocks()), (2, 2), "only basic's blocks");
}

#[test]
fn pc32_to_far_data_is_refused_and_the_allocated_blocks_are_freed() {
    let bytes = compile("far_data.c", &[]);
    let (err, t) = refuse("far_data", &bytes, &opts());
    let ComponentError::Reloc { error, .. } = &err else {
        panic!("{err}")
    };
    let RelocError::FarData {
        symbol,
        section,
        target,
        ..
    } = &**error
    else {
        panic!("{err}")
    };
    assert_eq!(
        (symbol.as_str(), section.as_str(), *target),
        ("far_var", ".text", FAR_VAR)
    );
    assert!(error_chain(&err).starts_with("component far_data: relocation R_X86_64_PC32 (2) at .text+0x2 against data symbol far_var at 0x7ffff7e00010: out of rel32 reach"), "{err}");
    assert_eq!((t.allocs(), t.frees()), (2, 2));
}

#[test]
fn relocation_against_the_unloaded_splices_section_is_refused() {
    let bytes = compile("splice_ref.c", &[]);
    let (err, _) = refuse("splice_ref", &bytes, &opts());
    let ComponentError::Reloc { error, .. } = &err else {
        panic!("{err}")
    };
    assert!(
        matches!(&**error, RelocError::NotLoaded { symbol_section, .. } if symbol_section == ".trapvec.splices"),
        "{err}"
    );
    assert!(
        error_chain(&err)
            .ends_with("which is not loaded (declared splices are parsed, not loaded)"),
        "{err}"
    );
}

#[test]
fn refused_data_allocation_frees_the_code_block() {
    let bytes = compile("basic.c", &[]);
    let (mut m, mut t) = (ComponentManager::new(), target());
    t.state().refuse_alloc = Some(BlockKind::Data);
    let err = m
        .load_bytes(&mut t, "basic", &bytes, &opts(), &mut NoExtra)
        .unwrap_err();
    assert!(
        error_chain(&err).starts_with("component basic: allocating the data block ("),
        "{err}"
    );
    assert_eq!((t.allocs(), t.frees(), t.live_blocks()), (1, 1, 0));
    // The failure left no trace: the same component loads afterwards.
    t.state().refuse_alloc = None;
    m.load_bytes(&mut t, "basic", &bytes, &opts(), &mut NoExtra)
        .unwrap();
}

#[test]
fn constructors_are_refused_naming_the_section() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("ctor.c");
    std::fs::write(&src, "static int x;\n__attribute__((constructor)) static void init(void) { x = 1; }\nint get(void) { return x; }\n").unwrap();
    let obj = dir.path().join("ctor.o");
    assert!(std::process::Command::new("cc")
        .args(["-c", "-O2", "-o"])
        .arg(&obj)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    let (err, _) = refuse("ctor", &std::fs::read(&obj).unwrap(), &opts());
    assert_eq!(error_chain(&err), "component ctor: section .init_array: constructors and destructors are not supported (the loader runs none)");
}
