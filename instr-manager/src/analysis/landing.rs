//! Exception landing pads: where the unwinder sends a thrown exception (a C++ `catch`, or a
//! cleanup that runs destructors and resumes unwinding) in a function. Nothing inside the
//! function jumps there, so the decoder alone cannot see them; a window covering one would make
//! an exception land inside the patched bytes.
//!
//! They are found the way the unwinder finds them:
//! 1. `.eh_frame_hdr` (the object's `PT_GNU_EH_FRAME` segment) holds a sorted table of every
//!    FDE's start; it finds the FDE of an address ([`EhFrameHdr`], parsed with `gimli`);
//! 2. the FDE (and its CIE, augmentation `L`) in `.eh_frame` points to the LSDA, in
//!    `.gcc_except_table` (`gimli` again);
//! 3. the LSDA's call-site table ([`parse_lsda`], a small reader of its own) lists, for each
//!    range of calls that may throw, the landing pad (relative to LPStart, which defaults to the
//!    FDE's start) and the action.
//!
//! Everything is read through a [`ReadFn`] (a process's memory, or a file's sections by virtual
//! address) and every read is bounds-checked: these are untrusted bytes, and malformed ones give
//! a [`LandingError`] naming the function and the offset, never a panic. Without an
//! `.eh_frame_hdr`, or without an FDE for the function, or an FDE without an LSDA, the function
//! has no landing pads (nor could the unwinder find any).

use gimli::{
    BaseAddresses, EhFrame, EhFrameHdr as GimliHdr, EhFrameOffset, LittleEndian, Pointer,
    UnwindSection,
};
use thiserror::Error;

use super::ReadFn;

/// `DW_EH_PE_omit`: no value follows.
const OMIT: u8 = 0xff;
/// Largest call-site table read (a function with ~100,000 calls that may throw).
const MAX_TABLE: u64 = 1 << 20;
/// Largest `.eh_frame_hdr` read (8 bytes per FDE: ~2 million functions).
const MAX_HDR: u64 = 16 << 20;
/// Largest FDE or CIE.
const MAX_ENTRY: u64 = 1 << 16;
/// FDEs followed in one code range (a function split in several FDEs has a handful).
const MAX_FDES: usize = 64;

/// Where an object's `.eh_frame_hdr` lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EhFrameHdr {
    pub addr: u64,
    pub len: u64,
}

/// One entry of an LSDA's call-site table, in absolute addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallSite {
    /// The calls in `[start, start + len)` that throw unwind through this entry.
    pub start: u64,
    pub len: u64,
    /// Where the unwinder lands (`None`: no landing pad, unwinding goes on to the caller).
    pub landing_pad: Option<u64>,
    /// 0 for a cleanup, else 1 + the offset of the first action record.
    pub action: u64,
}

/// An LSDA read by [`parse_lsda`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lsda {
    pub lp_start: u64,
    pub call_sites: Vec<CallSite>,
    /// Bytes of the header and the call-site table (the action and type tables follow).
    pub len: usize,
}

/// A landing pad and the LSDA it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LandingPad {
    pub addr: u64,
    /// The LSDA (in `.gcc_except_table`) naming it.
    pub lsda: u64,
}

/// Malformed LSDA bytes; offsets are from the LSDA's start.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum LsdaError {
    #[error("it ends at offset {offset:#x}, inside its {what}")]
    Truncated { offset: usize, what: &'static str },
    #[error("its {what} encoding {enc:#04x} at offset {offset:#x} is not one an LSDA can use")]
    BadEncoding {
        what: &'static str,
        enc: u8,
        offset: usize,
    },
    #[error("its {what} at offset {offset:#x} does not fit in 64 bits")]
    Overflow { what: &'static str, offset: usize },
    #[error("its call-site table at offset {offset:#x} claims {len:#x} bytes (at most {MAX_TABLE:#x} are read)")]
    TableTooLarge { offset: usize, len: u64 },
    #[error(
        "its call-site entry at offset {offset:#x} runs past the table's end at offset {end:#x}"
    )]
    EntryPastTable { offset: usize, end: usize },
}

/// Reading a function's landing pads failed: the sentence names the function, the structure and
/// where it lies.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("cannot read the exception landing pads of `{func}`: {what}")]
pub struct LandingError {
    pub func: String,
    pub what: String,
}

/// A little-endian cursor over LSDA bytes that reports where it ran out.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn u8(&mut self, what: &'static str) -> Result<u8, LsdaError> {
        let b = *self.bytes.get(self.pos).ok_or(LsdaError::Truncated {
            offset: self.bytes.len(),
            what,
        })?;
        self.pos += 1;
        Ok(b)
    }

    fn fixed<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], LsdaError> {
        let end = self.pos.checked_add(N).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or(LsdaError::Truncated {
            offset: self.bytes.len(),
            what,
        })?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[self.pos..end]);
        self.pos = end;
        Ok(out)
    }

    /// ULEB128 (at most 10 bytes, the value within 64 bits).
    fn uleb(&mut self, what: &'static str) -> Result<u64, LsdaError> {
        let at = self.pos;
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.u8(what)?;
            let low = u64::from(b & 0x7f);
            if shift == 63 && low > 1 || shift > 63 && low != 0 {
                return Err(LsdaError::Overflow { what, offset: at });
            }
            value |= low.checked_shl(shift).unwrap_or(0);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(LsdaError::Overflow { what, offset: at })
    }

    /// SLEB128 (at most 10 bytes), as two's complement bits; bits past 64 are dropped.
    fn sleb(&mut self, what: &'static str) -> Result<u64, LsdaError> {
        let at = self.pos;
        let mut value = 0u64;
        let mut shift = 0u32;
        for _ in 0..10 {
            let b = self.u8(what)?;
            if shift < 64 {
                value |= u64::from(b & 0x7f) << shift;
            }
            shift += 7;
            if b & 0x80 == 0 {
                if shift < 64 && b & 0x40 != 0 {
                    value |= u64::MAX << shift;
                }
                return Ok(value);
            }
        }
        Err(LsdaError::Overflow { what, offset: at })
    }

    /// A value in the format of `enc` (its low 4 bits); the application (high bits) is the
    /// caller's. Signed forms come back sign-extended to 64 bits.
    fn value(&mut self, enc: u8, what: &'static str) -> Result<u64, LsdaError> {
        Ok(match enc & 0x0f {
            0x00 | 0x04 => u64::from_le_bytes(self.fixed::<8>(what)?),
            0x01 => self.uleb(what)?,
            0x02 => u64::from(u16::from_le_bytes(self.fixed::<2>(what)?)),
            0x03 => u64::from(u32::from_le_bytes(self.fixed::<4>(what)?)),
            0x09 => self.sleb(what)?,
            0x0a => sign_extend(i64::from(i16::from_le_bytes(self.fixed::<2>(what)?))),
            0x0b => sign_extend(i64::from(i32::from_le_bytes(self.fixed::<4>(what)?))),
            0x0c => u64::from_le_bytes(self.fixed::<8>(what)?),
            _ => {
                return Err(LsdaError::BadEncoding {
                    what,
                    enc,
                    offset: self.pos,
                })
            }
        })
    }
}

/// The bits of `v` as a u64 (two's complement).
fn sign_extend(v: i64) -> u64 {
    u64::from_le_bytes(v.to_le_bytes())
}

/// Whether the format bits of `enc` name a value format (`absptr`, `uleb128`, `udata2/4/8`,
/// `sleb128`, `sdata2/4/8`).
fn known_format(enc: u8) -> bool {
    matches!(enc & 0x0f, 0x00..=0x04 | 0x09..=0x0c)
}

/// Parse the header and call-site table of the LSDA at `addr` (its bytes from `bytes[0]` on; more
/// may follow) for the code fragment (FDE) starting at `fragment_start`, the default LPStart.
///
/// Header: LPStart encoding and, unless omitted, its value (absolute, `pcrel` to the field, or
/// `funcrel`); TType encoding and, unless omitted, the type table's offset (skipped: only landing
/// pads matter here); call-site encoding (a format with no application, as the unwinder reads
/// them with base 0) and the table's length; then entries (start, length, landing pad, all
/// relative to the fragment or LPStart, and the action as ULEB128) until the table's end, which
/// an entry must not cross.
pub fn parse_lsda(bytes: &[u8], addr: u64, fragment_start: u64) -> Result<Lsda, LsdaError> {
    let mut c = Cursor { bytes, pos: 0 };
    let lp_enc = c.u8("LPStart encoding")?;
    let lp_start = if lp_enc == OMIT {
        fragment_start
    } else {
        let at = c.pos;
        if lp_enc & 0x80 != 0 || !known_format(lp_enc) {
            return Err(LsdaError::BadEncoding {
                what: "LPStart",
                enc: lp_enc,
                offset: 0,
            });
        }
        let v = c.value(lp_enc, "LPStart")?;
        match lp_enc & 0x70 {
            0x00 => v,
            0x10 => addr.wrapping_add(at as u64).wrapping_add(v),
            0x40 => fragment_start.wrapping_add(v),
            _ => {
                return Err(LsdaError::BadEncoding {
                    what: "LPStart",
                    enc: lp_enc,
                    offset: 0,
                })
            }
        }
    };
    let tt_at = c.pos;
    let tt_enc = c.u8("TType encoding")?;
    if tt_enc != OMIT {
        if !known_format(tt_enc) {
            return Err(LsdaError::BadEncoding {
                what: "TType",
                enc: tt_enc,
                offset: tt_at,
            });
        }
        c.uleb("TType offset")?;
    }
    let cs_at = c.pos;
    let cs_enc = c.u8("call-site encoding")?;
    if cs_enc & 0xf0 != 0 || !known_format(cs_enc) {
        return Err(LsdaError::BadEncoding {
            what: "call-site",
            enc: cs_enc,
            offset: cs_at,
        });
    }
    let len_at = c.pos;
    let table_len = c.uleb("call-site table length")?;
    if table_len > MAX_TABLE {
        return Err(LsdaError::TableTooLarge {
            offset: len_at,
            len: table_len,
        });
    }
    let table_end = usize::try_from(table_len).map_or(usize::MAX, |n| c.pos.saturating_add(n));
    if table_end > bytes.len() {
        return Err(LsdaError::Truncated {
            offset: bytes.len(),
            what: "call-site table",
        });
    }
    let mut call_sites = Vec::new();
    let mut t = Cursor {
        bytes: &bytes[..table_end],
        pos: c.pos,
    };
    while t.pos < table_end {
        let at = t.pos;
        let entry = (|| -> Result<CallSite, LsdaError> {
            let start = t.value(cs_enc, "call-site start")?;
            let len = t.value(cs_enc, "call-site length")?;
            let lp = t.value(cs_enc, "landing pad")?;
            let action = t.uleb("call-site action")?;
            Ok(CallSite {
                start: fragment_start.wrapping_add(start),
                len,
                landing_pad: (lp != 0).then(|| lp_start.wrapping_add(lp)),
                action,
            })
        })();
        match entry {
            Ok(e) => call_sites.push(e),
            Err(LsdaError::Truncated { .. }) => {
                return Err(LsdaError::EntryPastTable {
                    offset: at,
                    end: table_end,
                })
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Lsda {
        lp_start,
        call_sites,
        len: table_end,
    })
}

/// `len` bytes at `addr`, or the error sentence for `func`.
fn read_exact(
    read: ReadFn<'_>,
    func: &str,
    addr: u64,
    len: u64,
    what: &str,
) -> Result<Vec<u8>, LandingError> {
    let err = || LandingError {
        func: func.to_string(),
        what: format!("{what}: cannot read {len} byte(s) at {addr:#x}"),
    };
    let n = usize::try_from(len).map_err(|_| err())?;
    read(addr, n).filter(|b| b.len() == n).ok_or_else(err)
}

/// Up to `want` bytes from `addr`: as many as are readable from `addr` on (an LSDA may end just
/// before an unmapped page, or at the end of a file's section). Reads page by page, halving a
/// read that fails down to one byte.
fn read_prefix(read: ReadFn<'_>, addr: u64, want: usize) -> Vec<u8> {
    const PAGE: u64 = 4096;
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < want {
        let mut chunk =
            usize::try_from((PAGE - at % PAGE).min((want - out.len()) as u64)).unwrap_or(1);
        loop {
            match read(at, chunk) {
                Some(b) if b.len() == chunk => {
                    out.extend_from_slice(&b);
                    match at.checked_add(chunk as u64) {
                        Some(next) => at = next,
                        None => return out,
                    }
                    break;
                }
                _ if chunk > 1 => chunk /= 2,
                _ => return out,
            }
        }
    }
    out
}

/// An FDE as far as landing pads care.
struct Fde {
    start: u64,
    end: u64,
    lsda: Option<u64>,
}

/// Parse the FDE at `fde_addr` and its CIE with `gimli`, each from its own copy. gimli finds an
/// FDE's CIE in the same section buffer, at the distance the FDE's CIE pointer gives (often far
/// back, at the start of `.eh_frame`); rather than copy everything in between, the CIE is parsed
/// on its own, and the copy of the FDE gets its CIE pointer rewritten to point at its own start,
/// an offset gimli only hands to the `get_cie` callback, which returns that CIE. Each copy's base
/// address is its real address, so `pcrel` pointers come out exact.
fn fde_at(read: ReadFn<'_>, func: &str, fde_addr: u64) -> Result<Fde, LandingError> {
    let bad = |what: String| LandingError {
        func: func.to_string(),
        what,
    };
    let (hdr_len, body_len) = entry_len(read, func, fde_addr, "FDE")?;
    // The CIE pointer: 4 bytes after a 4-byte length, 8 after a 64-bit one.
    let (field_at, field_len) = if hdr_len == 12 {
        (12usize, 8usize)
    } else {
        (4, 4)
    };
    let mut fde = read_exact(read, func, fde_addr, hdr_len + body_len, "the FDE")?;
    if body_len < field_len as u64 {
        return Err(bad(format!(
            "the FDE at {fde_addr:#x} (.eh_frame) has length {body_len:#x}"
        )));
    }
    // In bounds: the FDE holds hdr_len + body_len >= field_at + field_len bytes.
    let field = &mut fde[field_at..field_at + field_len];
    let cie_ptr = field.iter().rev().fold(0u64, |v, &b| v << 8 | u64::from(b));
    // The read above succeeded: fde_addr + hdr_len is an address.
    let ptr_field = fde_addr.wrapping_add(hdr_len);
    let cie_addr = ptr_field.checked_sub(cie_ptr).filter(|_| cie_ptr != 0);
    let cie_addr = cie_addr.ok_or_else(|| {
        bad(format!(
            "the FDE at {fde_addr:#x} (.eh_frame) has CIE pointer {cie_ptr:#x}"
        ))
    })?;
    for (i, b) in field.iter_mut().enumerate() {
        *b = hdr_len.to_le_bytes()[i];
    }
    let (cie_hdr, cie_body) = entry_len(read, func, cie_addr, "CIE")?;
    let cie = read_exact(read, func, cie_addr, cie_hdr + cie_body, "the CIE")?;

    let what = || format!("the FDE at {fde_addr:#x} (.eh_frame, CIE at {cie_addr:#x})");
    let cie_bases = BaseAddresses::default().set_eh_frame(cie_addr);
    let cie = EhFrame::new(&cie, LittleEndian)
        .cie_from_offset(&cie_bases, EhFrameOffset(0))
        .map_err(|e| bad(format!("{}: its CIE: {e}", what())))?;
    let bases = BaseAddresses::default().set_eh_frame(fde_addr);
    let parsed = EhFrame::new(&fde, LittleEndian)
        .fde_from_offset(&bases, EhFrameOffset(0), |_, _, _| Ok(cie.clone()))
        .map_err(|e| bad(format!("{}: {e}", what())))?;
    let lsda = match parsed.lsda() {
        None => None,
        Some(Pointer::Direct(a)) => Some(a),
        Some(Pointer::Indirect(slot)) => {
            let w = read_exact(read, func, slot, 8, "the LSDA's indirect pointer")?;
            Some(u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
        }
    };
    let start = parsed.initial_address();
    Ok(Fde {
        start,
        end: start.saturating_add(parsed.len()),
        lsda,
    })
}

/// The header length (4, or 12 for the 64-bit form) and the body length of the CIE or FDE at
/// `addr`; a zero length (the terminator) or one past [`MAX_ENTRY`] is an error.
fn entry_len(
    read: ReadFn<'_>,
    func: &str,
    addr: u64,
    kind: &str,
) -> Result<(u64, u64), LandingError> {
    let head = read_exact(read, func, addr, 4, &format!("the {kind}'s length"))?;
    let len32 = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let (hdr_len, body_len) = if len32 == 0xffff_ffff {
        let l = read_exact(
            read,
            func,
            addr.wrapping_add(4),
            8,
            &format!("the {kind}'s 64-bit length"),
        )?;
        (
            12u64,
            l.iter().rev().fold(0u64, |v, &b| v << 8 | u64::from(b)),
        )
    } else {
        (4u64, u64::from(len32))
    };
    if body_len == 0 || body_len > MAX_ENTRY {
        return Err(LandingError {
            func: func.to_string(),
            what: format!("the {kind} at {addr:#x} (.eh_frame) has length {body_len:#x}"),
        });
    }
    Ok((hdr_len, body_len))
}

/// A parsed `.eh_frame_hdr`: its bytes, read once, and where they lie.
pub struct HdrTable {
    hdr: EhFrameHdr,
    bytes: Vec<u8>,
}

impl HdrTable {
    /// Read the `.eh_frame_hdr` at `hdr` (and check it parses, with a search table).
    pub fn read(read: ReadFn<'_>, func: &str, hdr: EhFrameHdr) -> Result<HdrTable, LandingError> {
        if hdr.len > MAX_HDR {
            return Err(LandingError {
                func: func.to_string(),
                what: format!(
                    "its .eh_frame_hdr at {:#x} is {:#x} bytes long",
                    hdr.addr, hdr.len
                ),
            });
        }
        let bytes = read_exact(read, func, hdr.addr, hdr.len, "the .eh_frame_hdr")?;
        let t = HdrTable { hdr, bytes };
        t.check(func)?;
        Ok(t)
    }

    /// Walk the whole search table once: every entry must be in the bytes read (gimli's binary
    /// search multiplies the entry count it is given, which must not be more than the bytes
    /// hold) and in ascending order (or the search would miss FDEs).
    fn check(&self, func: &str) -> Result<(), LandingError> {
        let bad = |e: String| LandingError {
            func: func.to_string(),
            what: format!("its .eh_frame_hdr at {:#x}: {e}", self.hdr.addr),
        };
        let bases = BaseAddresses::default().set_eh_frame_hdr(self.hdr.addr);
        let parsed = GimliHdr::new(&self.bytes, LittleEndian)
            .parse(&bases, 8)
            .map_err(|e| bad(e.to_string()))?;
        let table = parsed
            .table()
            .ok_or_else(|| bad("it has no search table".to_string()))?;
        let mut entries = table.iter(&bases);
        let mut last = None;
        let mut n = 0u64;
        while let Some((start, _)) = entries
            .next()
            .map_err(|e| bad(format!("its search table entry {n}: {e}")))?
        {
            let start = start
                .direct()
                .map_err(|e| bad(format!("its search table entry {n}: {e}")))?;
            if last.is_some_and(|l| start < l) {
                return Err(bad(format!(
                    "its search table is not sorted at entry {n} ({start:#x})"
                )));
            }
            last = Some(start);
            n += 1;
        }
        Ok(())
    }

    /// The address of the FDE whose start is the last at or before `pc` (`None` when every FDE
    /// starts after `pc`).
    fn fde_for(&self, func: &str, pc: u64) -> Result<Option<u64>, LandingError> {
        let bad = |e: String| LandingError {
            func: func.to_string(),
            what: format!("its .eh_frame_hdr at {:#x}: {e}", self.hdr.addr),
        };
        let bases = BaseAddresses::default().set_eh_frame_hdr(self.hdr.addr);
        let parsed = GimliHdr::new(&self.bytes, LittleEndian)
            .parse(&bases, 8)
            .map_err(|e| bad(e.to_string()))?;
        let table = parsed
            .table()
            .ok_or_else(|| bad("it has no search table".to_string()))?;
        // The first entry tells whether any FDE starts at or before `pc`.
        let first = table.iter(&bases).next().map_err(|e| bad(e.to_string()))?;
        match first {
            Some((start, _)) if start.direct().map_err(|e| bad(e.to_string()))? <= pc => {}
            _ => return Ok(None),
        }
        let p = table.lookup(pc, &bases).map_err(|e| bad(e.to_string()))?;
        p.direct().map(Some).map_err(|e| bad(e.to_string()))
    }
}

/// The landing pads named by the LSDAs of the FDEs covering `[lo, hi)` (one code fragment of
/// `func`: the function, or one of its cold parts), wherever they land.
pub fn landing_pads(
    read: ReadFn<'_>,
    func: &str,
    table: &HdrTable,
    lo: u64,
    hi: u64,
) -> Result<Vec<LandingPad>, LandingError> {
    let mut out = Vec::new();
    let mut pc = lo;
    for _ in 0..MAX_FDES {
        if pc >= hi {
            break;
        }
        let Some(fde_addr) = table.fde_for(func, pc)? else {
            break;
        };
        let fde = fde_at(read, func, fde_addr)?;
        if !(fde.start <= pc && pc < fde.end) {
            // No FDE covers pc: no unwinding through here.
            log::debug!("`{func}`: no FDE covers {pc:#x}");
            break;
        }
        if let Some(lsda) = fde.lsda {
            // The header and table: read what is readable of a generous prefix, then the
            // whole table once its length is known.
            let mut bytes = read_prefix(read, lsda, 64);
            let parsed = match parse_lsda(&bytes, lsda, fde.start) {
                Err(LsdaError::Truncated { .. }) if bytes.len() == 64 => {
                    let need = lsda_table_end(&bytes).unwrap_or(64);
                    bytes = read_prefix(read, lsda, need);
                    parse_lsda(&bytes, lsda, fde.start)
                }
                r => r,
            };
            let parsed = parsed.map_err(|e| LandingError {
                func: func.to_string(),
                what: format!(
                    "the LSDA at {lsda:#x} (.gcc_except_table, of the FDE for [{:#x}, {:#x})): {e}",
                    fde.start, fde.end
                ),
            })?;
            out.extend(
                parsed
                    .call_sites
                    .iter()
                    .filter_map(|c| c.landing_pad)
                    .map(|addr| LandingPad { addr, lsda }),
            );
        }
        pc = fde.end;
    }
    out.sort_unstable_by_key(|p| p.addr);
    out.dedup_by_key(|p| p.addr);
    Ok(out)
}

/// Where the call-site table of the LSDA whose first bytes are `head` ends, from its header.
fn lsda_table_end(head: &[u8]) -> Option<usize> {
    let mut c = Cursor {
        bytes: head,
        pos: 0,
    };
    let lp_enc = c.u8("").ok()?;
    if lp_enc != OMIT {
        c.value(lp_enc, "").ok()?;
    }
    if c.u8("").ok()? != OMIT {
        c.uleb("").ok()?;
    }
    c.u8("").ok()?;
    let len = c.uleb("").ok()?;
    usize::try_from(len)
        .ok()
        .filter(|_| len <= MAX_TABLE)
        .map(|n| c.pos + n)
}

#[cfg(test)]
mod tests;
