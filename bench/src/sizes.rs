//! Fig. 4 today: how long the instructions of real kernel code are (1 … 15 bytes), which decides
//! whether a 5-byte `jmp` fits where a 2-byte trap always does.
//!
//! Every function of a group is decoded linearly from its start (iced-x86, 64-bit) up to its end;
//! the trailing padding after its last `ret`/`jmp` (int3 or NOP fill up to the next function,
//! which kallsyms extents include) is not code and is left out; a function with an undecodable
//! instruction contributes what precedes it and is counted in
//! [`LengthHistogram::undecodable_functions`]. Pure.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic};

use instr_manager::image::{CodeImage, FuncExtent};

/// Longest x86 instruction.
pub const MAX_LEN: usize = 15;

/// Instruction counts by length.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LengthHistogram {
    /// `counts[n]` instructions of `n` bytes (`counts[0]` is unused).
    pub counts: [u64; MAX_LEN + 1],
    pub functions: u64,
    /// Code bytes counted (instructions only).
    pub code_bytes: u64,
    /// Trailing padding bytes left out.
    pub padding_bytes: u64,
    pub undecodable_functions: u64,
}

impl LengthHistogram {
    /// Instructions counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Share (0..1) of instructions of exactly `len` bytes.
    pub fn share(&self, len: usize) -> f64 {
        ratio(self.counts.get(len).copied().unwrap_or(0), self.total())
    }

    /// Share (0..1) of instructions of at least `len` bytes.
    pub fn share_at_least(&self, len: usize) -> f64 {
        ratio(self.counts.iter().skip(len).sum(), self.total())
    }

    /// Mean instruction length.
    pub fn mean_len(&self) -> f64 {
        ratio(self.code_bytes, self.total())
    }

    pub fn merge(&mut self, other: &LengthHistogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a += b;
        }
        self.functions += other.functions;
        self.code_bytes += other.code_bytes;
        self.padding_bytes += other.padding_bytes;
        self.undecodable_functions += other.undecodable_functions;
    }

    /// Count the instructions of one function (`bytes` at `addr`).
    pub fn add_function(&mut self, addr: u64, bytes: &[u8]) {
        let mut lens: Vec<(u8, bool, bool)> = Vec::with_capacity(bytes.len() / 4);
        let mut decoder = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
        let mut ins = Instruction::default();
        let mut undecodable = false;
        while decoder.can_decode() {
            decoder.decode_out(&mut ins);
            if ins.is_invalid() {
                undecodable = true;
                break;
            }
            let pad = matches!(ins.mnemonic(), Mnemonic::Nop | Mnemonic::Int3);
            let stop = matches!(
                ins.flow_control(),
                FlowControl::Return
                    | FlowControl::UnconditionalBranch
                    | FlowControl::IndirectBranch
            );
            lens.push((u8::try_from(ins.len()).unwrap_or(u8::MAX), pad, stop));
        }
        // Trailing padding: the run of int3/NOP at the end, when something stops the flow
        // before it.
        let mut keep = lens.len();
        while keep > 0 && lens[keep - 1].1 {
            keep -= 1;
        }
        if keep > 0 && (keep == lens.len() || !lens[keep - 1].2 || undecodable) {
            keep = lens.len();
        }
        if keep == 0 {
            // Nothing but int3/NOP fill: no code.
            self.padding_bytes += lens.iter().map(|l| u64::from(l.0)).sum::<u64>();
            return;
        }
        for &(len, _, _) in &lens[..keep] {
            self.counts[usize::from(len).min(MAX_LEN)] += 1;
            self.code_bytes += u64::from(len);
        }
        self.padding_bytes += lens[keep..].iter().map(|l| u64::from(l.0)).sum::<u64>();
        self.functions += 1;
        self.undecodable_functions += u64::from(undecodable);
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// The histogram of the functions of `image` that `pick` selects.
pub fn histogram(image: &CodeImage, pick: impl Fn(&FuncExtent) -> bool) -> LengthHistogram {
    let mut h = LengthHistogram::default();
    for f in image.functions.iter().filter(|f| pick(f)) {
        h.add_function(f.start, image.bytes_of(f));
    }
    h
}

/// One row of Fig. 4: a set and its histogram.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SizesRow {
    pub set: String,
    pub source: String,
    /// `call __fentry__` sites of the set's image turned into NOPs (as the running kernel does).
    pub fentry_nops: usize,
    pub histogram: LengthHistogram,
}

/// The histogram of every set.
pub fn sizes(sets: &[crate::sets::CodeSet]) -> Vec<SizesRow> {
    sets.iter()
        .map(|set| {
            let mut h = LengthHistogram::default();
            for f in set.iter() {
                h.add_function(f.start, set.image.bytes_of(f));
            }
            SizesRow {
                set: set.name.clone(),
                source: set.source.clone(),
                fentry_nops: set.image.fentry_nops,
                histogram: h,
            }
        })
        .collect()
}

/// The text table: percent of instructions by length, per set.
pub fn render(rows: &[SizesRow]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = write!(s, "{:<26} {:>7} {:>9}", "set", "funcs", "insns");
    for n in 1..=MAX_LEN {
        let _ = write!(s, " {n:>4}");
    }
    let _ = writeln!(s, " {:>5} {:>5}", ">=5", "mean");
    for r in rows {
        let h = &r.histogram;
        let _ = write!(s, "{:<26} {:>7} {:>9}", r.set, h.functions, h.total());
        for n in 1..=MAX_LEN {
            let _ = write!(s, " {:>4.1}", 100.0 * h.share(n));
        }
        let _ = writeln!(
            s,
            " {:>5.1} {:>5.2}",
            100.0 * h.share_at_least(5),
            h.mean_len()
        );
    }
    let _ = writeln!(s, "(percent of instructions by length in bytes; trailing padding left out; ftrace sites counted as the 5-byte NOPs the running kernel has)");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[rustfmt::skip]
    fn lengths_are_counted_and_trailing_padding_left_out() {
        let code = [
            /*00*/ 0x0F, 0x1F, 0x44, 0x00, 0x00,       // nop5 (the fentry NOP: code, not padding)
            /*05*/ 0x55,                               // push rbp
            /*06*/ 0x48, 0x89, 0xE5,                   // mov rbp, rsp
            /*09*/ 0x48, 0x8B, 0x05, 0, 0, 0, 0,       // mov rax, [rip]
            /*10*/ 0x5D,                               // pop rbp
            /*11*/ 0xC3,                               // ret
            /*12*/ 0xCC, 0xCC, 0x66, 0x90,             // int3; int3; xchg ax,ax: padding
        ];
        let mut h = LengthHistogram::default();
        h.add_function(0x1000, &code);
        assert_eq!(h.total(), 6);
        assert_eq!((h.counts[1], h.counts[3], h.counts[5], h.counts[7]), (3, 1, 1, 1));
        assert_eq!(h.code_bytes, 18);
        assert_eq!(h.padding_bytes, 4);
        assert!((h.share_at_least(5) - 2.0 / 6.0).abs() < 1e-12);
        assert_eq!(h.functions, 1);
    }

    #[test]
    fn undecodable_function_keeps_its_prefix_and_is_counted() {
        let mut h = LengthHistogram::default();
        h.add_function(0, &[0x90, 0x31, 0xC0, 0x06, 0xC3]);
        assert_eq!(h.total(), 2);
        assert_eq!(h.undecodable_functions, 1);
    }
}
