//! The component loader: any bytes loaded as a component into a fake target whose allocator,
//! writer and sealer check every call. A component that loads has every symbol inside the
//! part of its image its place names, passes [`ComponentManager::verify`], and unloads leaving
//! no block allocated; a refused one allocated nothing that is still live.

use std::collections::BTreeMap;

use component_manager::resolve::ResolveError;
use component_manager::{ComponentManager, ExtraSymbols, Limits, LoadOptions, SymbolPlace};
use trapvec::{
    BlockKind, DispatchEntry, RepoBlock, Symbol, SymbolKind, SymbolTable, Target, TargetError,
    TargetInfo, TextPatch,
};

use crate::assert_sentence;

/// The code the component would patch (its blocks are allocated within reach of it).
pub const NEAR: u64 = 0x5555_5555_0000;
/// The image ceiling used here: 1 MiB, so that huge sizes are refused quickly and the fake
/// allocator stays cheap (the default is 16 MiB; the check is the same).
pub const MAX_IMAGE: u64 = 1 << 20;

/// A fake repository: blocks as byte vectors, every write and seal checked against the block.
pub struct FakeTarget {
    info: TargetInfo,
    symbols: SymbolTable,
    blocks: BTreeMap<u64, (RepoBlock, Vec<u8>, bool)>,
    next_id: u64,
    next_addr: u64,
}

impl FakeTarget {
    pub fn new() -> FakeTarget {
        let f = |name: &str, addr: u64, kind: SymbolKind| Symbol {
            name: name.into(),
            addr,
            size: 16,
            kind,
            origin: None,
            version: None,
        };
        let symbols = SymbolTable::new(vec![
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
        ]);
        let info = TargetInfo::user("fuzz target");
        FakeTarget {
            info,
            symbols,
            blocks: BTreeMap::new(),
            next_id: 1,
            next_addr: NEAR + 0x10_0000,
        }
    }

    /// Blocks allocated and not freed.
    pub fn live(&self) -> usize {
        self.blocks.len()
    }
}

impl Default for FakeTarget {
    fn default() -> Self {
        Self::new()
    }
}

impl Target for FakeTarget {
    fn info(&self) -> &TargetInfo {
        &self.info
    }

    fn symbols(&self) -> &SymbolTable {
        &self.symbols
    }

    fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, TargetError> {
        let (b, bytes, _) = self
            .blocks
            .values()
            .find(|(b, _, _)| {
                addr >= b.addr
                    && addr
                        .checked_add(len as u64)
                        .is_some_and(|e| e <= b.addr + b.size as u64)
            })
            .ok_or(TargetError::Read {
                addr,
                len,
                reason: "not mapped".into(),
            })?;
        let off = usize::try_from(addr - b.addr).expect("inside a block");
        Ok(bytes[off..off + len].to_vec())
    }

    fn alloc(&mut self, near: u64, size: usize, kind: BlockKind) -> Result<RepoBlock, TargetError> {
        // The loader must have refused anything beyond its limits before asking.
        assert!(
            size as u64 <= MAX_IMAGE + 2 * 4096 + 4096,
            "the loader asked for a {size}-byte block, beyond its image ceiling"
        );
        assert!(size > 0, "the loader asked for an empty block");
        let addr = self.next_addr.next_multiple_of(0x1000);
        self.next_addr = addr + size as u64 + 0x1000;
        assert!(
            addr.abs_diff(near) < 1 << 31,
            "the fake arena ran out of reach"
        );
        let block = RepoBlock {
            id: self.next_id,
            addr,
            size,
            kind,
        };
        self.next_id += 1;
        self.blocks
            .insert(block.id, (block.clone(), vec![0xAA; size], false));
        Ok(block)
    }

    fn write(&mut self, block: &RepoBlock, offset: usize, bytes: &[u8]) -> Result<(), TargetError> {
        let (b, mem, sealed) = self
            .blocks
            .get_mut(&block.id)
            .expect("the loader wrote to a block it does not own");
        assert_eq!(b, block, "the loader wrote through a stale block handle");
        assert!(
            !*sealed,
            "the loader wrote to a sealed block at {:#x}",
            b.addr
        );
        let end = offset
            .checked_add(bytes.len())
            .expect("write range overflows");
        assert!(
            end <= mem.len(),
            "the loader wrote past its block at {:#x} (+{offset:#x}, {} bytes)",
            b.addr,
            bytes.len()
        );
        mem[offset..end].copy_from_slice(bytes);
        Ok(())
    }

    fn seal(&mut self, block: &RepoBlock) -> Result<(), TargetError> {
        let (b, _, sealed) = self
            .blocks
            .get_mut(&block.id)
            .expect("the loader sealed a block it does not own");
        assert_eq!(b.kind, BlockKind::Code, "the loader sealed a data block");
        *sealed = true;
        Ok(())
    }

    fn free(&mut self, block: &RepoBlock) -> Result<(), TargetError> {
        assert!(
            self.blocks.remove(&block.id).is_some(),
            "the loader freed a block twice or one it does not own"
        );
        Ok(())
    }

    fn patch_text(&mut self, _batch: &[TextPatch]) -> Result<(), TargetError> {
        panic!("the loader patched text");
    }

    fn add_dispatch(&mut self, _entries: &[DispatchEntry]) -> Result<(), TargetError> {
        panic!("the loader added dispatch entries");
    }

    fn remove_dispatch(&mut self, _sites: &[u64]) -> Result<(), TargetError> {
        panic!("the loader removed dispatch entries");
    }

    fn quiesce(&mut self, _ranges: &[(u64, u64)]) -> Result<(), TargetError> {
        Ok(())
    }
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
    let mut t = FakeTarget::new();
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
    assert_eq!(
        t.live(),
        0,
        "blocks left allocated after the load and unload"
    );
}
