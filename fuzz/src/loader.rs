//! The component loader: any bytes loaded as a component into the fake target (trapvec's one,
//! as a repository) whose allocator, writer and sealer check every call. A component that loads has every symbol inside the
//! part of its image its place names, passes [`ComponentManager::verify`], and unloads leaving
//! no block allocated; a refused one allocated nothing that is still live.

use component_manager::resolve::ResolveError;
use component_manager::{ComponentManager, ExtraSymbols, Limits, LoadOptions, SymbolPlace};
use trapvec::fake::FakeKernel;
use trapvec::{Symbol, SymbolKind, Target, TargetInfo};

use crate::assert_sentence;

/// The code the component would patch (its blocks are allocated within reach of it).
pub const NEAR: u64 = 0x5555_5555_0000;
/// The image ceiling used here: 1 MiB, so that huge sizes are refused quickly and the fake
/// allocator stays cheap (the default is 16 MiB; the check is the same).
pub const MAX_IMAGE: u64 = 1 << 20;

/// The largest block the loader may ask for: its image ceiling and the pages it rounds to.
const MAX_BLOCK: usize = (1 << 20) + 3 * 4096;
const _: () = assert!(MAX_BLOCK as u64 == MAX_IMAGE + 3 * 4096);

/// The fake repository: trapvec's one fake target ([`FakeKernel::repository`]), which checks
/// every write and seal against its block and panics on misuse, with the symbols components
/// import and the loader's ceiling as the largest block.
pub fn fake_target() -> FakeKernel {
    let f = |name: &str, addr: u64, kind: SymbolKind| Symbol {
        name: name.into(),
        addr,
        size: 16,
        kind,
        origin: None,
        version: None,
    };
    let symbols = vec![
        f("target_fn", NEAR + 0x1000, SymbolKind::Function),
        f("ext_fn", NEAR + 0x2000, SymbolKind::Function),
        f("ext_var", NEAR + 0x4000, SymbolKind::Object),
        f("puts", 0x7fff_f7a5_0e50, SymbolKind::Function),
        f("atoi", 0x7fff_f7a4_0e50, SymbolKind::Function),
        f("calls_target", NEAR + 0x5000, SymbolKind::Function),
        f("cm_e2e_host_add", NEAR + 0x6000, SymbolKind::Function),
        f(
            "__trapvec_orig_compute",
            NEAR + 0x7000,
            SymbolKind::Function,
        ),
        // Beyond ±2 GiB of the component: reached through the GOT or refused.
        f("far_var", NEAR + (8 << 30), SymbolKind::Object),
    ];
    let t = FakeKernel::repository(TargetInfo::user("fuzz target"), symbols);
    t.state().max_block = MAX_BLOCK;
    t
}

/// What the loader must never have done to `t`, whatever the input: ask for a block the
/// repository refuses (empty, beyond its image ceiling, out of reach: it checks first), touch
/// text or the dispatcher, or leave a block allocated.
fn assert_only_blocks_used_and_given_back(t: &FakeKernel) {
    let s = t.state();
    assert!(
        s.refused_allocs.is_empty(),
        "the loader asked for blocks the repository refused: {:?}",
        s.refused_allocs
    );
    assert_eq!(s.batches, 0, "the loader patched text");
    assert!(s.dispatch.is_empty(), "the loader added dispatch entries");
    assert_eq!(
        s.blocks.len(),
        0,
        "blocks left allocated after the load and unload"
    );
}

/// Answers names that start with `extra_` (a hash-derived address near [`NEAR`], or a refusal
/// when the name ends in `_gone`), as the instr-manager answers `__trapvec_orig_<fn>`.
pub struct FakeExtra;

impl ExtraSymbols for FakeExtra {
    fn resolve(&mut self, _target: &dyn Target, name: &str) -> Option<Result<u64, ResolveError>> {
        let rest = name.strip_prefix("extra_")?;
        if rest.ends_with("_gone") {
            return Some(Err(ResolveError::Extra {
                symbol: name.to_string(),
                reason: format!("`{name}` is gone"),
            }));
        }
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        Some(Ok(NEAR + 0x8000 + (h % 0x1_0000) * 16))
    }
}

pub fn run(data: &[u8]) {
    let mut t = fake_target();
    let mut m = ComponentManager::with_limits(Limits {
        max_image: MAX_IMAGE,
        ..Limits::default()
    });
    let opts = LoadOptions {
        near: NEAR,
        ..LoadOptions::default()
    };
    match m.load_bytes(&mut t, "fuzz", data, &opts, &mut FakeExtra) {
        Ok(id) => {
            let c = m.get(id).expect("a loaded component is listed");
            for s in &c.symbols {
                let inside = match s.place {
                    SymbolPlace::Code => c.in_code_image(s.addr, s.size),
                    SymbolPlace::Data | SymbolPlace::Bss | SymbolPlace::Common => {
                        c.in_data_image(s.addr, s.size)
                    }
                    SymbolPlace::Unknown => {
                        c.in_code_image(s.addr, s.size) || c.in_data_image(s.addr, s.size)
                    }
                };
                assert!(
                    inside,
                    "symbol `{}` at {:#x} ({} bytes, {:?}) lies outside the component's image",
                    s.name, s.addr, s.size, s.place
                );
            }
            for (name, stub) in &c.stubs {
                assert!(
                    c.in_code_image(*stub, 1),
                    "the stub of `{name}` at {stub:#x} lies outside the code image"
                );
            }
            let handlers: Vec<String> = c
                .symbols
                .iter()
                .filter(|s| s.kind == SymbolKind::Function)
                .map(|s| s.name.clone())
                .collect();
            for h in handlers {
                if let Ok((_, addr)) = m.entry(&h) {
                    let c = m.get(id).expect("still loaded");
                    assert!(
                        c.in_code_image(addr, 1),
                        "entry `{h}` at {addr:#x} lies outside the code image"
                    );
                }
            }
            m.verify(&t, id)
                .unwrap_or_else(|e| panic!("a component that loaded does not verify: {e}"));
            m.unload(&mut t, id)
                .unwrap_or_else(|e| panic!("a component that loaded does not unload: {e}"));
        }
        Err(e) => assert_sentence("load", &trapvec::error_chain(&e)),
    }
    assert_only_blocks_used_and_given_back(&t);
}
