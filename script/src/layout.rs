//! The data block (one `.bss` symbol): counters, then the maps' open-addressed tables; and
//! reading it back after the run.
//!
//! ```text
//! [dropped: u64 per map][failed reads: u64 per handler][map 0 slots]...[map N slots]
//! slot = [state: u64 (0 empty, 1 being filled, 2 ready)][key: u64 per key][value words]
//! ```

use crate::check::{MapInfo, MapKind, Ty};

/// A slot nobody claimed.
pub const EMPTY: u64 = 0;
/// A slot whose keys and initial value are written.
pub const READY: u64 = 2;

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
}

impl Layout {
    pub fn new(maps: &[MapInfo], handlers: Vec<String>, slots: usize) -> Layout {
        let mut off = 0;
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
            size: off.max(8),
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
        if data.len() != self.size {
            return Err(DumpError {
                got: data.len(),
                want: self.size,
            });
        }
        let mut maps = Vec::new();
        for m in &self.maps {
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
                let vals: Vec<u64> = (0..m.info.kind.value_words())
                    .map(|i| word(data, base + 8 * (1 + nk + i)))
                    .collect();
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
