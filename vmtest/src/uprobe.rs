//! Where an address of an ELF file lies in the file: what a uprobe is placed by
//! (`p:GROUP/EVENT PATH:OFFSET` in tracefs' `uprobe_events` takes a file offset, not an address).
//! Pure: reads the bytes it is given, touches no tracefs.
//!
//! Shared by the uprobe oracles that compare trapvec's counts with the kernel's own trap-based
//! user-space probes: the process coverage oracle of `vmtest/scenarios/cover.sh` (the guest maps
//! block addresses with the [`LoadSegment`]s the host gives it; the test checks every offset with
//! [`file_offset`]) and `bench cost`'s uprobe row (`bench/src/uprobe.rs`).

use object::{Object, ObjectSegment};

/// One `PT_LOAD` segment: `size` bytes of memory from `address` (the file's own addresses,
/// before any load bias), backed by the file from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSegment {
    /// Its first address (`p_vaddr`).
    pub address: u64,
    /// Its size in memory (`p_memsz`).
    pub size: u64,
    /// Where its bytes start in the file (`p_offset`).
    pub offset: u64,
}

impl LoadSegment {
    /// The file offset of `addr`, when it lies in this segment.
    pub fn file_offset(&self, addr: u64) -> Option<u64> {
        (self.address <= addr && addr - self.address < self.size)
            .then(|| addr - self.address + self.offset)
    }
}

/// The loadable segments of the ELF file `elf`, in file order.
pub fn load_segments(elf: &[u8]) -> Result<Vec<LoadSegment>, object::Error> {
    let file = object::File::parse(elf)?;
    Ok(file
        .segments()
        .map(|s| LoadSegment {
            address: s.address(),
            size: s.size(),
            offset: s.file_range().0,
        })
        .collect())
}

/// The file offset of the file's address `addr` (a symbol's value, a block's address as
/// `trapctl cover --json` gives it), or `None` when no loadable segment holds it.
pub fn file_offset(elf: &[u8], addr: u64) -> Result<Option<u64>, object::Error> {
    Ok(load_segments(elf)?.iter().find_map(|s| s.file_offset(addr)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_maps_into_its_segment_only() {
        // A PIE's data segment: its addresses run 0xdd0 bytes past its file offset.
        let data = LoadSegment {
            address: 0x3dd0,
            size: 0x258,
            offset: 0x2dd0,
        };
        assert_eq!(data.file_offset(0x3dd0), Some(0x2dd0));
        assert_eq!(data.file_offset(0x4027), Some(0x3027));
        assert_eq!(data.file_offset(0x4028), None, "one past the end");
        assert_eq!(data.file_offset(0x3dcf), None, "one before the start");
    }

    #[test]
    fn this_test_binary_maps_its_own_function_into_an_executable_segment() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let file = object::File::parse(&*exe).unwrap();
        let text = file
            .sections()
            .find(|s| object::ObjectSection::name(s) == Ok(".text"))
            .expect("a .text section");
        let addr = object::ObjectSection::address(&text);
        let (start, _) = object::ObjectSection::file_range(&text).expect(".text is in the file");
        assert_eq!(file_offset(&exe, addr).unwrap(), Some(start));
        assert_eq!(file_offset(&exe, u64::MAX).unwrap(), None);
        assert!(file_offset(b"not an ELF file", 0).is_err());
    }
}
