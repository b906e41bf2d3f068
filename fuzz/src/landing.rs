//! Exception landing pads: an LSDA alone, or a memory image holding `.eh_frame_hdr`, `.eh_frame`
//! and `.gcc_except_table`, through instr-manager's reader (`gimli` for the search table, FDEs
//! and CIEs, its own reader for the LSDA). Every refusal is a sentence; an LSDA that parses
//! covers no more bytes than it was given; landing pads come back sorted, once each.
//!
//! Input: a mode byte (even: the rest is an LSDA; odd: a memory image whose first bytes are the
//! `.eh_frame_hdr`), 8 bytes of address (where the bytes lie), 8 bytes of pc (the LSDA's code
//! fragment, or the start of the code range whose landing pads are asked for), 8 bytes of
//! `.eh_frame_hdr` length (odd mode), then the bytes.

use instr_manager::analysis::landing::{landing_pads, parse_lsda, EhFrameHdr, HdrTable};

use crate::{assert_sentence, Bytes};

/// Length of the code range asked about in a memory image.
const RANGE: u64 = 0x1000;

pub fn run(data: &[u8]) {
    let mut b = Bytes(data);
    let mode = b.u8();
    let base = b.u64();
    let pc = b.u64();
    let hdr_len = b.u64();
    let bytes = b.rest();
    if mode % 2 == 0 {
        match parse_lsda(bytes, base, pc) {
            Ok(l) => assert!(
                l.len <= bytes.len(),
                "an LSDA of {} bytes parsed from {}",
                l.len,
                bytes.len()
            ),
            Err(e) => assert_sentence("parse_lsda", &trapvec::error_chain(&e)),
        }
        return;
    }
    let read = |addr: u64, len: usize| {
        let off = usize::try_from(addr.checked_sub(base)?).ok()?;
        bytes.get(off..off.checked_add(len)?).map(<[u8]>::to_vec)
    };
    let table = match HdrTable::read(
        &read,
        "f",
        EhFrameHdr {
            addr: base,
            len: hdr_len,
        },
    ) {
        Ok(t) => t,
        Err(e) => return assert_sentence("HdrTable::read", &trapvec::error_chain(&e)),
    };
    match landing_pads(&read, "f", &table, pc, pc.saturating_add(RANGE)) {
        Ok(pads) => assert!(
            pads.windows(2).all(|w| w[0].addr < w[1].addr),
            "landing pads out of order: {pads:x?}"
        ),
        Err(e) => assert_sentence("landing_pads", &trapvec::error_chain(&e)),
    }
}
