//! The data block (one `.bss` symbol): counters, then the maps' open-addressed tables; and
//! reading it back after the run.
//!
//! ```text
//! [exit: u64][ring head: u64][ring: RING_RECORDS records, if a probe has printf]
//! [dropped: u64 per map][failed reads: u64 per handler][map 0 slots]...[map N slots]
//! slot = [state: u64 (0 empty, 1 being filled, 2 ready, 3 deleted)][key: u64 per key][value words]
//! record = [seq: u64 (its ticket + 1 once written)][format: u64][argument words]
//! ```
//!
//! The printf ring: a probe's printf takes a ticket (`lock xadd` on the head), writes its
//! record in slot `ticket % RING_RECORDS` (seq 0 first, then the format and the arguments,
//! then seq = ticket + 1) and never waits: when the tracer has not read a record by the time
//! its slot is taken again, the record is overwritten, and the tracer counts it as lost
//! ([`Drain`]), and says so at the end. Nothing is lost silently.

use crate::check::{MapInfo, MapKind, Ty};

/// A slot nobody claimed.
pub const EMPTY: u64 = 0;
/// A slot whose keys and initial value are written.
pub const READY: u64 = 2;
/// A slot whose entry was deleted: lookups go past it; the same keys take it again.
pub const DELETED: u64 = 3;
/// Records of the printf ring (a power of two).
pub const RING_RECORDS: usize = 256;
/// 8-byte words of a ring record: seq, format, arguments.
pub const RECORD_WORDS: usize = 2 + crate::check::PRINTF_WORDS;
/// Offset of the exit flag (set by `exit()`).
pub const EXIT_OFFSET: usize = 0;
/// Offset of the ring's head (tickets taken).
pub const HEAD_OFFSET: usize = 8;

/// Strings the program uses as values (`func`, `probe`, literals): a value is its index.
#[derive(Clone, Debug, Default)]
pub struct Strings(pub Vec<String>);

impl Strings {
    pub fn intern(&mut self, s: &str) -> u64 {
        let i = match self.0.iter().position(|x| x == s) {
            Some(i) => i,
            None => {
                self.0.push(s.to_string());
                self.0.len() - 1
            }
        };
        i as u64
    }
}

/// Where a map lives in the data block.
#[derive(Clone, Debug)]
pub struct MapLayout {
    pub info: MapInfo,
    /// A power of two.
    pub slots: usize,
    pub slot_words: usize,
    /// Byte offset of the table.
    pub offset: usize,
    /// Byte offset of the dropped-updates counter.
    pub dropped: usize,
}

/// One generated handler.
#[derive(Clone, Debug)]
pub struct HandlerLayout {
    /// The probe as reports name it (`compute`, `compute:return`, `libc.so.6:malloc+4`).
    pub probe: String,
    /// Byte offset of its failed-reads counter.
    pub failed: usize,
}

/// The whole data block.
#[derive(Clone, Debug)]
pub struct Layout {
    pub maps: Vec<MapLayout>,
    pub handlers: Vec<HandlerLayout>,
    pub size: usize,
    /// Byte offset of the printf ring.
    pub ring: usize,
    /// Its records ([`RING_RECORDS`], or 0 when no probe prints).
    pub ring_records: usize,
}

impl Layout {
    pub fn new(maps: &[MapInfo], handlers: Vec<String>, slots: usize, ring: bool) -> Layout {
        let ring_records = if ring { RING_RECORDS } else { 0 };
        let ring = HEAD_OFFSET + 8;
        let mut off = ring + ring_records * RECORD_WORDS * 8;
        let mut out = Vec::new();
        for m in maps {
            out.push(MapLayout {
                info: m.clone(),
                slots: if m.keys.is_empty() { 1 } else { slots },
                slot_words: 1 + key_words(m) + m.kind.value_words(),
                offset: 0,
                dropped: off,
            });
            off += 8;
        }
        let handlers = handlers
            .into_iter()
            .map(|probe| {
                let h = HandlerLayout { probe, failed: off };
                off += 8;
                h
            })
            .collect();
        for m in &mut out {
            m.offset = off;
            off += m.slots * m.slot_words * 8;
        }
        Layout {
            maps: out,
            handlers,
            size: off,
            ring,
            ring_records,
        }
    }
}

/// 8-byte words of a map's keys.
pub fn key_words(m: &MapInfo) -> usize {
    m.keys.iter().map(|t| t.words()).sum()
}

/// A key's part as printed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(untagged)]
pub enum KeyPart {
    Int(i128),
    Str(String),
}

/// A map entry's value.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum Value {
    Int(i128),
    /// Histogram buckets: (label, count), non-empty range only.
    Buckets(Vec<Bucket>),
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Bucket {
    pub label: String,
    /// Lower bound, inclusive (`None`: unbounded).
    pub lo: Option<i64>,
    pub count: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Entry {
    pub key: Vec<KeyPart>,
    pub value: Value,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MapResult {
    pub name: String,
    #[serde(flatten)]
    pub kind: MapKind,
    pub entries: Vec<Entry>,
    pub slots: usize,
    /// Updates lost because the table was full.
    pub dropped: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FailedReads {
    pub probe: String,
    pub count: u64,
}

/// What the run left in the maps.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Results {
    pub maps: Vec<MapResult>,
    pub failed_reads: Vec<FailedReads>,
}

/// Why a dump cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("the dump of the maps has {got} bytes, {want} expected")]
pub struct DumpError {
    pub got: usize,
    pub want: usize,
}

fn word(data: &[u8], off: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&data[off..off + 8]);
    u64::from_le_bytes(b)
}

fn signed(v: u64) -> i64 {
    i64::from_ne_bytes(v.to_ne_bytes())
}

/// A value word as printed: signed maps as i64, others as u64.
fn num(v: u64, is_signed: bool) -> i128 {
    if is_signed {
        i128::from(signed(v))
    } else {
        i128::from(v)
    }
}

/// Power-of-two sizes as bpftrace writes them: 1K, 2M, ...
pub fn size_label(v: u64) -> String {
    const S: [&str; 7] = ["", "K", "M", "G", "T", "P", "E"];
    let mut v = v;
    let mut i = 0;
    while v >= 1024 && v & 1023 == 0 && i < S.len() - 1 {
        v /= 1024;
        i += 1;
    }
    format!("{v}{}", S[i])
}

fn hist_buckets(words: &[u64]) -> Vec<Bucket> {
    let mut out = Vec::new();
    for (i, &c) in words.iter().enumerate() {
        let (label, lo) = match i {
            0 => ("(..., 0)".to_string(), None),
            1 => ("[0]".to_string(), Some(0)),
            2 => ("[1]".to_string(), Some(1)),
            _ => {
                let lo = 1u64 << (i - 2);
                let hi = lo << 1;
                let hi = if i > 64 {
                    "...".to_string()
                } else {
                    size_label(hi)
                };
                (format!("[{}, {hi})", size_label(lo)), Some(signed(lo)))
            }
        };
        out.push(Bucket {
            label,
            lo,
            count: c,
        });
    }
    trim(out)
}

fn lhist_bucket_list(words: &[u64], lo: i64, hi: i64, step: i64) -> Vec<Bucket> {
    let n = words.len();
    let mut out = Vec::new();
    for (i, &c) in words.iter().enumerate() {
        let (label, l) = if i == 0 {
            (format!("(..., {lo})"), None)
        } else if i == n - 1 {
            (format!("[{hi}, ...)"), Some(hi))
        } else {
            let a = lo + (i64::try_from(i).unwrap_or(i64::MAX) - 1) * step;
            (format!("[{a}, {})", (a + step).min(hi)), Some(a))
        };
        out.push(Bucket {
            label,
            lo: l,
            count: c,
        });
    }
    trim(out)
}

/// The buckets from the first to the last non-empty one.
fn trim(b: Vec<Bucket>) -> Vec<Bucket> {
    let first = b.iter().position(|x| x.count > 0);
    let last = b.iter().rposition(|x| x.count > 0);
    match (first, last) {
        (Some(f), Some(l)) => b[f..=l].to_vec(),
        _ => Vec::new(),
    }
}

impl Layout {
    /// Read the maps and counters from a dump of the data block.
    pub fn decode(&self, data: &[u8], strings: &[String]) -> Result<Results, DumpError> {
        self.decode_since(data, strings, &[])
    }

    /// As [`Layout::decode`], each map `i` with a `bases[i]` (a snapshot of the data block
    /// taken when an interval cleared it) counted since then: a slot that held the same keys
    /// in the base has the base's value words subtracted (counts, sums, averages and buckets
    /// add up), and an entry with nothing since is left out.
    pub fn decode_since(
        &self,
        data: &[u8],
        strings: &[String],
        bases: &[Option<Vec<u8>>],
    ) -> Result<Results, DumpError> {
        if data.len() != self.size {
            return Err(DumpError {
                got: data.len(),
                want: self.size,
            });
        }
        let mut maps = Vec::new();
        for (mi, m) in self.maps.iter().enumerate() {
            let base_block = bases
                .get(mi)
                .and_then(|b| b.as_deref())
                .filter(|b| b.len() == self.size);
            let mut entries = Vec::new();
            let nk = key_words(&m.info);
            for s in 0..m.slots {
                let base = m.offset + s * m.slot_words * 8;
                if word(data, base) != READY {
                    continue;
                }
                let mut at = base + 8;
                let mut key = Vec::new();
                for t in &m.info.keys {
                    let v = word(data, at);
                    key.push(match t {
                        Ty::Str => KeyPart::Str(
                            usize::try_from(v)
                                .ok()
                                .and_then(|i| strings.get(i))
                                .cloned()
                                .unwrap_or_else(|| format!("?{v}")),
                        ),
                        Ty::Int { signed: s } => KeyPart::Int(num(v, *s)),
                        Ty::Bytes(n) => {
                            let b = &data[at..at + n];
                            let end = b.iter().position(|&c| c == 0).unwrap_or(*n);
                            KeyPart::Str(String::from_utf8_lossy(&b[..end]).into_owned())
                        }
                    });
                    at += 8 * t.words();
                }
                let mut vals: Vec<u64> = (0..m.info.kind.value_words())
                    .map(|i| word(data, base + 8 * (1 + nk + i)))
                    .collect();
                if let Some(b) = base_block {
                    let same = word(b, base) == READY
                        && (0..nk)
                            .all(|i| word(b, base + 8 + 8 * i) == word(data, base + 8 + 8 * i));
                    if same {
                        for (i, v) in vals.iter_mut().enumerate() {
                            *v = v.wrapping_sub(word(b, base + 8 * (1 + nk + i)));
                        }
                        if vals.iter().all(|&v| v == 0) {
                            continue;
                        }
                    }
                }
                let sg = m.info.signed;
                let value = match m.info.kind {
                    MapKind::Count => Value::Int(i128::from(vals[0])),
                    MapKind::Sum | MapKind::Min | MapKind::Max | MapKind::Value => {
                        Value::Int(num(vals[0], sg))
                    }
                    MapKind::Avg => {
                        let n = i128::from(vals[1]).max(1);
                        Value::Int(num(vals[0], sg) / n)
                    }
                    MapKind::Hist => Value::Buckets(hist_buckets(&vals)),
                    MapKind::Lhist { lo, hi, step } => {
                        Value::Buckets(lhist_bucket_list(&vals, lo, hi, step))
                    }
                };
                entries.push(Entry { key, value });
            }
            // bpftrace's order: by value, then by key.
            entries.sort_by(|a, b| match (&a.value, &b.value) {
                (Value::Int(x), Value::Int(y)) => x.cmp(y).then_with(|| a.key.cmp(&b.key)),
                _ => a.key.cmp(&b.key),
            });
            maps.push(MapResult {
                name: m.info.name.clone(),
                kind: m.info.kind,
                entries,
                slots: m.slots,
                dropped: word(data, m.dropped),
            });
        }
        let failed_reads = self
            .handlers
            .iter()
            .map(|h| FailedReads {
                probe: h.probe.clone(),
                count: word(data, h.failed),
            })
            .filter(|f| f.count > 0)
            .collect();
        Ok(Results { maps, failed_reads })
    }
}

/// The results as bpftrace prints them (`@name[k1, k2]: value`, histograms as bars), then the
/// dropped updates and failed reads.
pub fn render(r: &Results) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    for m in &r.maps {
        o += &render_map(m);
    }
    for m in &r.maps {
        if m.dropped > 0 {
            let _ = writeln!(
                o,
                "@{}: {} update(s) dropped: the table is full ({} slots)",
                m.name, m.dropped, m.slots
            );
        }
    }
    for f in &r.failed_reads {
        let _ = writeln!(o, "{} read(s) failed at {}: bad address", f.count, f.probe);
    }
    o
}

/// One map's entries as bpftrace prints them (an interval's `print(@m)`).
pub fn render_map(m: &MapResult) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    {
        let key = |e: &Entry| {
            if e.key.is_empty() {
                String::new()
            } else {
                let parts: Vec<String> = e
                    .key
                    .iter()
                    .map(|k| match k {
                        KeyPart::Int(v) => v.to_string(),
                        KeyPart::Str(s) => s.clone(),
                    })
                    .collect();
                format!("[{}]", parts.join(", "))
            }
        };
        let mut any_hist = false;
        for e in &m.entries {
            match &e.value {
                Value::Int(v) => {
                    let _ = writeln!(o, "@{}{}: {v}", m.name, key(e));
                }
                Value::Buckets(b) => {
                    any_hist = true;
                    let _ = writeln!(o, "@{}{}:", m.name, key(e));
                    let max = b.iter().map(|x| x.count).max().unwrap_or(0).max(1);
                    for x in b {
                        let n = usize::try_from(x.count * 52 / max).unwrap_or(52);
                        let _ =
                            writeln!(o, "{:<16}{:>8} |{:<52}|", x.label, x.count, "@".repeat(n));
                    }
                    o.push('\n');
                }
            }
        }
        if !any_hist && !m.entries.is_empty() {
            o.push('\n');
        }
    }
    o
}

impl Layout {
    /// Whether a probe called `exit()`, in a snapshot of the data block.
    pub fn exited(&self, data: &[u8]) -> bool {
        data.len() >= EXIT_OFFSET + 8 && word(data, EXIT_OFFSET) != 0
    }

    /// The ring's head (tickets taken) in a snapshot, or in the 8 bytes read at
    /// [`HEAD_OFFSET`] alone.
    pub fn head(data: &[u8]) -> u64 {
        if data.len() == 8 {
            word(data, 0)
        } else {
            word(data, HEAD_OFFSET)
        }
    }
}

/// The tracer's side of the printf ring: the next ticket to print, and the records lost.
#[derive(Clone, Debug, Default)]
pub struct Drain {
    pub next: u64,
    /// Records overwritten before they were read.
    pub lost: u64,
}

impl Drain {
    /// The lines of the records in `data` (a snapshot of the data block) from the next ticket
    /// on, in ticket order, up to the first one not written yet. `head_after` is the ring's
    /// head read after the snapshot was taken: a record whose slot a later ticket may have
    /// begun to overwrite while the snapshot was copied is counted lost, never printed torn.
    /// (A record's seq is its first word and is written last: a snapshot copied in ascending
    /// order, as the kernel's and `/proc/PID/mem`'s copies are, that sees it sees the rest.)
    pub fn take(
        &mut self,
        layout: &Layout,
        data: &[u8],
        head_after: u64,
        formats: &[(String, Vec<Ty>)],
        strings: &[String],
    ) -> Vec<String> {
        let n = layout.ring_records as u64;
        let mut out = Vec::new();
        if n == 0 || data.len() != layout.size {
            return out;
        }
        let safe = head_after.saturating_sub(n);
        if self.next < safe {
            self.lost += safe - self.next;
            self.next = safe;
        }
        let head = word(data, HEAD_OFFSET);
        while self.next < head {
            let at = layout.ring
                + usize::try_from(self.next % n).expect("a ring index") * RECORD_WORDS * 8;
            if word(data, at) != self.next + 1 {
                break;
            }
            let f = usize::try_from(word(data, at + 8)).unwrap_or(usize::MAX);
            let Some((format, tys)) = formats.get(f) else {
                self.lost += 1;
                self.next += 1;
                continue;
            };
            let mut w = at + 16;
            let mut args = Vec::new();
            for t in tys {
                args.push(match t {
                    Ty::Int { .. } => crate::Const::Int(signed(word(data, w))),
                    Ty::Str => crate::Const::Str(
                        usize::try_from(word(data, w))
                            .ok()
                            .and_then(|i| strings.get(i))
                            .cloned()
                            .unwrap_or_default(),
                    ),
                    Ty::Bytes(b) => {
                        let b = &data[w..w + b];
                        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
                        crate::Const::Str(String::from_utf8_lossy(&b[..end]).into_owned())
                    }
                });
                w += 8 * t.words();
            }
            out.push(crate::format_printf(&crate::Printf {
                format: format.clone(),
                args,
            }));
            self.next += 1;
        }
        out
    }
}
