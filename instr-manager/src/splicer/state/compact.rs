//! The saved record of a live splice, compact for the commonest one (issue 26: about 900 bytes
//! of JSON per count site, against a goal of 64 bytes per site in all).
//!
//! A plain count splice (no options, no handler, no component, no springboard, no slot) is
//! saved as one JSON array of what re-creating and reverting it needs and nothing the rest
//! determines ([`Compact`], version 4): its id, the point as written (`null` when it is the
//! function's name), the function (name, address, size,
//! object), the site as an offset in it, the displaced window's original bytes (hex: its length,
//! the instructions' addresses and text and the original bytes under the patch decode from
//! them), the patched bytes (hex), its code block (id, address as a distance from the site,
//! size), its data block if it has one (id, address as a distance from the code) and the flags
//! (replay, dispatch entry, jmp). Entry, replay and the dispatch entry's destination are the
//! code block's address; a data block is 16 bytes. Any other splice, and a count splice the
//! array would not give back exactly, is saved whole (an object): [`record`] makes the array
//! only when decoding it yields the same bytes as the whole form, so nothing can be lost by the
//! encoding.
//!
//! Every form is read wherever a splice is (snapshot and log): whole (versions 1 to 4), the
//! version-3 array ([`Compact3`], with the text, the addresses and the original bytes, but not
//! the displaced window's bytes past the patch, which [`super::Splicer::restore`] reads back
//! from the target) and the version-4 array; the next snapshot writes the current version (5: the
//! same arrays).

use serde::{Deserialize, Deserializer, Serialize};
use trapvec::{BlockKind, DispatchEntry, RepoBlock, Symbol, SymbolKind, TextPatch};

use crate::plan::Mechanism;
use crate::point::ResolvedPoint;
use crate::splice::{Action, SpliceRequest};

use super::super::summary::{DisplacedText, PlanSummary};
use super::super::{LiveSplice, SpliceId};

/// Flag: the splice has a replay (at its code block).
const HAS_REPLAY: u8 = 1;
/// Flag: the splice has a dispatch entry (site -> its code block, no handler).
const HAS_DISPATCH: u8 = 2;
/// Flag (version 4): the mechanism is a jmp, not a trap.
const IS_JMP: u8 = 4;

/// A compact count site (version 4), a JSON array in this order.
#[derive(Serialize, Deserialize)]
pub(in crate::splicer) struct Compact(
    /// id
    u64,
    /// the point as written, `None` when it is [`default_point`]
    Option<String>,
    /// the point's canonical form, `None` when it is the point as written
    Option<String>,
    /// the function: name, address, size, object
    (String, u64, u64, Option<String>),
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
    /// [`HAS_REPLAY`], [`HAS_DISPATCH`], [`IS_JMP`]
    u8,
);

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
    (String, u64, u64, Option<String>),
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

/// A live splice as saved.
#[derive(Serialize)]
#[serde(untagged)]
pub(in crate::splicer) enum RecordRef<'a> {
    Compact(Box<Compact>),
    Whole(&'a LiveSplice),
}

/// `s` as saved: compact if it is a plain count splice the array gives back exactly.
pub(in crate::splicer) fn record(s: &LiveSplice) -> RecordRef<'_> {
    match compact(s) {
        Some(c) if exact(s, &c) => RecordRef::Compact(Box::new(c)),
        _ => RecordRef::Whole(s),
    }
}

/// Whether `c` decodes to what `s` serializes to.
fn exact(s: &LiveSplice, c: &Compact) -> bool {
    let whole = serde_json::to_vec(s).ok();
    let back = expand(c).ok().and_then(|b| serde_json::to_vec(&b).ok());
    whole.is_some() && whole == back
}

/// The point text the array leaves out: the function's name (a point at its entry, whose site
/// is past the entry's endbr64 and ftrace NOP, so the offset does not give it). A point written
/// with an offset is kept as written.
fn default_point(name: &str) -> String {
    name.to_string()
}

/// The array of a plain count splice (not yet checked to be exact).
fn compact(s: &LiveSplice) -> Option<Compact> {
    let plain = s.request.action == Action::Count
        && s.request == SpliceRequest::new(&s.request.at, Action::Count, s.request.mechanism)
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
    Some(Compact(
        s.id.0,
        (s.request.at != default_point(&f.name)).then(|| s.request.at.clone()),
        (s.point.spec_text != s.request.at).then(|| s.point.spec_text.clone()),
        (f.name.clone(), f.addr, f.size, f.origin.clone()),
        offset,
        to_hex(&s.plan.displaced_bytes),
        to_hex(&s.site_patch.new),
        (s.code.id, s.code.addr.wrapping_sub(site), s.code.size),
        s.data
            .as_ref()
            .map(|d| (d.id, d.addr.wrapping_sub(s.code.addr))),
        flags,
    ))
}

/// What a compact record of either version holds besides its displaced window.
struct Common<'a> {
    id: u64,
    at: String,
    mechanism: Mechanism,
    spec_text: &'a Option<String>,
    function: &'a (String, u64, u64, Option<String>),
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
    Ok(LiveSplice {
        id: SpliceId(c.id),
        request: SpliceRequest::new(&c.at, Action::Count, c.mechanism),
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

/// The splice `c` describes.
fn expand(c: &Compact) -> Result<LiveSplice, String> {
    let Compact(id, at, spec_text, function, offset, window, new, code, data, flags) = c;
    let site = function.1.wrapping_add(*offset);
    let bytes = from_hex(window)?;
    let new_bytes = from_hex(new)?;
    let old = bytes
        .get(..new_bytes.len())
        .ok_or_else(|| format!("the window `{window}` is shorter than the patch `{new}`"))?
        .to_vec();
    let (text, addrs) = DisplacedText::decode(&bytes, site)
        .ok_or_else(|| format!("the window `{window}` is not whole instructions"))?;
    let mechanism = match flags & IS_JMP {
        0 => Mechanism::Trap,
        _ => Mechanism::Jmp,
    };
    let plan = PlanSummary {
        site,
        mechanism,
        displaced_len: bytes.len(),
        patch_len: new_bytes.len(),
        displaced_addrs: addrs,
        displaced_text: text,
        springboard: None,
        displaced_bytes: bytes,
    };
    let common = Common {
        id: *id,
        at: at.clone().unwrap_or_else(|| default_point(&function.0)),
        mechanism,
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

/// A live splice as read: any form.
#[derive(Deserialize)]
#[serde(untagged)]
enum Record {
    Compact(Box<Compact>),
    Compact3(Box<Compact3>),
    Whole(Box<LiveSplice>),
}

/// `deserialize_with` for a list of saved splices in any form.
pub(in crate::splicer) fn splices<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<LiveSplice>, D::Error> {
    Vec::<Record>::deserialize(d)?
        .into_iter()
        .map(|r| match r {
            Record::Compact(c) => expand(&c).map_err(serde::de::Error::custom),
            Record::Compact3(c) => expand3(&c).map_err(serde::de::Error::custom),
            Record::Whole(s) => Ok(*s),
        })
        .collect()
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
mod tests {
    use trapvec::fake::{func_addr, FakeKernel, FUNC};

    use super::record;
    use crate::plan::Mechanism;
    use crate::splicer::state_log::{Saved, StateLog};
    use crate::splicer::{Action, LiveSplice, SpliceRequest, Splicer};

    fn count(at: &str, mechanism: Mechanism) -> SpliceRequest {
        SpliceRequest::new(at, Action::Count, mechanism)
    }

    fn state_json(sp: &Splicer<FakeKernel>) -> serde_json::Value {
        serde_json::from_slice(&sp.export_state()).unwrap()
    }

    /// The whole form of every splice (what version 2 wrote), as a state of `version`.
    fn whole_form(sp: &Splicer<FakeKernel>, version: u32) -> serde_json::Value {
        let mut v = state_json(sp);
        v["version"] = version.into();
        let whole: Vec<serde_json::Value> = sp
            .live()
            .map(|s: &LiveSplice| serde_json::to_value(s).unwrap())
            .collect();
        v["splices"] = whole.into();
        v
    }

    #[test]
    fn a_count_site_is_saved_as_a_compact_array_that_reads_back_the_same_splice() {
        let k = FakeKernel::new();
        let mut sp = Splicer::new(k.clone());
        sp.apply(&[
            count("f0", Mechanism::Trap),
            count("f1+0x5", Mechanism::Jmp),
            count("f2+0x9", Mechanism::Trap),
        ])
        .unwrap();
        let v = state_json(&sp);
        let splices = v["splices"].as_array().unwrap();
        assert_eq!(splices.len(), 3);
        assert!(splices.iter().all(serde_json::Value::is_array), "{v}");
        let again = Splicer::import_state(k, &sp.export_state()).unwrap();
        assert_eq!(
            whole_form(&again, 3),
            whole_form(&sp, 3),
            "a splice read back from its compact record differs"
        );
        for s in sp.live() {
            let whole = serde_json::to_vec(s).unwrap().len();
            let compact = serde_json::to_vec(&record(s)).unwrap().len();
            eprintln!("{}: {whole} bytes whole, {compact} compact", s.request.at);
            assert!(compact * 4 < whole, "{compact} bytes against {whole}");
        }
    }

    #[test]
    fn a_splice_the_array_cannot_describe_is_saved_whole() {
        let mut sp = Splicer::new(FakeKernel::new());
        sp.apply(&[count("f0", Mechanism::Trap)]).unwrap();
        let plain = sp.live().next().unwrap().clone();
        let is_whole = |s: &LiveSplice| serde_json::to_value(record(s)).unwrap().is_object();
        assert!(!is_whole(&plain));
        // Not a plain count: a handler, a component's.
        let handled = LiveSplice {
            dest_fn: 0x1234,
            ..plain.clone()
        };
        assert!(is_whole(&handled));
        // A plain count the array would not give back: its data block is not 16 bytes.
        let mut odd = plain.clone();
        odd.data = Some(trapvec::RepoBlock {
            size: 32,
            ..odd.code.clone()
        });
        assert!(is_whole(&odd));
        // A dispatch entry with a cookie the array has no room for.
        let mut cookie = plain;
        cookie.dispatch.as_mut().unwrap().cookie = 9;
        assert!(is_whole(&cookie));
    }

    #[test]
    fn a_version_2_state_and_its_log_are_read_and_the_first_save_migrates_them_to_compact() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.log");
        let k = FakeKernel::new();
        let mut sp = Splicer::new(k.clone());
        sp.apply(&[count("f0", Mechanism::Trap)]).unwrap();
        let mut old = whole_form(&sp, 2);
        old["epoch"] = 5.into();
        k.put_blob(k.blob().0, &serde_json::to_vec(&old).unwrap())
            .unwrap();
        // A version-2 log after it: one change adding f2's splice, whole.
        let id = sp.apply(&[count("f2", Mechanism::Jmp)]).unwrap()[0];
        let added = serde_json::to_value(&*sp.live[&id]).unwrap();
        let change = serde_json::json!({"add": [added], "remove": [], "next_splice": sp.next});
        std::fs::write(
            &path,
            format!("{{\"format\":\"trapvec-state-log\",\"version\":2,\"epoch\":5}}\n{change}\n"),
        )
        .unwrap();
        let (mut again, mut log, replay) = StateLog::load(&path, k.clone(), &k.blob().1).unwrap();
        assert_eq!(
            (replay.changes, replay.stale, replay.torn),
            (1, false, false)
        );
        assert_eq!(whole_form(&again, 3), whole_form(&sp, 3));
        // The first change is written as a new snapshot of the current version, compact.
        again.apply(&[count("f3", Mechanism::Trap)]).unwrap();
        let put = |_: &FakeKernel, b: &[u8]| k.put_blob(k.blob().0, b).map(|_| ());
        assert!(matches!(
            log.save(&mut again, put).unwrap(),
            Saved::Compacted { .. }
        ));
        let v: serde_json::Value = serde_json::from_slice(&k.blob().1).unwrap();
        assert_eq!(v["version"], super::super::STATE_VERSION);
        let splices = v["splices"].as_array().unwrap();
        assert_eq!(splices.len(), 3);
        assert!(splices.iter().all(serde_json::Value::is_array), "{v}");
    }

    /// The record of a version-3 state (its array as that version wrote it): text, addresses
    /// and original bytes, no window bytes.
    fn version_3_record(s: &LiveSplice) -> serde_json::Value {
        let (site, f) = (s.point.site, &s.point.function);
        let data = s.data.as_ref().expect("a jmp count has a data block");
        let offsets: Vec<u64> = s.plan.displaced_addrs.iter().map(|a| a - site).collect();
        serde_json::json!([
            s.id.0,
            s.request.at,
            s.request.mechanism,
            null,
            [f.name, f.addr, f.size, null],
            site - f.addr,
            s.plan.displaced_len,
            s.plan.patch_len,
            offsets,
            s.plan.displaced_text.as_str(),
            super::to_hex(&s.site_patch.old),
            super::to_hex(&s.site_patch.new),
            [s.code.id, s.code.addr.wrapping_sub(site), s.code.size],
            [data.id, data.addr.wrapping_sub(s.code.addr)],
            u8::from(s.replay.is_some()) | u8::from(s.dispatch.is_some()) << 1
        ])
    }

    #[test]
    fn a_version_3_state_is_read_its_window_bytes_read_back_and_saved_again_as_version_4() {
        let k = FakeKernel::new();
        let mut sp = Splicer::new(k.clone());
        sp.apply(&[count("f0", Mechanism::Jmp), count("f1+0x5", Mechanism::Jmp)])
            .unwrap();
        let mut v3 = state_json(&sp);
        v3["version"] = 3.into();
        v3["splices"] = sp.live().map(version_3_record).collect();
        let again = Splicer::import_state(k.clone(), &serde_json::to_vec(&v3).unwrap()).unwrap();
        assert!(again.live().all(|s| !s.plan.displaced_bytes.is_empty()));
        assert_eq!(
            whole_form(&again, 4),
            whole_form(&sp, 4),
            "a splice read from a version-3 record differs"
        );
        let v4 = state_json(&again);
        // Version 5 writes version 4's arrays (it changed only what a key `pid` means).
        assert_eq!(v4["version"], super::super::STATE_VERSION);
        let splices = v4["splices"].as_array().unwrap();
        assert!(
            splices
                .iter()
                .all(|r| r.as_array().is_some_and(|a| a.len() == 10)),
            "{v4}"
        );
    }

    /// The fake machine as the version-3 code left it after writing `testdata/v3.*` (commit
    /// bf52218's splicer, before item 1 of issue 26: every count site has a data block): its
    /// memory, blocks, dispatch entries and text patches, with the snapshot as its blob.
    fn v3_machine() -> FakeKernel {
        let m: serde_json::Value =
            serde_json::from_str(include_str!("testdata/v3.machine.json")).unwrap();
        let field = |name: &str| m[name].clone();
        let k = FakeKernel::new();
        {
            let mut st = k.state();
            for run in m["memory"].as_array().unwrap() {
                let addr = run[0].as_u64().unwrap();
                let bytes = super::from_hex(run[1].as_str().unwrap()).unwrap();
                for (i, b) in bytes.into_iter().enumerate() {
                    st.memory.insert(addr + i as u64, b);
                }
            }
            st.next_block = m["next_block"].as_u64().unwrap();
            let blocks: Vec<trapvec::RepoBlock> = serde_json::from_value(field("blocks")).unwrap();
            st.blocks = blocks.into_iter().map(|b| (b.id, b)).collect();
            st.sealed = serde_json::from_value(field("sealed")).unwrap();
            let dispatch: Vec<trapvec::DispatchEntry> =
                serde_json::from_value(field("dispatch")).unwrap();
            st.dispatch = dispatch.into_iter().map(|d| (d.site, d)).collect();
            let patched: Vec<(u64, u8)> = serde_json::from_value(field("patched")).unwrap();
            st.patched = patched.into_iter().collect();
            st.blob = (
                m["blob_generation"].as_u64().unwrap(),
                include_bytes!("testdata/v3.snapshot.json").to_vec(),
            );
        }
        k
    }

    /// A snapshot and a log written by the version-3 code (count traps and jmps at entries and
    /// offsets, each with a data block, one splice saved whole, a splice added and one removed
    /// in the log) are read: the windows' bytes are read back from the text, the hits are the
    /// dispatcher's, the first change writes a version-4 snapshot (arrays of 10, the whole
    /// record kept whole) that reads back the same splices, and removing them all leaves the
    /// machine as it was before any splice (every block given back, the data blocks too).
    #[test]
    fn a_state_written_by_version_3_is_read_migrated_to_version_4_and_removed_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.log");
        std::fs::write(&path, include_bytes!("testdata/v3.log")).unwrap();
        let k = v3_machine();
        let (mut sp, mut log, replay) = StateLog::load(&path, k.clone(), &k.blob().1).unwrap();
        assert_eq!(
            (replay.changes, replay.stale, replay.torn),
            (2, false, false)
        );
        let live: Vec<(&str, Mechanism, bool)> = sp
            .live()
            .map(|s| (s.request.at.as_str(), s.request.mechanism, s.data.is_some()))
            .collect();
        assert_eq!(
            live,
            [
                ("f0", Mechanism::Trap, true),
                ("f1+0x5", Mechanism::Jmp, true),
                ("f2+0x9", Mechanism::Trap, true),
                ("f0+0x9", Mechanism::Trap, true),
                ("f2", Mechanism::Trap, true),
            ]
        );
        for s in sp.live() {
            let off = usize::try_from(s.plan.site - func_addr(&s.point.function.name)).unwrap();
            assert_eq!(
                s.plan.displaced_bytes,
                FUNC[off..off + s.plan.displaced_len],
                "{}: the window's bytes read back from the text",
                s.request.at
            );
        }
        let f0 = sp.live().next().unwrap();
        let (f0_id, f0_site) = (f0.id, f0.point.site);
        k.state().hits.insert(f0_site, 11);
        assert_eq!(sp.hits(f0_id).unwrap().hits, 11);
        // The first change migrates: a new snapshot of version 4, not a line in the old log.
        sp.apply(&[count("f3", Mechanism::Trap)]).unwrap();
        let put = |_: &FakeKernel, b: &[u8]| k.put_blob(k.blob().0, b).map(|_| ());
        assert!(matches!(
            log.save(&mut sp, put).unwrap(),
            Saved::Compacted { .. }
        ));
        let v: serde_json::Value = serde_json::from_slice(&k.blob().1).unwrap();
        assert_eq!(v["version"], super::super::STATE_VERSION);
        let lens: Vec<Option<usize>> = v["splices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_array().map(Vec::len))
            .collect();
        assert_eq!(
            lens,
            [Some(10), Some(10), Some(10), None, Some(10), Some(10)],
            "plain counts as arrays, the one with a task predicate whole: {v}"
        );
        let (mut again, _, _) = StateLog::load(&path, k.clone(), &k.blob().1).unwrap();
        assert_eq!(whole_form(&again, 4), whole_form(&sp, 4));
        let ids: Vec<_> = again.live().map(|s| s.id).collect();
        assert_eq!(again.remove(&ids).unwrap()[0].hits, 11);
        assert!(
            k.pristine(),
            "text, dispatch entries and blocks as before any splice"
        );
    }

    /// A version-4 record of a count site at its function's entry leaves out the point text
    /// (the function's name), the displaced text and addresses (decoded from the window's
    /// bytes) and the data block the dispatcher's count needs none of: under 120 bytes here
    /// (the fake's block ids and the distance of its code from the site are 20 and 10 digits;
    /// the module's ids are shorter). A jmp's keeps its data block: a fifth shorter than the
    /// version-3 array of the same splice.
    #[test]
    fn a_version_4_record_is_shorter_than_the_version_3_record() {
        let mut sp = Splicer::new(FakeKernel::new());
        sp.apply(&[count("f0", Mechanism::Trap), count("f1", Mechanism::Jmp)])
            .unwrap();
        for s in sp.live() {
            let v4 = serde_json::to_string(&record(s)).unwrap();
            eprintln!("{}: {} bytes: {v4}", s.request.at, v4.len());
            match s.data.is_some() {
                true => {
                    let v3 = version_3_record(s).to_string();
                    assert!(5 * v4.len() < 4 * v3.len(), "{v4} against {v3}");
                }
                false => assert!(v4.len() < 120, "{v4}"),
            }
        }
    }
}
