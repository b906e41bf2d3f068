//! `trapctl cover --from-json FILE`: a report saved with `--json` again, covering nothing (no
//! kernel, no process touched): its blocks are read back into the blocks the live run had
//! ([`BlockRow::block`]), tallied into the same table (which must be the saved one), and
//! printed as the live run prints them, text or `--json`; `--lcov` is made now, by the live
//! run's lcov writer, from a debug file that must be the covered code's (`strict`: one that is
//! not is an error naming what disagrees). So a kernel covered in a guest too small for
//! vmlinux's debug file gets its lines on a host that has it.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::table::{BlockRow, FunctionRow, RefusedBlock, Table, Tally, Total};
use super::SCHEMA;

/// The text of a note a live run's lcov file left in its report: dropped when the lcov file is
/// made again (this run's notes say what this run's file holds).
const LCOV_NOTE: &str = ": symbol+offset records in the lcov file: ";

pub fn run(args: &super::Args, path: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not JSON (give a report saved by `trapctl cover --json`)",
            path.display()
        )
    })?;
    let kind = kind_of(&value).map_err(|why| anyhow::anyhow!("{}: {why}", path.display()))?;
    let what = || {
        format!(
            "{} is not a trapctl cover report as this trapctl writes it",
            path.display()
        )
    };
    match kind {
        Kind::Kernel => super::kernel::from_saved(
            args,
            path,
            serde_json::from_value(value).with_context(what)?,
        ),
        Kind::Program => super::from_saved(
            args,
            path,
            serde_json::from_value(value).with_context(what)?,
        ),
    }
}

enum Kind {
    Kernel,
    Program,
}

/// Which report `v` is, by its keys, or why it is none this trapctl reads.
fn kind_of(v: &Value) -> Result<Kind, String> {
    let Some(o) = v.as_object() else {
        return Err("not a JSON object, as `trapctl cover --json` writes".into());
    };
    if !(o.contains_key("blocks") && o.contains_key("total")) {
        return Err("not a `trapctl cover --json` report (it has no `blocks` and `total`)".into());
    }
    match o.get("schema").and_then(Value::as_u64) {
        Some(s) if s == u64::from(SCHEMA) => {}
        Some(s) => {
            return Err(format!(
                "a report of schema {s}; this trapctl reads cover reports of schema {SCHEMA}"
            ))
        }
        None => return Err("no `schema` number: not a `trapctl cover --json` report".into()),
    }
    if o.get("target").and_then(Value::as_str) == Some("kernel") {
        Ok(Kind::Kernel)
    } else if o.contains_key("program") {
        Ok(Kind::Program)
    } else {
        Err(
            "neither a kernel's report (`\"target\": \"kernel\"`) nor a program's (`program`)"
                .into(),
        )
    }
}

/// A saved report's table made again from its blocks ([`Tally`]): checked against the saved
/// rows and total ([`check_table`], which puts the tallied rows in `functions`), the notes of the
/// live run's lcov file dropped, and, when an lcov file is asked for (`lcov`) of blocks saved
/// without their CFG, the note saying so. Returns the refused blocks for the text.
pub(super) fn table_again<X>(
    path: &Path,
    tally: Tally<'_>,
    functions: &mut Vec<FunctionRow>,
    total: &Total,
    notes: &mut Vec<String>,
    blocks: &[BlockRow<X>],
    lcov: bool,
) -> Result<Vec<RefusedBlock>> {
    let table = tally.finish(total.functions);
    check_table(path, &table, functions, total)?;
    notes_kept(notes);
    if lcov && without_cfg(blocks) {
        notes.push(no_cfg_note(path));
    }
    Ok(table.refused)
}

/// Check that the table tallied from the saved blocks is the one the report saved (its total,
/// then each function's row), naming the first difference; then the saved report's rows are
/// replaced by the tallied ones (which carry the names the text prints).
fn check_table(
    path: &Path,
    table: &Table,
    functions: &mut Vec<FunctionRow>,
    total: &Total,
) -> Result<()> {
    let file = path.display();
    if table.total != *total {
        bail!(
            "{file}: its blocks add up to {} block(s), {} covered, {} refused, but its total says {}, {}, {}: not as trapctl wrote it",
            table.total.blocks,
            table.total.covered,
            table.total.refused,
            total.blocks,
            total.covered,
            total.refused
        );
    }
    let row = |r: &FunctionRow| serde_json::to_string(r).unwrap_or_default();
    if table.functions.len() != functions.len() {
        bail!(
            "{file}: its blocks are of {} function(s), its `functions` has {} rows: not as trapctl wrote it",
            table.functions.len(),
            functions.len()
        );
    }
    for (ours, saved) in table.functions.iter().zip(functions.iter()) {
        if row(ours) != row(saved) {
            bail!(
                "{file}: function `{}`'s row says {} block(s), {} covered, but its blocks make `{}` {} and {}: not as trapctl wrote it",
                saved.function,
                saved.blocks,
                saved.covered,
                ours.function,
                ours.blocks,
                ours.covered
            );
        }
    }
    functions.clone_from(&table.functions);
    Ok(())
}

/// Check that a block row's `hit` is what its hits say (`None`: no site, not hit).
pub(super) fn check_hit<X>(path: &Path, row: &BlockRow<X>, hits: Option<u64>) -> Result<()> {
    if row.hit != hits.is_some_and(|n| n > 0) {
        bail!(
            "{}: block {}+{:#x} says hit {} with {} hit(s): not as trapctl wrote it",
            path.display(),
            row.function,
            row.offset,
            row.hit,
            hits.map_or("no".to_string(), |n| n.to_string())
        );
    }
    Ok(())
}

/// The saved notes but those of a live run's lcov file.
fn notes_kept(notes: &mut Vec<String>) {
    notes.retain(|n| !n.contains(LCOV_NOTE));
}

/// Whether some block row has no `succs` (written before a report carried the CFG): a note then
/// says the lcov file has no branch records.
fn without_cfg<X>(rows: &[BlockRow<X>]) -> bool {
    rows.iter().any(|r| r.succs.is_none())
}

/// The note when [`without_cfg`].
fn no_cfg_note(path: &Path) -> String {
    format!(
        "{}: its blocks have no `succs` (written by an older trapctl): the lcov file has no BRDA records",
        path.display()
    )
}
