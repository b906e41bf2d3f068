//! The operations on a running system that both front ends offer: `trapctl` going straight to
//! `/dev/trapvec`, and `trapd` serving them on its socket. Each operation is written once here,
//! over any [`Target`], and returns a serializable report: trapctl prints it, trapd sends it as
//! its reply (and a trapctl that went through trapd reads it back and prints it the same way).
//!
//! An operation that changes the target is all or nothing by itself (a refused batch changes
//! nothing; `load` unloads the component again if a splice it declares is refused). It also
//! returns what it [`Made`], so that a caller who then cannot record the change (trapctl's
//! state blob in the module) can [`undo`] it exactly.

// Errors are made at most once per operation, and they carry the splicer's errors whole.
#![allow(clippy::result_large_err)]

use std::path::Path;

use component_manager::{ComponentId, LoadOptions, LoadedComponent};
use instr_manager::apply::{apply_spec, apply_spec_best_effort, Applied, ApplyError};
use instr_manager::splicer::{Hits, LiveSplice, SpliceError, SpliceId, SpliceRequest, Splicer};
use instr_manager::{Spec, SpecError};
use serde::{Deserialize, Serialize};
use trapvec::Target;

/// Why an operation was refused; each names its culprit.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error(transparent)]
    Splice(#[from] SpliceError),
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("loading {path}: {source}")]
    Load { path: String, #[source] source: SpliceError },
    #[error("{path}: a splice it declares was refused; nothing was loaded: {source}")]
    Declared { path: String, #[source] source: SpliceError },
    #[error("no component named `{name}` is loaded ({})", loaded_list(.loaded))]
    NoComponent { name: String, loaded: Vec<String> },
    #[error("component `{name}` is used by the splice(s) at {}: unsplice them first", .users.join(", "))]
    InUse { name: String, users: Vec<String> },
    #[error("no splice at `{at}` ({})", live_list(.live))]
    NoSplice { at: String, live: Vec<String> },
    #[error("{0}")]
    Value(String),
}

fn loaded_list(loaded: &[String]) -> String {
    if loaded.is_empty() {
        "none is".to_string()
    } else {
        format!("loaded: {}", loaded.join(", "))
    }
}

fn live_list(live: &[String]) -> String {
    if live.is_empty() {
        "nothing is spliced".to_string()
    } else {
        format!("live: {}", live.join(", "))
    }
}

pub use instr_manager::ops::{undo, Made};

/// A live splice as listed and reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpliceRow {
    pub id: u64,
    /// The point as written when spliced.
    pub at: String,
    /// The site's address, `0x...`.
    pub site: String,
    pub function: String,
    /// The site's offset in `function`.
    pub offset: u64,
    pub mechanism: String,
    pub action: String,
    /// The handler or replacement, if any.
    pub symbol: Option<String>,
    /// The displaced instructions, Intel syntax, `; `-separated.
    pub displaced: String,
    pub hits: u64,
    /// Traps taken while a handler was already running on that CPU (handler skipped).
    pub missed: u64,
    /// trapd only: whether the active profile has this splice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_profile: Option<bool>,
}

impl SpliceRow {
    pub fn of(s: &LiveSplice, hits: Hits) -> SpliceRow {
        SpliceRow {
            id: s.id.0,
            at: s.request.at.clone(),
            site: format!("{:#x}", s.point.site),
            function: s.point.function.name.clone(),
            offset: s.point.site - s.point.function.addr,
            mechanism: s.plan.mechanism.to_string(),
            action: s.request.action.to_string(),
            symbol: s.request.action.symbol().map(str::to_string),
            displaced: s.plan.displaced_text.to_string(),
            hits: hits.hits,
            missed: hits.missed,
            in_profile: None,
        }
    }
}

/// A loaded component as listed and reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentRow {
    pub id: u64,
    pub name: String,
    pub path: Option<String>,
    /// CRC32 of the object file, `0x%08x`.
    pub crc32: String,
    pub code: String,
    pub code_len: usize,
    pub data: String,
    pub data_len: usize,
    /// Symbols it takes from the kernel or other components.
    pub imports: usize,
    /// Splices and components that use it.
    pub refs: usize,
}

impl ComponentRow {
    pub fn of(c: &LoadedComponent) -> ComponentRow {
        ComponentRow {
            id: u64::from(c.id.0),
            name: c.name.clone(),
            path: c.path.as_ref().map(|p| p.display().to_string()),
            crc32: format!("{:#010x}", c.file_crc32),
            code: format!("{:#x}", c.code_addr),
            code_len: c.code_len,
            data: format!("{:#x}", c.data_addr),
            data_len: c.data.size,
            imports: c.imports.len(),
            refs: c.refs(),
        }
    }
}

/// Everything live: splices with their counters, components.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub splices: Vec<SpliceRow>,
    pub components: Vec<ComponentRow>,
    /// Splices whose removal waits for a task to leave their code: original bytes back, code
    /// not freed yet (`trapctl unsplice AT` again finishes them). Hits as last read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retiring: Vec<SpliceRow>,
}

/// A dispatch entry the module lists that no recorded state describes (trapd's `list`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unrecorded {
    pub site: String,
    pub dest: String,
    pub hits: u64,
}

/// The rows of live splices `ids`, with their counters now (read together).
fn rows_of<T: Target>(sp: &Splicer<T>, ids: &[SpliceId]) -> Result<Vec<SpliceRow>, OpError> {
    let hits = sp.hits_many(ids)?;
    Ok(ids.iter().zip(hits).filter_map(|(&id, h)| sp.get(id).map(|s| SpliceRow::of(s, h))).collect())
}

pub fn listing<T: Target>(sp: &Splicer<T>) -> Result<Listing, OpError> {
    let ids: Vec<SpliceId> = sp.live().map(|s| s.id).collect();
    let splices = rows_of(sp, &ids)?;
    let components = sp.components().iter().map(ComponentRow::of).collect();
    let retiring = sp.retiring().map(|s| SpliceRow::of(s, Hits::default())).collect();
    Ok(Listing { splices, components, retiring })
}

/// Where components are placed: near the kernel's text (`_stext`), within rel32 reach of all
/// of it; 0 (anywhere) for a target without those symbols.
pub fn near<T: Target>(sp: &Splicer<T>) -> u64 {
    let symbols = sp.target().symbols();
    symbols.lookup("_stext").or_else(|| symbols.lookup("_text")).map_or(0, |s| s.addr)
}

/// What `load` made: the component, and the splices it declares (applied with it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loaded {
    pub component: ComponentRow,
    pub spliced: Vec<SpliceRow>,
}

/// The requests component `id` declares in `.trapvec.splices`.
fn declared_requests<T: Target>(sp: &Splicer<T>, id: ComponentId) -> Result<Vec<SpliceRequest>, OpError> {
    let label = sp.components().get(id).map(|c| c.label.clone()).unwrap_or_default();
    instr_manager::ops::declared_requests(sp, id).map_err(|e| OpError::Value(format!("component {label}: declared splice: {e}")))
}

/// Load a component and apply the splices it declares, in one batch; if that batch is refused
/// the component is unloaded again.
pub fn load<T: Target>(sp: &mut Splicer<T>, path: &Path, name: Option<String>) -> Result<(Loaded, Made), OpError> {
    let shown = path.display().to_string();
    let opts = LoadOptions { near: near(sp), expected_crc32: None, name };
    let id = sp.load_component(path, &opts).map_err(|source| OpError::Load { path: shown.clone(), source })?;
    let requests = declared_requests(sp, id);
    let applied = requests.and_then(|r| if r.is_empty() { Ok(Vec::new()) } else { sp.apply(&r).map_err(OpError::from) });
    let ids = match applied {
        Ok(ids) => ids,
        Err(e) => {
            if let Err(u) = sp.unload_component(id) {
                log::error!("unloading {shown} after its splices were refused: {u}");
            }
            return Err(match e {
                OpError::Splice(source) => OpError::Declared { path: shown, source },
                other => other,
            });
        }
    };
    let component = ComponentRow::of(sp.components().get(id).expect("just loaded"));
    let spliced = rows_of(sp, &ids)?;
    Ok((Loaded { component, spliced }, Made { splices: ids, components: vec![id] }))
}

/// What `unload` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unloaded {
    pub name: String,
    /// How many of its own declared splices were removed with it.
    pub declared_removed: usize,
}

/// Unload component `name`, removing the splices it declared first; refused while another
/// splice uses it.
pub fn unload<T: Target>(sp: &mut Splicer<T>, name: &str) -> Result<Unloaded, OpError> {
    let Some(id) = sp.components().by_name(name) else {
        return Err(OpError::NoComponent { name: name.to_string(), loaded: sp.components().iter().map(|c| c.name.clone()).collect() });
    };
    // Its retiring splices first: they hold references on it until they are gone.
    let retiring: Vec<SpliceId> = sp.retiring().filter(|s| s.component == Some(id)).map(|s| s.id).collect();
    finish_retiring(sp, &retiring)?;
    let declared = declared_requests(sp, id)?;
    let is_declared = |s: &LiveSplice| declared.iter().any(|d| d.at == s.request.at && d.action == s.request.action);
    let own: Vec<SpliceId> = sp.live().filter(|s| s.component == Some(id) && is_declared(s)).map(|s| s.id).collect();
    let users: Vec<String> = sp.live().filter(|s| s.component == Some(id) && !own.contains(&s.id)).map(|s| s.request.at.clone()).collect();
    if !users.is_empty() {
        return Err(OpError::InUse { name: name.to_string(), users });
    }
    if !own.is_empty() {
        sp.remove(&own)?;
    }
    sp.unload_component(id)?;
    Ok(Unloaded { name: name.to_string(), declared_removed: own.len() })
}

/// Make one splice.
pub fn splice<T: Target>(sp: &mut Splicer<T>, request: &SpliceRequest) -> Result<(SpliceRow, Made), OpError> {
    let ids = sp.apply(std::slice::from_ref(request))?;
    let row = rows_of(sp, &ids)?.remove(0);
    Ok((row, Made { splices: ids, components: Vec::new() }))
}

/// A removed splice and its final counters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unspliced {
    pub at: String,
    pub site: String,
    pub hits: u64,
    pub missed: u64,
}

/// Remove the splice at `at` (the point as spliced, its function, or the site's address).
/// A retiring splice at `at` (its removal failed to reach quiescence) is finished instead.
pub fn unsplice<T: Target>(sp: &mut Splicer<T>, at: &str) -> Result<Unspliced, OpError> {
    if let Some(id) = sp.find_retiring(at) {
        return Ok(finish_retiring(sp, &[id])?.remove(0));
    }
    let Some(id) = sp.find(at) else {
        let live = sp.live().map(|s| format!("{} ({:#x})", s.request.at, s.point.site)).collect();
        return Err(OpError::NoSplice { at: at.to_string(), live });
    };
    Ok(unsplice_ids(sp, &[id])?.remove(0))
}

/// What `unsplice --all` removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnsplicedAll {
    pub unspliced: Vec<Unspliced>,
}

/// Remove every live splice in one batch, after finishing the retiring ones.
pub fn unsplice_all<T: Target>(sp: &mut Splicer<T>) -> Result<UnsplicedAll, OpError> {
    let retiring: Vec<SpliceId> = sp.retiring().map(|s| s.id).collect();
    let mut unspliced = finish_retiring(sp, &retiring)?;
    let ids: Vec<SpliceId> = sp.live().map(|s| s.id).collect();
    unspliced.extend(unsplice_ids(sp, &ids)?);
    Ok(UnsplicedAll { unspliced })
}

/// Finish the removal of retiring splices `ids`.
fn finish_retiring<T: Target>(sp: &mut Splicer<T>, ids: &[SpliceId]) -> Result<Vec<Unspliced>, OpError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let named: Vec<(String, String)> = ids
        .iter()
        .filter_map(|&id| sp.retiring().find(|s| s.id == id))
        .map(|s| (s.request.at.clone(), format!("{:#x}", s.point.site)))
        .collect();
    let hits = sp.finish_retiring(ids)?;
    Ok(named.into_iter().zip(hits).map(|((at, site), h)| Unspliced { at, site, hits: h.hits, missed: h.missed }).collect())
}

fn unsplice_ids<T: Target>(sp: &mut Splicer<T>, ids: &[SpliceId]) -> Result<Vec<Unspliced>, OpError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let named: Vec<(String, String)> =
        ids.iter().filter_map(|&id| sp.get(id)).map(|s| (s.request.at.clone(), format!("{:#x}", s.point.site))).collect();
    let hits = sp.remove(ids)?;
    Ok(named.into_iter().zip(hits).map(|((at, site), h)| Unspliced { at, site, hits: h.hits, missed: h.missed }).collect())
}

/// Where the time of a batch went, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    pub splices: usize,
    pub plan_ms: f64,
    pub build_ms: f64,
    pub commit_ms: f64,
}

/// What `apply` made; `refused` (best effort only) has each refused splice with its reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApplyReport {
    pub components: Vec<ComponentRow>,
    pub spliced: Vec<SpliceRow>,
    pub refused: Vec<String>,
    /// How many splices the spec has.
    pub requested: usize,
    pub timings: Option<Timings>,
}

/// Apply a spec: all or nothing, or with `best_effort` every splice that validates (components
/// and variables are all or nothing either way).
pub fn apply<T: Target>(sp: &mut Splicer<T>, spec: &Spec, best_effort: bool) -> Result<(ApplyReport, Made), OpError> {
    let near = near(sp);
    let (applied, refused): (Applied, Vec<String>) = if best_effort {
        let r = apply_spec_best_effort(sp, spec, near)?;
        (r.applied, r.refused.iter().map(|(_, e)| e.to_string()).collect())
    } else {
        (apply_spec(sp, spec, near)?, Vec::new())
    };
    let made = applied.made();
    let components = applied.components.iter().filter_map(|&c| sp.components().get(c)).map(ComponentRow::of).collect();
    let spliced = rows_of(sp, &made.splices)?;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    let timings = sp.last_batch().map(|t| Timings { splices: t.splices, plan_ms: ms(t.plan), build_ms: ms(t.build), commit_ms: ms(t.commit) });
    Ok((ApplyReport { components, spliced, refused, requested: spec.splices.len(), timings }, made))
}

/// A splice `check` found possible.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckRow {
    pub at: String,
    pub site: String,
    pub mechanism: String,
    pub displaced: String,
}

/// What `apply --check` found: the splices that would be made and those that would be refused.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    pub ok: Vec<CheckRow>,
    pub refused: Vec<String>,
}

/// Plan and check every splice of a spec, changing nothing.
pub fn check<T: Target>(sp: &Splicer<T>, spec: &Spec) -> CheckReport {
    let mut report = CheckReport::default();
    for (r, res) in spec.splices.iter().zip(sp.plan_each(&spec.splices)) {
        match res {
            Ok((p, plan)) => report.ok.push(CheckRow {
                at: r.at.clone(),
                site: format!("{:#x}", p.site),
                mechanism: plan.mechanism.to_string(),
                displaced: plan.displaced_text(),
            }),
            Err(e) => report.refused.push(e.to_string()),
        }
    }
    report
}

/// A value for `set`: a number, or text to parse for the variable's size (decimal, `-decimal`
/// in two's complement, or `0x` hex).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    Number(u64),
    Text(String),
}

/// A variable's value as read or written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Var {
    pub symbol: String,
    pub value: u64,
    pub size: usize,
}

/// The size to access `symbol` with: `asked`, else the symbol's own size (when 1, 2, 4 or 8),
/// else 8. More than the symbol's size is refused (it would write past it).
pub fn var_size<T: Target>(sp: &Splicer<T>, symbol: &str, asked: Option<usize>) -> Result<usize, OpError> {
    if let Some(a) = asked.filter(|a| ![1, 2, 4, 8].contains(a)) {
        return Err(OpError::Value(format!("size {a} is not 1, 2, 4 or 8")));
    }
    let components = sp.components();
    let known = components
        .lookup(symbol)
        .and_then(|(id, _)| components.get(id))
        .and_then(|c| c.symbol(symbol))
        .map(|s| s.size)
        .filter(|s| matches!(s, 1 | 2 | 4 | 8))
        .and_then(|s| usize::try_from(s).ok());
    match (asked, known) {
        (Some(a), Some(k)) if a > k => Err(OpError::Value(format!("`{symbol}` is {k} bytes long; size {a} would write past it"))),
        (Some(a), _) => Ok(a),
        (None, k) => Ok(k.unwrap_or(8)),
    }
}

/// `text` as the bits of a `size`-byte value, if it fits as a signed or an unsigned number.
pub fn parse_value(text: &str, size: usize) -> Result<u64, OpError> {
    let bad = |why: &str| OpError::Value(format!("`{text}` {why}"));
    let t = text.trim();
    let bits = u32::try_from(size * 8).map_err(|_| bad("has no size"))?;
    let mask = mask(size);
    let (negative, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t),
    };
    let magnitude = parse_u64(digits).map_err(|_| bad("is not a number (decimal, -decimal, or hex with 0x)"))?;
    let fits = if negative { magnitude <= 1u64 << (bits - 1) } else { magnitude <= mask };
    if !fits {
        return Err(bad(&format!("does not fit in {size} byte(s)")));
    }
    Ok(if negative { magnitude.wrapping_neg() & mask } else { magnitude })
}

/// The largest unsigned value of `size` bytes.
fn mask(size: usize) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (size * 8)) - 1
    }
}

/// A number written in decimal or with `0x` (hex).
pub fn parse_u64(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| format!("`{text}` is not a number (decimal, or hex with 0x)"))
}

/// Write a component variable.
pub fn set<T: Target>(sp: &mut Splicer<T>, symbol: &str, value: &Value, size: Option<usize>) -> Result<Var, OpError> {
    let size = var_size(sp, symbol, size)?;
    let value = match value {
        Value::Number(n) if *n > mask(size) => {
            return Err(OpError::Value(format!("{n} does not fit in {size} byte(s)")));
        }
        Value::Number(n) => *n,
        Value::Text(t) => parse_value(t, size)?,
    };
    sp.set_var(symbol, value, size)?;
    Ok(Var { symbol: symbol.to_string(), value, size })
}

/// Read a component variable.
pub fn get<T: Target>(sp: &Splicer<T>, symbol: &str, size: Option<usize>) -> Result<Var, OpError> {
    let size = var_size(sp, symbol, size)?;
    Ok(Var { symbol: symbol.to_string(), value: sp.get_var(symbol, size)?, size })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_fit_their_size_signed_or_unsigned() {
        assert_eq!(parse_value("1400", 4).unwrap(), 1400);
        assert_eq!(parse_value("0x578", 4).unwrap(), 1400);
        assert_eq!(parse_value("-1", 1).unwrap(), 0xff);
        assert_eq!(parse_value("-128", 1).unwrap(), 0x80);
        assert_eq!(parse_value("255", 1).unwrap(), 255);
        assert_eq!(parse_value("-1", 8).unwrap(), u64::MAX);
        assert_eq!(parse_value("18446744073709551615", 8).unwrap(), u64::MAX);
        for (bad, size) in [("256", 1), ("-129", 1), ("0x1_0000_0000", 4), ("4294967296", 4), ("twelve", 8), ("", 8)] {
            let e = parse_value(bad, size).unwrap_err().to_string();
            assert!(e.contains(&format!("`{bad}`")), "{bad} in {size} bytes: {e}");
        }
    }

    #[test]
    fn values_cross_the_socket_as_numbers_or_text() {
        assert_eq!(serde_json::from_str::<Value>("1400").unwrap(), Value::Number(1400));
        assert_eq!(serde_json::from_str::<Value>("\"-1\"").unwrap(), Value::Text("-1".into()));
        assert!(serde_json::from_str::<Value>("-1").is_err());
    }

    #[test]
    fn refusals_name_what_is_there() {
        let e = OpError::NoSplice { at: "f".into(), live: vec!["g (0x10)".into()] };
        assert_eq!(e.to_string(), "no splice at `f` (live: g (0x10))");
        let e = OpError::NoComponent { name: "c".into(), loaded: vec![] };
        assert_eq!(e.to_string(), "no component named `c` is loaded (none is)");
        let e = OpError::InUse { name: "c".into(), users: vec!["f".into(), "g".into()] };
        assert_eq!(e.to_string(), "component `c` is used by the splice(s) at f, g: unsplice them first");
    }
}
