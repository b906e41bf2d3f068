//! Loading real components (C compiled at test time) into the fake target: every relocated
//! field is decoded from the repository and checked to point where it must.

mod common;

use common::{compile, compile_to, fake_target, FakeKernel};
use component_manager::parse;
use component_manager::reloc::RelocType;
use component_manager::resolve::ResolveError;
use component_manager::{
    ComponentError, ComponentId, ComponentManager, DeclaredSplice, ExtraSymbols, LoadOptions,
    NoExtra,
};
use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind};
use object::elf;
use trapvec::{error_chain, SymbolKind, Target};

/// Where "the executable" is: blocks are allocated near it.
const NEAR: u64 = 0x5555_5555_0000;
const TARGET_FN: u64 = NEAR + 0x1000;
const EXT_FN: u64 = NEAR + 0x2000;
const EXT_VAR: u64 = NEAR + 0x4000;
/// A library function more than 2 GiB away.
const PUTS: u64 = 0x7fff_f7a5_0e50;

fn target() -> FakeKernel {
    fake_target(&[
        ("target_fn", TARGET_FN, SymbolKind::Function),
        ("ext_fn", EXT_FN, SymbolKind::Function),
        ("ext_var", EXT_VAR, SymbolKind::Object),
        ("puts", PUTS, SymbolKind::Function),
    ])
}

fn opts() -> LoadOptions {
    LoadOptions {
        near: NEAR,
        ..LoadOptions::default()
    }
}

fn load(
    m: &mut ComponentManager,
    t: &mut FakeKernel,
    fixture: &str,
    flags: &[&str],
) -> ComponentId {
    let bytes = compile(fixture, flags);
    let name = fixture.trim_end_matches(".c");
    m.load_bytes(t, name, &bytes, &opts(), &mut NoExtra)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn sym(m: &ComponentManager, id: ComponentId, name: &str) -> (u64, u64) {
    let s = m
        .get(id)
        .unwrap()
        .symbol(name)
        .unwrap_or_else(|| panic!("no symbol {name}"));
    (s.addr, s.size)
}

/// Decode function `name` of component `id` from the target's memory.
fn decode(m: &ComponentManager, t: &FakeKernel, id: ComponentId, name: &str) -> Vec<Instruction> {
    let (addr, size) = sym(m, id, name);
    let bytes = t.read(addr, usize::try_from(size).unwrap()).unwrap();
    Decoder::with_ip(64, &bytes, addr, DecoderOptions::NONE)
        .into_iter()
        .collect()
}

fn find(insns: &[Instruction], mnemonic: Mnemonic) -> Instruction {
    *insns
        .iter()
        .find(|i| i.mnemonic() == mnemonic)
        .unwrap_or_else(|| panic!("no {mnemonic:?} in {insns:?}"))
}

fn rip_target(insns: &[Instruction], mnemonic: Mnemonic) -> u64 {
    let i = insns
        .iter()
        .find(|i| i.mnemonic() == mnemonic && i.is_ip_rel_memory_operand())
        .unwrap_or_else(|| panic!("no rip-relative {mnemonic:?}"));
    i.ip_rel_memory_address()
}

fn c_string(t: &FakeKernel, addr: u64) -> String {
    let mut s = Vec::new();
    while let [b] = t.text(addr + s.len() as u64, 1)[..] {
        if b == 0 {
            break;
        }
        s.push(b);
    }
    String::from_utf8(s).unwrap()
}

fn reloc_types(bytes: &[u8]) -> Vec<u32> {
    parse::parse(bytes)
        .unwrap()
        .relocations
        .iter()
        .map(|r| r.r_type)
        .collect()
}

#[test]
fn call_to_target_symbol_counter_and_rodata_string_point_where_they_must() {
    let (mut m, mut t) = (ComponentManager::new(), target());
    let id = load(&mut m, &mut t, "basic.c", &[]);
    let c = m.get(id).unwrap();
    let (counter, _) = sym(&m, id, "counter");
    assert!(
        c.data.contains(counter),
        "counter {counter:#x} is in the data block"
    );
    assert_eq!(
        t.text(counter, 4),
        [0; 4],
        "bss is zeroed (the fake fills fresh blocks with 0xAA)"
    );

    let f = decode(&m, &t, id, "calls_target");
    assert_eq!(find(&f, Mnemonic::Call).near_branch_target(), TARGET_FN);
    assert_eq!(rip_target(&f, Mnemonic::Add), counter);

    let greet = decode(&m, &t, id, "greet");
    let s = rip_target(&greet, Mnemonic::Lea);
    assert!(c.data.contains(s));
    assert_eq!(c_string(&t, s), "hello from a component");

    assert!(t.is_sealed(c.code_addr));
    assert_eq!((t.allocs(), t.seals(), t.live_blocks()), (2, 1, 2));
    assert_eq!(c.imports, vec![("target_fn".to_string(), TARGET_FN)]);
    assert!(
        c.stubs.is_empty(),
        "target_fn is within reach: no stub used"
    );
    assert_eq!(
        c.code_crc32,
        crc32fast::hash(&t.text(c.code_addr, c.code_len))
    );
}

#[test]
fn call_to_another_components_export_binds_to_it_and_pins_it_until_the_importer_goes() {
    let (mut m, mut t) = (ComponentManager::new(), target());
    let basic = load(&mut m, &mut t, "basic.c", &[]);
    let user = load(&mut m, &mut t, "user.c", &[]);
    let (calls_target, _) = sym(&m, basic, "calls_target");
    assert_eq!(m.lookup("calls_target"), Some((basic, calls_target)));
    assert_eq!(
        find(&decode(&m, &t, user, "use_other"), Mnemonic::Call).near_branch_target(),
        calls_target
    );
    assert_eq!(
        m.get(user).unwrap().imports,
        vec![("calls_target".to_string(), calls_target)]
    );
    assert!(m.get(user).unwrap().depends_on.contains(&basic));

    let err = m.unload(&mut t, basic).unwrap_err();
    assert_eq!(error_chain(&err), "component basic is imported by user");
    assert!(
        t.state().quiesced.is_empty(),
        "a refused unload does not even quiesce"
    );
    m.unload(&mut t, user).unwrap();
    m.unload(&mut t, basic).unwrap();
    assert_eq!((t.live_blocks(), t.frees()), (0, 4));
    assert_eq!(m.lookup("calls_target"), None);
}

#[test]
fn far_library_call_goes_through_a_stub_jumping_through_a_got_slot() {
    let (mut m, mut t) = (ComponentManager::new(), target());
    let id = load(&mut m, &mut t, "far_call.c", &[]);
    let c = m.get(id).unwrap().clone();
    let call = find(&decode(&m, &t, id, "say"), Mnemonic::Call).near_branch_target();
    assert!(
        c.code.contains(call),
        "the call lands in the component's own code block"
    );
    assert_eq!(c.stubs, vec![("puts".to_string(), call)]);

    let stub: Vec<Instruction> = Decoder::with_ip(64, &t.text(call, 6), call, DecoderOptions::NONE)
        .into_iter()
        .collect();
    assert_eq!(stub.len(), 1);
    assert_eq!(stub[0].mnemonic(), Mnemonic::Jmp);
    assert!(stub[0].is_ip_rel_memory_operand());
    let slot = stub[0].ip_rel_memory_address();
    assert!(c.data.contains(slot), "the slot is in the data block");
    assert_eq!(t.text_u64(slot), PUTS);
    assert_eq!(
        c_string(&t, rip_target(&decode(&m, &t, id, "say"), Mnemonic::Lea)),
        "far away"
    );
}

/// Answers `__trapvec_orig_<fn>` as the instr-manager does, and records what it was asked.
struct Originals {
    asked: Vec<String>,
    answer: Result<u64, String>,
}

impl ExtraSymbols for Originals {
    fn resolve(&mut self, _target: &dyn Target, name: &str) -> Option<Result<u64, ResolveError>> {
        self.asked.push(name.to_string());
        let extra = |reason: &String| ResolveError::Extra {
            symbol: name.to_string(),
            reason: reason.clone(),
        };
        name.starts_with("__trapvec_orig_")
            .then(|| self.answer.as_ref().copied().map_err(extra))
    }
}

#[test]
fn trapvec_orig_import_is_answered_by_extra_symbols_and_declared_splices_are_parsed() {
    let (mut m, mut t) = (ComponentManager::new(), target());
    let bytes = compile("orig.c", &[]);
    let mut extra = Originals {
        asked: vec![],
        answer: Ok(NEAR + 0x9000),
    };
    let id = m
        .load_bytes(&mut t, "orig", &bytes, &opts(), &mut extra)
        .unwrap();
    assert_eq!(extra.asked, ["__trapvec_orig_compute"]);
    assert_eq!(
        find(&decode(&m, &t, id, "my_compute"), Mnemonic::Call).near_branch_target(),
        NEAR + 0x9000
    );
    let c = m.get(id).unwrap();
    let mut declared = c.declared_splices.clone();
    declared.sort_by(|a, b| a.at().cmp(b.at()));
    assert_eq!(
        declared,
        vec![
            DeclaredSplice::parse("at=compute;action=replace;handler=my_compute;mechanism=trap")
                .unwrap(),
            DeclaredSplice::parse("at=compute+4;action=call;handler=count_hits;mechanism=jmp")
                .unwrap(),
        ]
    );
    // The static handler is found through the component, not exported.
    let handler = c.symbol("count_hits").unwrap();
    assert!(!handler.global && c.code.contains(handler.addr));
    assert_eq!(m.lookup("count_hits"), None);
    assert_eq!(
        m.lookup("my_compute"),
        Some((id, c.symbol("my_compute").unwrap().addr))
    );
    // Nothing of .trapvec.splices was loaded: the splice strings are not in the data block.
    let data = t.text(c.data_addr, c.data.size);
    assert!(!data.windows(3).any(|w| w == b"at="));
}

#[test]
fn an_extra_symbol_that_cannot_be_had_fails_the_load_naming_it() {
    let (mut m, mut t) = (ComponentManager::new(), target());
    let bytes = compile("orig.c", &[]);
    let mut extra = Originals {
        asked: vec![],
        answer: Err("compute has no replace splice".into()),
    };
    let err = m
        .load_bytes(&mut t, "orig", &bytes, &opts(), &mut extra)
        .unwrap_err();
    assert_eq!(
        error_chain(&err),
        "component orig: symbol __trapvec_orig_compute: compute has no replace splice"
    );
    assert_eq!((t.allocs(), t.live_blocks()), (0, 0));
}

#[test]
fn pic_code_reaches_globals_through_got_slots_of_every_gotpcrel_flavour() {
    for (flags, kind) in [
        (&["-fPIC"][..], elf::R_X86_64_REX_GOTPCRELX),
        (
            &["-fPIC", "-Wa,-mrelax-relocations=no"][..],
            elf::R_X86_64_GOTPCREL,
        ),
        (&["-fPIC", "-fno-plt"][..], elf::R_X86_64_GOTPCRELX),
    ] {
        let bytes = compile("got.c", flags);
        assert!(
            reloc_types(&bytes).contains(&kind),
            "{flags:?} gives {}",
            RelocType(kind)
        );
        let (mut m, mut t) = (ComponentManager::new(), target());
        let id = m
            .load_bytes(&mut t, "got", &bytes, &opts(), &mut NoExtra)
            .unwrap();
        let data = m.get(id).unwrap().data.clone();

        let slot = rip_target(&decode(&m, &t, id, "read_ext"), Mnemonic::Mov);
        assert!(data.contains(slot));
        assert_eq!(t.text_u64(slot), EXT_VAR, "{flags:?}");

        let slot = rip_target(&decode(&m, &t, id, "own_counter_addr"), Mnemonic::Mov);
        let (own_counter, _) = sym(&m, id, "own_counter");
        assert!(data.contains(slot) && data.contains(own_counter));
        assert_eq!(t.text_u64(slot), own_counter, "{flags:?}");

        let call = find(&decode(&m, &t, id, "call_ext"), Mnemonic::Call);
        if call.op0_kind() == OpKind::Memory {
            // -fno-plt: call qword ptr [rip+slot].
            assert_eq!(t.text_u64(call.ip_rel_memory_address()), EXT_FN);
        } else {
            assert_eq!(call.near_branch_target(), EXT_FN);
        }
    }
}

#[test]
fn function_pointer_table_holds_absolute_addresses() {
    let (mut m, mut t) = (ComponentManager::new(), target());
    let id = load(&mut m, &mut t, "table.c", &[]);
    let (table, size) = sym(&m, id, "table");
    let (local_fn, _) = sym(&m, id, "local_fn");
    assert_eq!(size, 16);
    assert_eq!(
        (t.text_u64(table), t.text_u64(table + 8)),
        (TARGET_FN, local_fn)
    );
}

#[test]
fn abs32_links_in_the_low_4gib_and_is_refused_above_with_nothing_left_allocated() {
    let bytes = compile("abs32.c", &["-fno-pic", "-mcmodel=small"]);
    assert_eq!(reloc_types(&bytes).first(), Some(&elf::R_X86_64_32));
    let (mut m, mut t) = (ComponentManager::new(), target());
    let low = LoadOptions {
        near: 0x40_0000,
        ..opts()
    };
    let id = m
        .load_bytes(&mut t, "abs32", &bytes, &low, &mut NoExtra)
        .unwrap();
    let (value, _) = sym(&m, id, "value");
    let mov = find(&decode(&m, &t, id, "value_addr"), Mnemonic::Mov);
    assert_eq!(mov.op1_kind(), OpKind::Immediate32);
    assert_eq!(u64::from(mov.immediate32()), value);
    assert_eq!(t.text(value, 4), 42i32.to_le_bytes());

    let (mut m, mut t) = (ComponentManager::new(), target());
    let err = m
        .load_bytes(&mut t, "abs32", &bytes, &opts(), &mut NoExtra)
        .unwrap_err();
    let data_addr = NEAR + 0x2_0000; // the fake's second block: the data block
    assert_eq!(
        error_chain(&err),
        format!("component abs32: relocation R_X86_64_32 (10) at .text+0x1 against value: value {data_addr:#x} does not fit in 32 bits (zero-extended)")
    );
    assert_eq!((t.allocs(), t.frees(), t.live_blocks()), (2, 2, 0));
}

#[test]
fn abs32s_links_the_kernel_code_model_in_the_top_2gib() {
    let bytes = compile("abs32.c", &["-fno-pic", "-mcmodel=kernel"]);
    assert_eq!(reloc_types(&bytes).first(), Some(&elf::R_X86_64_32S));
    let (mut m, mut t) = (ComponentManager::new(), target());
    let kernel = LoadOptions {
        near: 0xffff_ffff_a000_0000,
        ..opts()
    };
    let id = m
        .load_bytes(&mut t, "abs32", &bytes, &kernel, &mut NoExtra)
        .unwrap();
    let (value, _) = sym(&m, id, "value");
    let mov = find(&decode(&m, &t, id, "value_addr"), Mnemonic::Mov);
    assert_eq!(mov.op1_kind(), OpKind::Immediate32to64);
    assert_eq!(mov.immediate(1), value, "sign-extended immediate");
}

#[test]
fn verify_detects_a_modified_code_image() {
    let (mut m, mut t) = (ComponentManager::new(), target());
    let id = load(&mut m, &mut t, "basic.c", &[]);
    m.verify(&t, id).unwrap();
    let c = m.get(id).unwrap().clone();
    let (f, _) = sym(&m, id, "greet");
    t.poke(f, &[0xC3]);
    let err = m.verify(&t, id).unwrap_err();
    let actual = crc32fast::hash(&t.text(c.code_addr, c.code_len));
    assert!(
        matches!(err, ComponentError::CodeModified { expected, actual: a, .. } if expected == c.code_crc32 && a == actual)
    );
    assert_eq!(
        error_chain(&err),
        format!(
            "component basic: code at {:#x} ({} bytes) has CRC32 {actual:#010x}, expected {:#010x} as written",
            c.code_addr, c.code_len, c.code_crc32
        )
    );
}

#[test]
fn unload_waits_for_release_then_quiesces_and_frees_both_blocks() {
    let (mut m, mut t) = (ComponentManager::new(), target());
    let id = load(&mut m, &mut t, "basic.c", &[]);
    assert_eq!(m.acquire(id).unwrap(), 1);
    assert_eq!(m.acquire(id).unwrap(), 2);
    assert_eq!(
        error_chain(&m.unload(&mut t, id).unwrap_err()),
        "component basic is in use by 2 splice(s)"
    );
    assert_eq!(m.release(id).unwrap(), 1);
    assert_eq!(m.release(id).unwrap(), 0);
    assert!(matches!(
        m.release(id),
        Err(ComponentError::NotAcquired { .. })
    ));
    let c = m.get(id).unwrap().clone();
    m.unload(&mut t, id).unwrap();
    let range = |b: &trapvec::RepoBlock| (b.addr, b.addr + b.size as u64);
    assert_eq!(
        t.state().quiesced,
        vec![vec![range(&c.code), range(&c.data)]]
    );
    assert_eq!((t.frees(), t.live_blocks()), (2, 0));
    assert!(m.get(id).is_none());
    assert!(matches!(m.unload(&mut t, id), Err(ComponentError::UnknownId(i)) if i == id));
}

#[test]
fn load_path_maps_the_file_and_names_the_component_after_its_stem() {
    let dir = tempfile::tempdir().unwrap();
    let path = compile_to("basic.c", &[], dir.path());
    let (mut m, mut t) = (ComponentManager::new(), target());
    let id = m.load_path(&mut t, &path, &opts(), &mut NoExtra).unwrap();
    let c = m.get(id).unwrap().clone();
    assert_eq!(
        (c.name.as_str(), c.label.as_str(), c.path.as_deref()),
        ("basic", "basic.o", Some(path.as_path()))
    );
    assert_eq!(
        c.file_crc32,
        crc32fast::hash(&std::fs::read(&path).unwrap())
    );
    assert_eq!(m.by_name("basic"), Some(id));
    assert_eq!(m.owner_of(c.code_addr + 1), Some(id));
    assert_eq!(m.owner_of(c.data_addr), Some(id));
    assert_eq!(m.owner_of(TARGET_FN), None);
    assert_eq!(m.iter().map(|c| c.id).collect::<Vec<_>>(), vec![id]);

    // The same name twice is refused; under another name, the strong globals clash.
    let err = m
        .load_path(&mut t, &path, &opts(), &mut NoExtra)
        .unwrap_err();
    assert_eq!(
        error_chain(&err),
        format!("component basic.o: a component named \"basic\" is already loaded ({id})")
    );
    let other = LoadOptions {
        name: Some("basic2".into()),
        expected_crc32: Some(c.file_crc32),
        ..opts()
    };
    let err = m
        .load_path(&mut t, &path, &other, &mut NoExtra)
        .unwrap_err();
    assert_eq!(
        error_chain(&err),
        "component basic.o: global symbol calls_target is already defined by component basic.o"
    );
    assert_eq!(t.live_blocks(), 2);

    let missing = dir.path().join("missing.o");
    let err = m
        .load_path(&mut t, &missing, &opts(), &mut NoExtra)
        .unwrap_err();
    assert!(
        error_chain(&err).starts_with(&format!(
            "component {}: cannot read the file: ",
            missing.display()
        )),
        "{err}"
    );
}

#[test]
fn blocks_not_aligned_for_their_sections_are_padded() {
    let (mut m, mut t) = (ComponentManager::new(), target());
    t.state().misalign = 8;
    let id = load(&mut m, &mut t, "basic.c", &[]);
    let c = m.get(id).unwrap();
    assert_eq!(c.code.addr % 16, 8, "the fake hands out 8-aligned blocks");
    assert_eq!(c.code_addr % 16, 0, ".text is 16-aligned");
    assert!(c.code.contains(c.code_addr) && c.code.contains(c.code_addr + c.code_len as u64 - 1));
    // Each misaligned first attempt was given back.
    assert_eq!(t.live_blocks(), 2);
    assert_eq!(t.allocs() - t.frees(), 2);
    assert_eq!(
        find(&decode(&m, &t, id, "calls_target"), Mnemonic::Call).near_branch_target(),
        TARGET_FN
    );
}

#[test]
fn eh_frame_is_dropped_with_its_relocations() {
    let bytes = compile("basic.c", &["-fasynchronous-unwind-tables"]);
    let obj = parse::parse(&bytes).unwrap();
    let eh = obj
        .sections
        .iter()
        .find(|s| s.name == ".eh_frame")
        .expect("cc emits .eh_frame");
    assert!(!eh.placement.is_loaded());
    assert!(
        obj.relocations.iter().all(|r| r.section != eh.index),
        "its relocations are dropped"
    );
    let loaded: u64 = obj
        .sections
        .iter()
        .filter(|s| s.placement.is_loaded())
        .map(|s| s.size)
        .sum();
    let (mut m, mut t) = (ComponentManager::new(), target());
    let id = m
        .load_bytes(&mut t, "basic", &bytes, &opts(), &mut NoExtra)
        .unwrap();
    let c = m.get(id).unwrap();
    assert!(
        ((c.code_len + c.data.size) as u64) < loaded + eh.size,
        "the blocks hold less than everything including .eh_frame"
    );
}

#[test]
fn common_symbols_get_zeroed_space_in_the_data_block() {
    let bytes = compile("basic.c", &["-fcommon"]);
    let obj = parse::parse(&bytes).unwrap();
    let counter = obj.symbols.iter().find(|s| s.name == "counter").unwrap();
    assert!(
        matches!(counter.def, parse::SymbolDef::Common { .. }),
        "-fcommon makes counter a common symbol"
    );
    let (mut m, mut t) = (ComponentManager::new(), target());
    let id = m
        .load_bytes(&mut t, "basic", &bytes, &opts(), &mut NoExtra)
        .unwrap();
    let (counter, size) = sym(&m, id, "counter");
    assert_eq!(size, 4);
    assert!(m.get(id).unwrap().data.contains(counter));
    assert_eq!(counter % 4, 0);
    assert_eq!(t.text(counter, 4), [0; 4]);
    assert_eq!(
        rip_target(&decode(&m, &t, id, "calls_target"), Mnemonic::Add),
        counter
    );
}
