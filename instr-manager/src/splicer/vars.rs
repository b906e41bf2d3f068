//! Component variables: read and write a data object of a loaded component (1, 2, 4 or 8 bytes,
//! little endian, inside its data block), as KAPI's memcopy.

use component_manager::ComponentError;
use trapvec::target::{RepoBlock, Target};

use super::{SpliceError, Splicer};

impl<T: Target> Splicer<T> {
    /// Locate `size` bytes of a component variable: its data block and offset.
    fn variable(&self, name: &str, size: usize) -> Result<(RepoBlock, usize), SpliceError> {
        if ![1, 2, 4, 8].contains(&size) {
            return Err(SpliceError::VariableSize {
                name: name.to_string(),
                size,
            });
        }
        // A data object of the component at least `size` bytes long, inside its data block.
        let (id, addr) = match self.components.variable(name, size as u64) {
            Ok(found) => found,
            Err(ComponentError::UnknownSymbol { .. }) => {
                return Err(SpliceError::UnknownVariable {
                    name: name.to_string(),
                })
            }
            Err(e) => return Err(e.into()),
        };
        let c = self
            .components
            .get(id)
            .ok_or_else(|| SpliceError::UnknownVariable {
                name: name.to_string(),
            })?;
        if !c.data.contains(addr) || addr + size as u64 > c.data.addr + c.data.size as u64 {
            return Err(SpliceError::VariableOutside {
                name: name.to_string(),
                addr,
                size,
            });
        }
        // Inside the block (checked above), so the offset fits the block's usize size.
        Ok((
            c.data.clone(),
            usize::try_from(addr - c.data.addr).unwrap_or(usize::MAX),
        ))
    }

    /// Write a component variable (`size` 1, 2, 4 or 8 bytes, little endian), as KAPI's memcopy.
    pub fn set_var(&mut self, name: &str, value: u64, size: usize) -> Result<(), SpliceError> {
        let (block, off) = self.variable(name, size)?;
        let bytes = value.to_le_bytes();
        self.target.write(&block, off, &bytes[..size])?;
        log::debug!(
            "set {name} = {value} ({size} bytes at {:#x})",
            block.addr + off as u64
        );
        Ok(())
    }

    /// Read a component variable.
    pub fn get_var(&self, name: &str, size: usize) -> Result<u64, SpliceError> {
        let (block, off) = self.variable(name, size)?;
        let b = self.target.read(block.addr + off as u64, size)?;
        let mut v = [0u8; 8];
        v[..size].copy_from_slice(&b);
        Ok(u64::from_le_bytes(v))
    }
}
