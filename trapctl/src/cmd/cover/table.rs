//! The coverage report as text, one printer for the kernel's rows and a program's: a table of
//! functions (most covered first, as the caller sorted them), the total, the refused blocks
//! with their reasons, the refusals counted by kind, and the notes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// The totals of a report (`--json`'s `total`, the same for the kernel and a program).
#[derive(Serialize)]
pub(crate) struct Total {
    pub functions: usize,
    pub blocks: usize,
    pub covered: usize,
    pub refused: usize,
    pub percent: f64,
    pub refusals: BTreeMap<String, usize>,
}

/// A function's row: its name as printed (`MOD:function`, `FILE:function` or `function`).
pub(crate) struct Row {
    pub name: String,
    pub blocks: usize,
    pub covered: usize,
    pub percent: f64,
    pub refused: usize,
}

/// A block that got no site: where it is and why.
pub(crate) struct RefusedBlock<'a> {
    /// Its function's name as printed in the table.
    pub name: String,
    pub offset: u64,
    pub address: &'a str,
    pub reason: &'a str,
}

/// The report as text: `rows` in their order, then `total: ...; {ended}` and the rest.
pub(crate) fn render(
    rows: &[Row],
    total: &Total,
    ended: &str,
    refused: &[RefusedBlock<'_>],
    notes: &[String],
) -> String {
    let mut o = String::new();
    let width = rows
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(8)
        .clamp(8, 48);
    let _ = writeln!(
        o,
        "{:<width$}  {:>6}  {:>7}  {:>7}  {:>7}",
        "FUNCTION", "BLOCKS", "COVERED", "PERCENT", "REFUSED"
    );
    for r in rows {
        let _ = writeln!(
            o,
            "{:<width$}  {:>6}  {:>7}  {:>6.1}%  {:>7}",
            r.name, r.blocks, r.covered, r.percent, r.refused
        );
    }
    let t = total;
    let _ = writeln!(
        o,
        "total: {} function(s), {} block(s), {} covered ({:.1}%), {} refused; {ended}",
        t.functions, t.blocks, t.covered, t.percent, t.refused
    );
    for b in refused {
        let _ = writeln!(
            o,
            "  refused: {}+{:#x} ({}): {}",
            b.name, b.offset, b.address, b.reason
        );
    }
    for (kind, n) in &t.refusals {
        let _ = writeln!(o, "  refused at {n} block(s): {kind}");
    }
    for n in notes {
        let _ = writeln!(o, "note: {n}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_layout_for_every_report() {
        let total = Total {
            functions: 2,
            blocks: 3,
            covered: 1,
            refused: 1,
            percent: 33.3,
            refusals: BTreeMap::from([("overlaps_fentry".to_string(), 1)]),
        };
        let rows = [
            Row {
                name: "tcp_v4_rcv".into(),
                blocks: 2,
                covered: 1,
                percent: 50.0,
                refused: 0,
            },
            Row {
                name: "m:f".into(),
                blocks: 1,
                covered: 0,
                percent: 0.0,
                refused: 1,
            },
        ];
        let refused = [RefusedBlock {
            name: "m:f".into(),
            offset: 0,
            address: "0x10",
            reason: "why",
        }];
        assert_eq!(
            render(&rows, &total, "ended by time", &refused, &["n".into()]),
            "FUNCTION    BLOCKS  COVERED  PERCENT  REFUSED\n\
             tcp_v4_rcv       2        1    50.0%        0\n\
             m:f              1        0     0.0%        1\n\
             total: 2 function(s), 3 block(s), 1 covered (33.3%), 1 refused; ended by time\n  \
             refused: m:f+0x0 (0x10): why\n  \
             refused at 1 block(s): overlaps_fentry\n\
             note: n\n"
        );
    }
}
