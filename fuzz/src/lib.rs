//! trapvec-fuzz: the fuzzing harnesses of trapvec, one module per input surface, as plain
//! functions over bytes so that a fuzzer (fuzz/libfuzzer, cargo fuzz) and `cargo test`
//! (tests/replay.rs, the committed corpora) run the same code.
//!
//! | harness | input | what it drives |
//! |---|---|---|
//! | [`loader`] | an ELF relocatable | component-manager: parse, validate, resolve, layout, link, write into a fake target, verify, unload |
//! | [`spec`] | TOML text | instr-manager's spec parser |
//! | [`protocol`] | a request line | trapd's protocol parser (trapd::protocol) |
//! | [`state`] | JSON | the state blob trapctl reads back from the module (`Splicer::import_state`) |
//! | [`bench`] | a tag byte, then a kernel image, kallsyms text, an ELF + kallsyms, or a console log | bench's vmlinux extraction and kallsyms readers |
//! | [`analysis`] | an address, a site and function bytes | instr-manager: decode, CFG, trap and jmp plans, relocation, trampolines |
//! | [`landing`] | an LSDA, or `.eh_frame_hdr`, `.eh_frame` and `.gcc_except_table` as memory | instr-manager's exception landing pad reader |
//!
//! Each harness panics only when a property is broken: beyond "no panic", every refusal is an
//! error whose message is a sentence ([`assert_sentence`]), and each checks the invariants that
//! matter for its surface (a loaded component's symbols inside its image, a plan's displaced
//! bytes re-decoding to its instructions, a parsed request re-parsing to itself...).
//!
//! Nothing here touches memory, text or the kernel: the targets are fakes.

pub mod analysis;
pub mod bench;
pub mod landing;
pub mod loader;
pub mod protocol;
pub mod spec;
pub mod state;

/// A harness: its name (of its corpus folder and fuzz target) and its body.
pub type Harness = (&'static str, fn(&[u8]));

/// Every harness.
pub const HARNESSES: [Harness; 7] = [
    ("loader", loader::run),
    ("spec", spec::run),
    ("protocol", protocol::run),
    ("state", state::run),
    ("bench", bench::run),
    ("analysis", analysis::run),
    ("landing", landing::run),
];

/// An error message a person can read: not empty, one trimmed text, not a `Debug` dump of an
/// error value (`Variant { field: .. }`, or `Variant(..)` whose parenthesis closes at the very
/// end: a message that merely starts with user text such as `E5(x: unknown action` is fine).
pub fn assert_sentence(what: &str, msg: &str) {
    assert!(!msg.trim().is_empty(), "{what}: an empty error message");
    assert_eq!(
        msg,
        msg.trim_end(),
        "{what}: the error message ends in white space: {msg:?}"
    );
    let head: String = msg
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    let ident = head.chars().next().is_some_and(|c| c.is_ascii_uppercase());
    let rest = &msg[head.len()..];
    let tuple = rest.starts_with('(') && rest.ends_with(')') && {
        // The parenthesis after the name closes only at the last character.
        let mut depth = 0i32;
        let open_until_the_end = rest.char_indices().all(|(i, c)| {
            depth += match c {
                '(' => 1,
                ')' => -1,
                _ => 0,
            };
            depth > 0 || i == rest.len() - 1
        });
        open_until_the_end && depth == 0
    };
    let record = rest.starts_with(" { ")
        && rest.ends_with(" }")
        && rest[3..].split_once(':').is_some_and(|(field, _)| {
            !field.is_empty() && field.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        });
    assert!(
        !(ident && (tuple || record)),
        "{what}: the error message is a Debug dump, not a sentence: {msg:?}"
    );
}

/// A little-endian reader over the fuzzer's bytes; past the end it yields zeros.
pub struct Bytes<'a>(pub &'a [u8]);

impl<'a> Bytes<'a> {
    pub fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }

    pub fn u64(&mut self) -> u64 {
        (0..8).fold(0, |v, i| v | u64::from(self.u8()) << (8 * i))
    }

    pub fn rest(self) -> &'a [u8] {
        self.0
    }
}
