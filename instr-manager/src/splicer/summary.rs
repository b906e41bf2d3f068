//! What a live splice keeps of its [`Plan`] ([`PlanSummary`]), and the text of its displaced
//! instructions ([`DisplacedText`]), formatted only when someone reads it: a batch of 10,000
//! splices would otherwise spend a good part of its time formatting text nobody prints.

use std::fmt;
use std::ops::Deref;
use std::sync::OnceLock;

use iced_x86::Instruction;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::analysis::intel_list;
use crate::plan::{Mechanism, Plan, Springboard};

/// What a live splice keeps of its [`Plan`]: what removal, listing and the busy check need
/// (the decoded instructions themselves are kept only until their text is first read).
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanSummary {
    pub site: u64,
    pub mechanism: Mechanism,
    /// Length of the displaced window; execution resumes at `site + displaced_len`.
    pub displaced_len: usize,
    /// Bytes written at the site (2 trap or jmp rel8, 5 jmp rel32).
    pub patch_len: usize,
    /// Addresses of the displaced instructions.
    pub displaced_addrs: Vec<u64>,
    /// The displaced instructions in Intel syntax, `; `-separated (read it as a `String`).
    pub displaced_text: DisplacedText,
    pub springboard: Option<Springboard>,
    /// The displaced window's original bytes (`displaced_len` of them from `site`): what the
    /// compact saved record keeps instead of the addresses and the text, which decode from
    /// them. Empty when not known (a splice read from a state of version 3 or older, until
    /// [`super::state`] reads them back from the target).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub displaced_bytes: Vec<u8>,
}

impl PlanSummary {
    /// The summary of `plan`, whose displaced window holds `displaced_bytes` (empty: not known).
    pub fn of(plan: &Plan, displaced_bytes: Vec<u8>) -> Self {
        PlanSummary {
            site: plan.site,
            mechanism: plan.mechanism,
            displaced_len: plan.displaced_len,
            patch_len: plan.patch_len,
            displaced_addrs: plan.displaced.iter().map(|i| i.addr).collect(),
            displaced_text: DisplacedText::of(plan),
            springboard: plan.springboard.clone(),
            displaced_bytes,
        }
    }

    /// End of the displaced window.
    pub fn window_end(&self) -> u64 {
        self.site + self.displaced_len as u64
    }
}

impl Clone for PlanSummary {
    fn clone(&self) -> Self {
        PlanSummary {
            site: self.site,
            mechanism: self.mechanism,
            displaced_len: self.displaced_len,
            patch_len: self.patch_len,
            displaced_addrs: self.displaced_addrs.clone(),
            displaced_text: self.displaced_text.duplicate(),
            springboard: self.springboard.clone(),
            displaced_bytes: self.displaced_bytes.clone(),
        }
    }
}

/// The displaced instructions of a splice in Intel syntax, `; `-separated, as
/// [`Plan::displaced_text`] writes them: formatted on first read, then kept.
///
/// It reads as the `String` it derefs to (`&*text`, `text.as_str()`, `text.to_string()`), and
/// compares, prints and serializes as that string (a saved state holds the text, as before).
/// It is deliberately not `Clone`: `text.clone()` then clones the `String`, which is what code
/// that reads the field wants; [`PlanSummary`]'s `Clone` copies it with
/// [`DisplacedText::duplicate`].
pub struct DisplacedText {
    /// The instructions to format (empty when restored from text).
    instrs: Vec<Instruction>,
    text: OnceLock<String>,
}

impl DisplacedText {
    /// The (not yet formatted) text of `plan`'s displaced instructions.
    pub fn of(plan: &Plan) -> Self {
        DisplacedText {
            instrs: plan.displaced.iter().map(|i| i.instr).collect(),
            text: OnceLock::new(),
        }
    }

    /// The instructions in `bytes` at `site` (not yet formatted) and their addresses; `None`
    /// if the bytes do not decode to whole instructions.
    pub fn decode(bytes: &[u8], site: u64) -> Option<(Self, Vec<u64>)> {
        let mut decoder =
            iced_x86::Decoder::with_ip(64, bytes, site, iced_x86::DecoderOptions::NONE);
        let (mut instrs, mut addrs) = (Vec::new(), Vec::new());
        while decoder.can_decode() {
            let instr = decoder.decode();
            if instr.is_invalid() {
                return None;
            }
            addrs.push(instr.ip());
            instrs.push(instr);
        }
        let text = DisplacedText {
            instrs,
            text: OnceLock::new(),
        };
        Some((text, addrs))
    }

    /// A copy (formatted or not, as this one is).
    pub fn duplicate(&self) -> Self {
        match self.text.get() {
            Some(t) => DisplacedText::from(t.clone()),
            None => DisplacedText {
                instrs: self.instrs.clone(),
                text: OnceLock::new(),
            },
        }
    }

    pub fn as_str(&self) -> &str {
        self
    }
}

impl From<String> for DisplacedText {
    fn from(text: String) -> Self {
        DisplacedText {
            instrs: Vec::new(),
            text: OnceLock::from(text),
        }
    }
}

impl Deref for DisplacedText {
    type Target = String;

    fn deref(&self) -> &String {
        self.text.get_or_init(|| intel_list(&self.instrs))
    }
}

impl fmt::Display for DisplacedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

impl fmt::Debug for DisplacedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq for DisplacedText {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for DisplacedText {}

impl PartialEq<str> for DisplacedText {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for DisplacedText {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for DisplacedText {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl Serialize for DisplacedText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self)
    }
}

impl<'de> Deserialize<'de> for DisplacedText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(DisplacedText::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::analyze_function;
    use crate::plan::{plan_trap, PlanInput};
    use trapvec::SymbolTable;

    fn summary() -> PlanSummary {
        // push rbp; mov rbp,rsp; lea eax,[rdi+1]; pop rbp; ret
        let func = analyze_function(
            "f",
            0x1000,
            &[0x55, 0x48, 0x89, 0xE5, 0x8D, 0x47, 0x01, 0x5D, 0xC3],
        )
        .unwrap();
        let info = crate::plan::tests::user();
        let read = |_: u64, _: usize| None;
        let input = PlanInput {
            func: &func,
            info: &info,
            read: &read,
            symbols: &SymbolTable::default(),
            busy: &|_, _| false,
            trampoline_near: None,
        };
        PlanSummary::of(&plan_trap(&input, 0x1000).unwrap(), Vec::new())
    }

    #[test]
    fn displaced_text_is_formatted_on_first_read_as_the_plan_formats_it() {
        let s = summary();
        assert!(
            s.displaced_text.text.get().is_none(),
            "nothing formatted while building the summary"
        );
        assert_eq!(s.displaced_text, "push rbp; mov rbp, rsp");
        assert_eq!(
            s.displaced_text.text.get().map(String::as_str),
            Some("push rbp; mov rbp, rsp")
        );
    }

    #[test]
    fn displaced_text_clones_to_a_string_and_copies_with_the_summary() {
        let s = summary();
        let copy = s.clone();
        // The field reads as a String: `.clone()` goes through `Deref` (what trapctl does).
        let text: String = s.displaced_text.clone();
        assert_eq!(text, "push rbp; mov rbp, rsp");
        assert_eq!(copy, s);
        assert_eq!(copy.displaced_text.to_string(), "push rbp; mov rbp, rsp");
    }

    #[test]
    fn displaced_text_saves_and_restores_as_the_plain_string() {
        let s = summary();
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["displaced_text"], "push rbp; mov rbp, rsp");
        let back: PlanSummary = serde_json::from_value(json).unwrap();
        assert_eq!(back, s);
        assert_eq!(
            format!("{:?}", back.displaced_text),
            "\"push rbp; mov rbp, rsp\""
        );
    }
}
