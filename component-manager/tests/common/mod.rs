//! Test support: an honest fake [`Target`] over a sparse address space, and C fixtures compiled
//! at test time.
//!
//! The fake checks what a real backend checks: blocks within ±2 GiB of `near` (and not covering
//! it), writes only inside live blocks and never into a sealed code block, sealing only code,
//! freeing only live blocks; it counts allocations, frees and seals, and records quiescence.
#![allow(dead_code)] // each test binary uses a different part of it

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use trapvec::{
    BlockKind, DispatchEntry, RepoBlock, Symbol, SymbolKind, SymbolTable, Target, TargetError,
    TargetInfo, TextPatch,
};

const REACH: u64 = 1 << 31;

struct FakeBlock {
    block: RepoBlock,
    bytes: Vec<u8>,
    sealed: bool,
}

/// A target whose memory is a few `Vec<u8>`s.
pub struct FakeTarget {
    info: TargetInfo,
    symbols: SymbolTable,
    blocks: BTreeMap<u64, FakeBlock>,
    next_id: u64,
    /// Address blocks start at, past a page boundary (0 = page-aligned blocks).
    pub misalign: u64,
    /// Refuse allocations of this kind (to test the clean-up of half-done loads).
    pub refuse_alloc: Option<BlockKind>,
    /// Largest block handed out (a kernel arena is a few MiB too).
    pub max_block: usize,
    pub allocs: usize,
    pub frees: usize,
    pub seals: usize,
    pub quiesced: Vec<Vec<(u64, u64)>>,
}

impl FakeTarget {
    /// A target defining `symbols` (name, address, kind).
    pub fn new(symbols: &[(&str, u64, SymbolKind)]) -> Self {
        let symbols = symbols
            .iter()
            .map(|&(name, addr, kind)| Symbol {
                name: name.into(),
                addr,
                size: 16,
                kind,
                origin: None,
                version: None,
            })
            .collect();
        FakeTarget {
            info: TargetInfo::user("fake target"),
            symbols: SymbolTable::new(symbols),
            blocks: BTreeMap::new(),
            next_id: 1,
            misalign: 0,
            refuse_alloc: None,
            max_block: 16 << 20,
            allocs: 0,
            frees: 0,
            seals: 0,
            quiesced: Vec::new(),
        }
    }

    /// Blocks allocated and not freed.
    pub fn live(&self) -> usize {
        self.blocks.len()
    }

    fn find(&self, addr: u64, len: usize) -> Option<&FakeBlock> {
        self.blocks.values().find(|b| {
            addr >= b.block.addr && addr + len as u64 <= b.block.addr + b.block.size as u64
        })
    }

    /// Bytes at `addr`, which must lie in a live block.
    pub fn peek(&self, addr: u64, len: usize) -> Vec<u8> {
        self.read(addr, len).unwrap()
    }

    pub fn peek_u64(&self, addr: u64) -> u64 {
        u64::from_le_bytes(self.peek(addr, 8).try_into().unwrap())
    }

    /// Change bytes behind the target's back, sealed or not (to simulate corruption).
    pub fn poke(&mut self, addr: u64, bytes: &[u8]) {
        let b = self
            .blocks
            .values_mut()
            .find(|b| b.block.contains(addr))
            .expect("poke outside every block");
        let off = usize::try_from(addr - b.block.addr).unwrap();
        b.bytes[off..off + bytes.len()].copy_from_slice(bytes);
    }

    /// Whether the code block at `addr` has been sealed.
    pub fn is_sealed(&self, addr: u64) -> bool {
        self.blocks
            .values()
            .any(|b| b.block.contains(addr) && b.sealed)
    }

    fn live_block(&mut self, block: &RepoBlock) -> Result<&mut FakeBlock, TargetError> {
        match self.blocks.get_mut(&block.id) {
            Some(b) if b.block == *block => Ok(b),
            _ => Err(TargetError::Block {
                addr: block.addr,
                offset: 0,
                len: 0,
                reason: "not a live block".into(),
            }),
        }
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
        let b = self.find(addr, len).ok_or(TargetError::Read {
            addr,
            len,
            reason: "not mapped".into(),
        })?;
        let off = usize::try_from(addr - b.block.addr).unwrap();
        Ok(b.bytes[off..off + len].to_vec())
    }

    fn alloc(&mut self, near: u64, size: usize, kind: BlockKind) -> Result<RepoBlock, TargetError> {
        let fail = |reason: &str| TargetError::Alloc {
            near,
            size,
            reason: reason.into(),
        };
        if size == 0 {
            return Err(fail("empty block"));
        }
        if size > self.max_block {
            return Err(fail("larger than the arena"));
        }
        if self.refuse_alloc == Some(kind) {
            return Err(fail("refused by the test"));
        }
        // First page boundary 64 KiB past `near` that overlaps no live block.
        let mut addr = (near + 0x1_0000).next_multiple_of(0x1000) + self.misalign;
        while let Some(b) = self.blocks.values().find(|b| {
            addr < b.block.addr + b.block.size as u64 && b.block.addr < addr + size as u64
        }) {
            addr = (b.block.addr + b.block.size as u64).next_multiple_of(0x1000) + self.misalign;
        }
        if addr + size as u64 - near > REACH {
            return Err(fail("out of reach"));
        }
        let block = RepoBlock {
            id: self.next_id,
            addr,
            size,
            kind,
        };
        self.next_id += 1;
        self.allocs += 1;
        self.blocks.insert(
            block.id,
            FakeBlock {
                block: block.clone(),
                bytes: vec![0xAA; size],
                sealed: false,
            },
        );
        Ok(block)
    }

    fn write(&mut self, block: &RepoBlock, offset: usize, bytes: &[u8]) -> Result<(), TargetError> {
        let b = self.live_block(block)?;
        let err = |reason: &str| TargetError::Block {
            addr: block.addr,
            offset,
            len: bytes.len(),
            reason: reason.into(),
        };
        if b.sealed {
            return Err(err("sealed"));
        }
        let end = offset
            .checked_add(bytes.len())
            .filter(|&e| e <= b.bytes.len())
            .ok_or_else(|| err("past the end"))?;
        b.bytes[offset..end].copy_from_slice(bytes);
        if b.bytes[offset..end] != *bytes {
            return Err(err("read back differs"));
        }
        Ok(())
    }

    fn seal(&mut self, block: &RepoBlock) -> Result<(), TargetError> {
        let b = self.live_block(block)?;
        if b.block.kind != BlockKind::Code || b.sealed {
            return Err(TargetError::Block {
                addr: block.addr,
                offset: 0,
                len: 0,
                reason: "not an unsealed code block".into(),
            });
        }
        b.sealed = true;
        self.seals += 1;
        Ok(())
    }

    fn free(&mut self, block: &RepoBlock) -> Result<(), TargetError> {
        self.live_block(block)?;
        self.blocks.remove(&block.id);
        self.frees += 1;
        Ok(())
    }

    fn patch_text(&mut self, _batch: &[TextPatch]) -> Result<(), TargetError> {
        Err(TargetError::Other("the fake target has no text".into()))
    }

    fn add_dispatch(&mut self, _entries: &[DispatchEntry]) -> Result<(), TargetError> {
        Err(TargetError::Other(
            "the fake target has no dispatcher".into(),
        ))
    }

    fn remove_dispatch(&mut self, _sites: &[u64]) -> Result<(), TargetError> {
        Err(TargetError::Other(
            "the fake target has no dispatcher".into(),
        ))
    }

    fn quiesce(&mut self, ranges: &[(u64, u64)]) -> Result<(), TargetError> {
        self.quiesced.push(ranges.to_vec());
        Ok(())
    }
}

/// Compile fixture `name` (a C file in `tests/fixtures/`) with `cc -c -O2`
/// and `extra` flags; the object's bytes.
pub fn compile(name: &str, extra: &[&str]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let obj = compile_to(name, extra, dir.path());
    std::fs::read(obj).unwrap()
}

/// Like [`compile`], writing `<stem>.o` into `dir`; its path.
pub fn compile_to(name: &str, extra: &[&str], dir: &Path) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = manifest.join("tests/fixtures").join(name);
    let out = dir.join(Path::new(name).with_extension("o").file_name().unwrap());
    let status = Command::new("cc")
        .args(["-c", "-O2"])
        .args(extra)
        .arg("-I")
        .arg(manifest.join("../components/include"))
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("running cc");
    assert!(status.success(), "cc failed on {}", src.display());
    out
}
