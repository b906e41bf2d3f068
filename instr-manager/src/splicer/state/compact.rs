//! The saved record of a live splice, compact for the commonest one (issue 26: about 900 bytes of
//! JSON per count site, against a goal of 64 bytes per site in all; issue 27: a coverage run of
//! 262,144 owned count sites saved whole was 295 MB, over the module's 256 MiB).
//!
//! A count splice with no option but its owner (no handler, no component, no springboard, no slot)
//! is saved as one JSON array of what re-creating and reverting it needs and nothing the rest
//! determines ([`Compact`], version 6): its id, the point as written (`null` when it is the
//! function's name, or with [`AT_SITE`] the site's address as `0x...`, as `trapctl cover` writes
//! its points), the point's canonical form (`null`: the point as written), its function (the index
//! of its row in the document's table of functions, or the row itself, `[name, address, size,
//! object]`, when no other array of the document has that function), the site as an offset in it,
//! the displaced window's original bytes (hex: its length, the instructions' addresses and text and
//! the original bytes under the patch decode from them), the patched bytes (hex), its code block
//! (id, address as a distance from the site, size), its data block if it has one (id, address as a
//! distance from the code), the flags (replay, dispatch entry, jmp, point at the site) and, if it
//! has an owner, the index of its owner in the document's table of owners (an eleventh element:
//! an array without an owner has ten, as in versions 4 and 5, which it reads the same). Entry, replay and the
//! dispatch entry's destination are the code block's address; a data block is 16 bytes. Any other
//! splice, and a count splice the array would not give back exactly, is saved whole (an object):
//! [`Tables::record`] makes the array only when decoding it yields a splice equal to the live one,
//! field by field, so nothing can be lost by the encoding.
//!
//! **Tables.** What many splices share is written once per *document*, the snapshot or one change
//! line of the log ([`super::super::state_log`]): `owners`, each distinct owner
//! ([`crate::owner::Owner`], up to 160 bytes of command line, the same for every site of one
//! `trapctl cover`), and `functions`, each function two or more arrays share, as `[name, address,
//! size, object]` (a coverage run puts a site in every block of a function; a function with one
//! site keeps its row in its array, where an index and a table row would cost more). Both come
//! before `splices` (or `add`), are left out when empty, and are numbered from 0 in the order
//! written ([`Tables::finish`]). An index means an entry of its own document's table only: a change
//! line carries the owners and functions its own arrays use, even when the snapshot or an earlier
//! line has them, so a line never depends on another (a torn line, a stale log and compaction stay
//! as they were). Writing a table entry costs once per document; the array holds a number of a few
//! digits.
//!
//! Every form is read wherever a splice is (snapshot and log): whole (every version), the version-3
//! array ([`Compact3`], with the text, the addresses and the original bytes, but not the displaced
//! window's bytes past the patch, which [`super::Splicer::restore`] reads back from the target),
//! and the array of versions 4 to 6 ([`Compact`]: versions 4 and 5 wrote every function inline
//! and no owner, an owned count splice whole); the next snapshot writes the current version.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use trapvec::{BlockKind, DispatchEntry, RepoBlock, Symbol, SymbolKind, TextPatch};

use crate::owner::Owner;
use crate::plan::Mechanism;
use crate::point::ResolvedPoint;
use crate::splice::{Action, SpliceOptions, SpliceRequest, When};

use super::super::summary::{DisplacedText, PlanSummary};
use super::super::{LiveSplice, SpliceId};

/// Flag: the splice has a replay (at its code block).
const HAS_REPLAY: u8 = 1;
/// Flag: the splice has a dispatch entry (site -> its code block, no handler).
const HAS_DISPATCH: u8 = 2;
/// Flag (version 4): the mechanism is a jmp, not a trap.
const IS_JMP: u8 = 4;
/// Flag (version 6): a point left out (`null`) is the site's address (`0x...`), not the
/// function's name.
const AT_SITE: u8 = 8;

/// A function as a table row (version 6) and as version 4 wrote it inline: name, address,
/// size, object.
pub(in crate::splicer) type FunctionRow = (String, u64, u64, Option<String>);

/// A compact count site (versions 4 to 6), a JSON array in this order: ten elements, and an
/// eleventh for an owner. A version-4 or -5 array is one of ten with the function inline and
/// no [`AT_SITE`] flag, and means what it meant then.
pub(in crate::splicer) struct Compact(
    /// id
    u64,
    /// the point as written, `None` when it is [`default_point`]
    Option<String>,
    /// the point's canonical form, `None` when it is the point as written
    Option<String>,
    /// the function: its index in the document's `functions`, or its row itself when no
    /// other array of the document has it
    FunctionRef,
    /// site - function address
    u64,
    /// the displaced window's original bytes (hex)
    String,
    /// patched bytes (hex)
    String,
    /// code block: id, address - site (wrapping), size
    (u64, u64, usize),
    /// data block: id, address - code address (wrapping); `None` for none
    Option<(u64, u64)>,
    /// [`HAS_REPLAY`], [`HAS_DISPATCH`], [`IS_JMP`], [`AT_SITE`]
    u8,
    /// the owner: its index in the document's `owners`; `None` (no eleventh element) for none
    Option<usize>,
);

impl Serialize for Compact {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let Compact(id, at, spec_text, function, offset, window, new, code, data, flags, owner) =
            self;
        let mut seq = s.serialize_seq(Some(10 + usize::from(owner.is_some())))?;
        seq.serialize_element(id)?;
        seq.serialize_element(at)?;
        seq.serialize_element(spec_text)?;
        seq.serialize_element(function)?;
        seq.serialize_element(offset)?;
        seq.serialize_element(window)?;
        seq.serialize_element(new)?;
        seq.serialize_element(code)?;
        seq.serialize_element(data)?;
        seq.serialize_element(flags)?;
        if let Some(owner) = owner {
            seq.serialize_element(owner)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for Compact {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Elements;
        impl<'de> serde::de::Visitor<'de> for Elements {
            type Value = Compact;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a compact count site: an array of 10 or 11 elements")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Compact, A::Error> {
                fn next<'de, T: Deserialize<'de>, A: serde::de::SeqAccess<'de>>(
                    seq: &mut A,
                    i: usize,
                ) -> Result<T, A::Error> {
                    seq.next_element()?
                        .ok_or_else(|| serde::de::Error::invalid_length(i, &Elements))
                }
                Ok(Compact(
                    next(&mut seq, 0)?,
                    next(&mut seq, 1)?,
                    next(&mut seq, 2)?,
                    next(&mut seq, 3)?,
                    next(&mut seq, 4)?,
                    next(&mut seq, 5)?,
                    next(&mut seq, 6)?,
                    next(&mut seq, 7)?,
                    next(&mut seq, 8)?,
                    next(&mut seq, 9)?,
                    seq.next_element()?,
                ))
            }
        }
        d.deserialize_seq(Elements)
    }
}

/// A compact count site as version 3 wrote it (read, never written).
#[derive(Deserialize)]
pub(in crate::splicer) struct Compact3(
    /// id
    u64,
    /// the point as written
    String,
    Mechanism,
    /// the point's canonical form, `None` when it is the point as written
    Option<String>,
    /// the function: name, address, size, object
    FunctionRow,
    /// site - function address
    u64,
    /// displaced length
    usize,
    /// patch length
    usize,
    /// the displaced instructions' offsets from the site
    Vec<u64>,
    /// the displaced instructions' text
    String,
    /// original bytes (hex)
    String,
    /// patched bytes (hex)
    String,
    /// code block: id, address - site (wrapping), size
    (u64, u64, usize),
    /// data block: id, address - code address (wrapping); `None` for none (a count trap the
    /// dispatcher counts, written by a version-3 build that had item 1 of issue 26)
    Option<(u64, u64)>,
    /// [`HAS_REPLAY`], [`HAS_DISPATCH`]
    u8,
);

/// A compact record's function: an index into its document's `functions`, or the row itself
/// (a function no other record of the document has: a table row and an index would cost more).
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
pub(in crate::splicer) enum FunctionRef {
    Index(usize),
    Row(FunctionRow),
}

/// A live splice as saved.
#[derive(Serialize)]
#[serde(untagged)]
pub(in crate::splicer) enum RecordRef<'a> {
    Compact(Box<Compact>),
    Whole(&'a LiveSplice),
}

/// The tables of one document being written (a snapshot or a change line): its records are
/// made through [`Tables::record`], which notes what they use, then [`Tables::finish`] gives
/// the tables, written before the records.
#[derive(Default)]
pub(in crate::splicer) struct Tables<'a> {
    owners: Vec<&'a Owner>,
    owner_index: HashMap<&'a Owner, usize>,
    /// Every function a record uses, with the number of records that use it.
    functions: Vec<(FunctionRow, usize)>,
    function_index: HashMap<FunctionRow, usize>,
}

/// The tables of a document, as written.
pub(in crate::splicer) struct Written<'a> {
    pub(in crate::splicer) owners: Vec<&'a Owner>,
    pub(in crate::splicer) functions: Vec<FunctionRow>,
}

impl<'a> Tables<'a> {
    /// `s` as saved in this document: compact if it is a count splice the array gives back
    /// exactly (its owner and function then in the tables), else whole.
    pub(in crate::splicer) fn record(&mut self, s: &'a LiveSplice) -> RecordRef<'a> {
        let Some((mut c, function)) = compact(s) else {
            return RecordRef::Whole(s);
        };
        let owner = s.request.options.owner.as_ref();
        if !exact(s, &c, &function, owner) {
            return RecordRef::Whole(s);
        }
        let next = self.functions.len();
        let i = *self.function_index.entry(function).or_insert_with_key(|f| {
            self.functions.push((f.clone(), 0));
            next
        });
        self.functions[i].1 += 1;
        c.3 = FunctionRef::Index(i);
        c.10 = owner.map(|o| {
            let next = self.owners.len();
            *self.owner_index.entry(o).or_insert_with(|| {
                self.owners.push(o);
                next
            })
        });
        RecordRef::Compact(Box::new(c))
    }

    /// The tables of the document whose records are `records` (all made by
    /// [`Tables::record`]): a function only one record uses goes into that record, the others
    /// are numbered in the order of their first use.
    pub(in crate::splicer) fn finish(self, records: &mut [RecordRef<'_>]) -> Written<'a> {
        let mut number = vec![None; self.functions.len()];
        let mut functions = Vec::new();
        for (i, (row, uses)) in self.functions.iter().enumerate() {
            if *uses > 1 {
                number[i] = Some(functions.len());
                functions.push(row.clone());
            }
        }
        for r in records {
            if let RecordRef::Compact(c) = r {
                if let FunctionRef::Index(i) = c.3 {
                    c.3 = match number[i] {
                        Some(n) => FunctionRef::Index(n),
                        None => FunctionRef::Row(self.functions[i].0.clone()),
                    };
                }
            }
        }
        Written {
            owners: self.owners,
            functions,
        }
    }
}

/// The tables of one document as read (absent: empty).
pub(in crate::splicer) struct ReadTables {
    pub(in crate::splicer) owners: Vec<Owner>,
    pub(in crate::splicer) functions: Vec<FunctionRow>,
}

/// Whether `c` (with `function` and `owner` for its indexes) decodes to `s`, field by field
/// (every field of a live splice, those its whole form leaves out too: an array is kept only
/// where reading it back gives the very splice).
fn exact(s: &LiveSplice, c: &Compact, function: &FunctionRow, owner: Option<&Owner>) -> bool {
    expand(c, function, owner).is_ok_and(|back| back == *s)
}

/// The point text the array leaves out: the site's address (`0x...`, a coverage site's point)
/// with [`AT_SITE`], else the function's name (a point at its entry, whose site is past the
/// entry's endbr64 and ftrace NOP, so the offset does not give it). A point written otherwise
/// is kept as written.
fn default_point(name: &str, site: u64, flags: u8) -> String {
    match flags & AT_SITE {
        0 => name.to_string(),
        _ => format!("{site:#x}"),
    }
}

/// The array of a count splice whose only option is its owner (not yet checked to be exact;
/// its indexes 0 until the tables give them), and its function's row.
fn compact(s: &LiveSplice) -> Option<(Compact, FunctionRow)> {
    // Every option but the owner at its default (a new option must be named here).
    let SpliceOptions {
        when,
        maxactive,
        by,
        only,
        owner: _,
    } = &s.request.options;
    let plain = s.request.action == Action::Count
        && *when == When::Entry
        && maxactive.is_none()
        && by.is_none()
        && only.is_empty()
        && s.dest_fn == 0
        && s.component.is_none()
        && s.springboard_patch.is_none()
        && s.plan.springboard.is_none()
        && s.handler_range.is_none()
        && s.inflight.is_none()
        && s.slot().is_none()
        && !s.plan.displaced_bytes.is_empty()
        && s.point.function.kind == SymbolKind::Function
        && s.point.function.version.is_none();
    if !plain {
        return None;
    }
    let site = s.point.site;
    let f = &s.point.function;
    let offset = site.wrapping_sub(f.addr);
    let mut flags = 0;
    if s.replay.is_some() {
        flags |= HAS_REPLAY;
    }
    if s.dispatch.is_some() {
        flags |= HAS_DISPATCH;
    }
    if s.request.mechanism == Mechanism::Jmp {
        flags |= IS_JMP;
    }
    if s.request.at == default_point(&f.name, site, AT_SITE) {
        flags |= AT_SITE;
    }
    let c = Compact(
        s.id.0,
        (s.request.at != default_point(&f.name, site, flags)).then(|| s.request.at.clone()),
        (s.point.spec_text != s.request.at).then(|| s.point.spec_text.clone()),
        FunctionRef::Index(0),
        offset,
        to_hex(&s.plan.displaced_bytes),
        to_hex(&s.site_patch.new),
        (s.code.id, s.code.addr.wrapping_sub(site), s.code.size),
        s.data
            .as_ref()
            .map(|d| (d.id, d.addr.wrapping_sub(s.code.addr))),
        flags,
        None,
    );
    Some((c, (f.name.clone(), f.addr, f.size, f.origin.clone())))
}

/// What a compact record of any version holds besides its displaced window.
struct Common<'a> {
    id: u64,
    at: String,
    mechanism: Mechanism,
    owner: Option<&'a Owner>,
    spec_text: &'a Option<String>,
    function: &'a FunctionRow,
    offset: u64,
    new: &'a str,
    code: (u64, u64, usize),
    data: Option<(u64, u64)>,
    flags: u8,
}

/// The splice a compact record describes, given its plan summary (made from its window).
fn expand_common(c: Common<'_>, plan: PlanSummary, old: Vec<u8>) -> Result<LiveSplice, String> {
    let (name, faddr, fsize, origin) = c.function;
    let site = faddr.wrapping_add(c.offset);
    let (code_id, code_delta, code_size) = c.code;
    let code = site.wrapping_add(code_delta);
    let mut request = SpliceRequest::new(&c.at, Action::Count, c.mechanism);
    request.options.owner = c.owner.cloned();
    Ok(LiveSplice {
        id: SpliceId(c.id),
        request,
        point: ResolvedPoint {
            spec_text: c.spec_text.clone().unwrap_or_else(|| c.at.clone()),
            function: Symbol {
                name: name.clone(),
                addr: *faddr,
                size: *fsize,
                kind: SymbolKind::Function,
                origin: origin.clone(),
                version: None,
            },
            site,
        },
        plan,
        dest_fn: 0,
        component: None,
        site_patch: TextPatch {
            addr: site,
            old,
            new: from_hex(c.new)?,
        },
        springboard_patch: None,
        code: RepoBlock {
            id: code_id,
            addr: code,
            size: code_size,
            kind: BlockKind::Code,
        },
        data: c.data.map(|(id, delta)| RepoBlock {
            id,
            addr: code.wrapping_add(delta),
            size: 16,
            kind: BlockKind::Data,
        }),
        entry: code,
        replay: (c.flags & HAS_REPLAY != 0).then_some(code),
        dispatch: (c.flags & HAS_DISPATCH != 0).then_some(DispatchEntry {
            site,
            dest: code,
            handler: 0,
            cookie: 0,
            only: None,
        }),
        handler_range: None,
        inflight: None,
        ret: None,
        keyed: None,
    })
}

/// The window of a version-4 or -6 record at `site`: its plan summary and the original bytes
/// under the patch.
fn window_plan(
    site: u64,
    window: &str,
    new: &str,
    flags: u8,
) -> Result<(PlanSummary, Vec<u8>), String> {
    let bytes = from_hex(window)?;
    let patch_len = from_hex(new)?.len();
    let old = bytes
        .get(..patch_len)
        .ok_or_else(|| format!("the window `{window}` is shorter than the patch `{new}`"))?
        .to_vec();
    let (text, addrs) = DisplacedText::decode(&bytes, site)
        .ok_or_else(|| format!("the window `{window}` is not whole instructions"))?;
    let plan = PlanSummary {
        site,
        mechanism: mechanism_of(flags),
        displaced_len: bytes.len(),
        patch_len,
        displaced_addrs: addrs,
        displaced_text: text,
        springboard: None,
        displaced_bytes: bytes,
    };
    Ok((plan, old))
}

fn mechanism_of(flags: u8) -> Mechanism {
    match flags & IS_JMP {
        0 => Mechanism::Trap,
        _ => Mechanism::Jmp,
    }
}

/// The splice `c` describes, with `function` and `owner` its indexes name.
fn expand(
    c: &Compact,
    function: &FunctionRow,
    owner: Option<&Owner>,
) -> Result<LiveSplice, String> {
    let Compact(id, at, spec_text, _, offset, window, new, code, data, flags, _) = c;
    let site = function.1.wrapping_add(*offset);
    let (plan, old) = window_plan(site, window, new, *flags)?;
    let common = Common {
        id: *id,
        at: at
            .clone()
            .unwrap_or_else(|| default_point(&function.0, site, *flags)),
        mechanism: mechanism_of(*flags),
        owner,
        spec_text,
        function,
        offset: *offset,
        new,
        code: *code,
        data: *data,
        flags: *flags,
    };
    expand_common(common, plan, old)
}

/// The splice a version-3 record describes (its window's bytes not known yet).
fn expand3(c: &Compact3) -> Result<LiveSplice, String> {
    let Compact3(
        id,
        at,
        mechanism,
        spec_text,
        function,
        offset,
        displaced_len,
        patch_len,
        offsets,
        text,
        old,
        new,
        code,
        data,
        flags,
    ) = c;
    let site = function.1.wrapping_add(*offset);
    let plan = PlanSummary {
        site,
        mechanism: *mechanism,
        displaced_len: *displaced_len,
        patch_len: *patch_len,
        displaced_addrs: offsets.iter().map(|o| site.wrapping_add(*o)).collect(),
        displaced_text: DisplacedText::from(text.clone()),
        springboard: None,
        displaced_bytes: Vec::new(),
    };
    let common = Common {
        id: *id,
        at: at.clone(),
        mechanism: *mechanism,
        owner: None,
        spec_text,
        function,
        offset: *offset,
        new,
        code: *code,
        data: *data,
        flags: *flags & (HAS_REPLAY | HAS_DISPATCH),
    };
    expand_common(common, plan, from_hex(old)?)
}

/// A live splice as read: any form (the current one first).
#[derive(Deserialize)]
#[serde(untagged)]
pub(in crate::splicer) enum Record {
    Compact(Box<Compact>),
    Compact3(Box<Compact3>),
    Whole(Box<LiveSplice>),
}

impl ReadTables {
    /// The splices `records` (read from the document of these tables) describe.
    pub(in crate::splicer) fn splices(
        &self,
        records: Vec<Record>,
    ) -> Result<Vec<LiveSplice>, String> {
        records
            .into_iter()
            .map(|r| match r {
                Record::Compact(c) => {
                    let function = match &c.3 {
                        FunctionRef::Row(row) => row,
                        FunctionRef::Index(i) => self.functions.get(*i).ok_or_else(|| {
                            format!(
                                "splice {}: function {i} of a table of {}",
                                c.0,
                                self.functions.len()
                            )
                        })?,
                    };
                    let owner =
                        c.10.map(|i| {
                            self.owners.get(i).ok_or_else(|| {
                                format!(
                                    "splice {}: owner {i} of a table of {}",
                                    c.0,
                                    self.owners.len()
                                )
                            })
                        })
                        .transpose()?;
                    expand(&c, function, owner)
                }
                Record::Compact3(c) => expand3(&c),
                Record::Whole(s) => Ok(*s),
            })
            .collect()
    }
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(s: &str) -> Result<Vec<u8>, String> {
    let bad = || format!("`{s}` is not hex bytes");
    if !s.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

#[cfg(test)]
#[path = "compact_owned_tests.rs"]
mod owned_tests;

#[cfg(test)]
#[path = "compact_tests.rs"]
mod tests;
