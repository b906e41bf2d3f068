//! bench's readers of a kernel: the first byte picks one, the rest is its input.
//! - 0: a kernel image (bzImage, vmlinuz...) through `extract_vmlinux`: what it finds is a
//!   whole ELF;
//! - 1: kallsyms text through trapvec's kallsyms parser;
//! - 2: an ELF (its length in two bytes, then the ELF) and kallsyms text: `check_kallsyms` and
//!   `CodeImage::vmlinux`, whose functions lie inside its regions;
//! - 3: a console log through `parse_kallsyms_dump`.
//!
//! Every refusal is a sentence.

use bench::kernel::{check_kallsyms, parse_kallsyms_dump};
use bench::vmlinux::{extract_vmlinux, is_whole_elf};
use instr_manager::image::CodeImage;

use crate::assert_sentence;

pub fn run(data: &[u8]) {
    let Some((&tag, rest)) = data.split_first() else {
        return;
    };
    match tag % 4 {
        0 => match extract_vmlinux(rest, "fuzz.img") {
            Ok(x) => assert!(
                is_whole_elf(&x.elf),
                "extract_vmlinux returned a partial ELF ({} bytes, {})",
                x.elf.len(),
                x.compression
            ),
            Err(e) => assert_sentence("extract_vmlinux", &trapvec::error_chain(&e)),
        },
        1 => {
            let text = String::from_utf8_lossy(rest);
            if let Err(e) = trapvec::kernel::kallsyms::parse(&text) {
                assert_sentence("kallsyms", &trapvec::error_chain(&e));
            }
        }
        2 => {
            if rest.len() < 2 {
                return;
            }
            let n = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
            let (elf, text) = rest[2..].split_at(n);
            let text = String::from_utf8_lossy(text);
            if let Err(e) = check_kallsyms(&text, elf, "fuzz kallsyms", "fuzz vmlinux") {
                assert_sentence("check_kallsyms", &trapvec::error_chain(&e));
            }
            match CodeImage::vmlinux(elf, &text, "fuzz vmlinux") {
                Ok(img) => {
                    for f in &img.functions {
                        assert!(
                            f.start < f.end,
                            "function `{}` is empty or reversed: [{:#x}, {:#x})",
                            f.name,
                            f.start,
                            f.end
                        );
                        assert!(
                            img.regions
                                .iter()
                                .any(|r| f.start >= r.addr && f.end <= r.end()),
                            "function `{}` [{:#x}, {:#x}) lies outside every region",
                            f.name,
                            f.start,
                            f.end
                        );
                        assert_eq!(
                            img.bytes_of(f).len() as u64,
                            f.end - f.start,
                            "function `{}`: its bytes are not all readable",
                            f.name
                        );
                    }
                }
                Err(e) => assert_sentence("CodeImage::vmlinux", &trapvec::error_chain(&e)),
            }
        }
        _ => {
            let text = String::from_utf8_lossy(rest);
            if let Err(e) = parse_kallsyms_dump(&text) {
                assert_sentence("parse_kallsyms_dump", &trapvec::error_chain(&e));
            }
        }
    }
}
