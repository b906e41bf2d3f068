//! The coverage report's functions, refused blocks and total, one shape for the kernel's
//! report and a program's: tallied block by block ([`Tally`]) and printed as one text table
//! ([`render`]): the functions (most covered first), the total, the refused blocks with their
//! reasons, the refusals counted by kind, and the notes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use instr_manager::cover::{BlockRefusal, Branch, CoverBlock};
use instr_manager::Mechanism;
use serde::{Deserialize, Serialize};

/// The totals of a report (`--json`'s `total`, the same for the kernel and a program).
#[derive(Serialize, Deserialize, PartialEq, Debug)]
pub(crate) struct Total {
    pub functions: usize,
    pub blocks: usize,
    pub covered: usize,
    pub refused: usize,
    pub percent: f64,
    pub refusals: BTreeMap<String, usize>,
}

/// Where a block's function is: what the report's JSON names it by (a program's `object`, the
/// kernel's `module`), and the qualifier the table prints before its name (`FILE:function`
/// for a library's, `MOD:function` for a module's; none for the program's or vmlinux's own).
#[derive(Clone, Copy, Default)]
pub(crate) struct Home<'a> {
    pub object: Option<&'a str>,
    pub module: Option<&'a str>,
    pub qualifier: Option<&'a str>,
}

impl Home<'_> {
    /// `function`'s name as the table prints it.
    fn name(&self, function: &str) -> String {
        match self.qualifier {
            Some(q) => format!("{q}:{function}"),
            None => function.to_string(),
        }
    }
}

/// A function's row (`--json`'s `functions`): a program's carries its `object`, the kernel's
/// its `module` (none for vmlinux).
#[derive(Serialize, Deserialize, Clone, PartialEq, Debug)]
pub(crate) struct FunctionRow {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    pub function: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// Its name as the table prints it.
    #[serde(skip)]
    pub name: String,
    pub blocks: usize,
    pub covered: usize,
    pub refused: usize,
    pub percent: f64,
}

/// A block's row (`--json`'s `blocks`), one layout for the kernel's report and a program's:
/// what every block has, and in `on` what its target adds (flattened into the row after
/// `length`: a program's `object`, `mechanism`, `hits` and `disarmed`; the kernel's `module`,
/// `site` and `count`). A line-oriented reader may rely on the order: a site's `hits` follow
/// its block's `address` (vmtest's cover.sh reads a program's report so). `succs` and `branch`
/// (last) are the decoder's CFG, which `--lcov`'s branch records need: with them a saved report
/// gives the same lcov file again (`--from-json`).
#[derive(Serialize, Deserialize)]
pub(crate) struct BlockRow<X> {
    pub function: String,
    /// The block's start in its function.
    pub offset: u64,
    pub address: String,
    pub length: u64,
    #[serde(flatten)]
    pub on: X,
    pub hit: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The starts of the blocks control can flow to from it, as offsets in its function
    /// (always written; `None` in a report of a trapctl before they were).
    #[serde(default)]
    pub succs: Option<Vec<u64>>,
    /// The conditional branch that ends it, as offsets in its function, if one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<BranchRow>,
}

/// A block's conditional branch ([`Branch`]) as offsets in its function.
#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct BranchRow {
    pub insn: u64,
    pub taken: u64,
    pub fallthrough: u64,
}

impl<X> BlockRow<X> {
    /// `b`'s row: `hit` or not, `on` its target's own fields.
    pub fn of(b: &CoverBlock, hit: bool, on: X) -> Self {
        let refusal = b.site.as_ref().err();
        let off = |a: u64| a.wrapping_sub(b.func_addr);
        BlockRow {
            function: b.function.clone(),
            on,
            offset: b.start - b.func_addr,
            address: format!("{:#x}", b.start),
            length: b.end - b.start,
            hit,
            refusal: refusal.map(|r| r.kind.clone()),
            reason: refusal.map(|r| r.reason.clone()),
            succs: Some(b.succs.iter().map(|&s| off(s)).collect()),
            branch: b.branch.map(|br| BranchRow {
                insn: off(br.insn),
                taken: off(br.taken),
                fallthrough: off(br.fallthrough),
            }),
        }
    }

    /// The block this row was written from ([`BlockRow::of`]), its site by `mechanism` when
    /// it had one; `Err` names what in the row is malformed.
    pub fn block(&self, mechanism: Mechanism) -> Result<CoverBlock, String> {
        let at = format!("{}+{:#x}", self.function, self.offset);
        let start = self
            .address
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or_else(|| {
                format!(
                    "block {at}: `address` {:?} is not a hex address",
                    self.address
                )
            })?;
        let func_addr = start.checked_sub(self.offset).ok_or_else(|| {
            format!(
                "block {at}: its offset is past its address {}",
                self.address
            )
        })?;
        let end = start
            .checked_add(self.length)
            .ok_or_else(|| format!("block {at}: its length {} overflows", self.length))?;
        let site = match &self.refusal {
            Some(kind) => Err(BlockRefusal {
                kind: kind.clone(),
                reason: self.reason.clone().unwrap_or_default(),
            }),
            None => Ok(mechanism),
        };
        let abs = |o: u64| func_addr.wrapping_add(o);
        Ok(CoverBlock {
            function: self.function.clone(),
            func_addr,
            start,
            end,
            site,
            succs: self.succs.iter().flatten().map(|&o| abs(o)).collect(),
            branch: self.branch.map(|b| Branch {
                insn: abs(b.insn),
                taken: abs(b.taken),
                fallthrough: abs(b.fallthrough),
            }),
            // Only a point to arm is written with the copy's address; a saved row is not armed.
            shared_name: false,
        })
    }
}

/// A block that got no site: where it is and why.
pub(crate) struct RefusedBlock {
    /// Its function's name as printed in the table.
    pub name: String,
    pub offset: u64,
    pub address: String,
    pub reason: String,
}

/// `covered` of `blocks` in percent, to one decimal.
pub(crate) fn percent(covered: usize, blocks: usize) -> f64 {
    if blocks == 0 {
        0.0
    } else {
        (covered as f64 * 1000.0 / blocks as f64).round() / 10.0
    }
}

/// A function's counts while its blocks are tallied.
#[derive(Default)]
struct Counts {
    blocks: usize,
    covered: usize,
    refused: usize,
}

/// A function as tallied: (object, module, address, name), one row per function even where two
/// share a name.
type Function<'a> = (Option<&'a str>, Option<&'a str>, u64, &'a str);

/// The report's table, tallied from its blocks in their order.
#[derive(Default)]
pub(crate) struct Tally<'a> {
    per: BTreeMap<Function<'a>, (Home<'a>, Counts)>,
    refused: Vec<RefusedBlock>,
    refusals: BTreeMap<String, usize>,
    blocks: usize,
    covered: usize,
}

/// A report's functions (most covered first), its refused blocks (in the blocks' order) and
/// its total.
pub(crate) struct Table {
    pub functions: Vec<FunctionRow>,
    pub refused: Vec<RefusedBlock>,
    pub total: Total,
}

impl<'a> Tally<'a> {
    /// Count block `b` of a function in `home`, hit or not.
    pub fn add(&mut self, home: Home<'a>, b: &'a CoverBlock, hit: bool) {
        let (_, f) = self
            .per
            .entry((home.object, home.module, b.func_addr, &b.function))
            .or_insert_with(|| (home, Counts::default()));
        f.blocks += 1;
        f.covered += usize::from(hit);
        self.blocks += 1;
        self.covered += usize::from(hit);
        if let Err(r) = &b.site {
            f.refused += 1;
            *self.refusals.entry(r.kind.clone()).or_default() += 1;
            self.refused.push(RefusedBlock {
                name: home.name(&b.function),
                offset: b.start - b.func_addr,
                address: format!("{:#x}", b.start),
                reason: r.reason.clone(),
            });
        }
    }

    /// The table, of `functions` functions (those whose blocks were added, and any without).
    /// Two functions the table would print under one name (static functions of one name in
    /// several files, a library's compatibility copy beside its default version) are printed
    /// as points name them: `name@0xADDRESS`.
    pub fn finish(self, functions: usize) -> Table {
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        for ((_, _, _, function), (home, _)) in &self.per {
            *names.entry(home.name(function)).or_default() += 1;
        }
        let mut rows: Vec<FunctionRow> = self
            .per
            .into_iter()
            .map(|((_, _, addr, function), (home, c))| FunctionRow {
                object: home.object.map(str::to_string),
                function: function.to_string(),
                module: home.module.map(str::to_string),
                name: match home.name(function) {
                    n if names.get(&n).is_some_and(|&k| k > 1) => format!("{n}@{addr:#x}"),
                    n => n,
                },
                blocks: c.blocks,
                covered: c.covered,
                refused: c.refused,
                percent: percent(c.covered, c.blocks),
            })
            .collect();
        rows.sort_by(|a, b| {
            b.percent
                .total_cmp(&a.percent)
                .then_with(|| a.object.cmp(&b.object))
                .then_with(|| a.module.cmp(&b.module))
                .then_with(|| a.function.cmp(&b.function))
        });
        Table {
            functions: rows,
            refused: self.refused,
            total: Total {
                functions,
                blocks: self.blocks,
                covered: self.covered,
                refused: self.refusals.values().sum(),
                percent: percent(self.covered, self.blocks),
                refusals: self.refusals,
            },
        }
    }
}

/// The report as text: `functions` in their order, then `total: ...; {ended}` and the rest.
pub(crate) fn render(
    functions: &[FunctionRow],
    refused: &[RefusedBlock],
    total: &Total,
    ended: &str,
    notes: &[String],
) -> String {
    let mut o = String::new();
    let width = functions
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
    for r in functions {
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

    fn block(function: &str, func_addr: u64, start: u64, refused: bool) -> CoverBlock {
        CoverBlock {
            function: function.into(),
            func_addr,
            start,
            end: start + 4,
            site: if refused {
                Err(BlockRefusal {
                    kind: "overlaps_fentry".into(),
                    reason: "why".into(),
                })
            } else {
                Ok(Mechanism::Trap)
            },
            succs: Vec::new(),
            branch: None,
            shared_name: false,
        }
    }

    #[test]
    fn one_layout_for_every_report() {
        let blocks = [
            block("f", 0x10, 0x10, true),
            block("tcp_v4_rcv", 0x100, 0x100, false),
            block("tcp_v4_rcv", 0x100, 0x104, false),
        ];
        let module = Home {
            module: Some("m"),
            qualifier: Some("m"),
            ..Home::default()
        };
        let mut tally = Tally::default();
        tally.add(module, &blocks[0], false);
        tally.add(Home::default(), &blocks[1], true);
        tally.add(Home::default(), &blocks[2], false);
        let t = tally.finish(2);
        assert_eq!(
            render(
                &t.functions,
                &t.refused,
                &t.total,
                "ended by time",
                &["n".into()]
            ),
            "FUNCTION    BLOCKS  COVERED  PERCENT  REFUSED\n\
             tcp_v4_rcv       2        1    50.0%        0\n\
             m:f              1        0     0.0%        1\n\
             total: 2 function(s), 3 block(s), 1 covered (33.3%), 1 refused; ended by time\n  \
             refused: m:f+0x0 (0x10): why\n  \
             refused at 1 block(s): overlaps_fentry\n\
             note: n\n"
        );
    }

    #[test]
    fn functions_sort_by_percent_then_home_then_name_and_keep_their_json_fields() {
        let blocks = [
            block("b", 0x10, 0x10, false),
            block("a", 0x20, 0x20, false),
            block("a", 0x30, 0x30, false),
        ];
        let lib = Home {
            object: Some("/lib/libz.so.1"),
            qualifier: Some("libz.so.1"),
            ..Home::default()
        };
        let program = Home {
            object: Some("/bin/p"),
            ..Home::default()
        };
        let mut tally = Tally::default();
        tally.add(lib, &blocks[0], true);
        tally.add(program, &blocks[1], false);
        tally.add(program, &blocks[2], false);
        let t = tally.finish(3);
        let names: Vec<&str> = t.functions.iter().map(|f| f.name.as_str()).collect();
        // Two functions named `a` (two addresses) are two rows, each printed as a point names
        // its copy; the JSON keeps the name.
        assert_eq!(names, ["libz.so.1:b", "a@0x20", "a@0x30"]);
        assert_eq!(t.functions[1].function, "a");
        assert_eq!(t.total.percent, 33.3);
        assert_eq!(
            serde_json::to_string(&t.functions[0]).unwrap(),
            r#"{"object":"/lib/libz.so.1","function":"b","blocks":1,"covered":1,"refused":0,"percent":100.0}"#
        );
        let kernel = Home {
            module: Some("m"),
            qualifier: Some("m"),
            ..Home::default()
        };
        let mut tally = Tally::default();
        tally.add(kernel, &blocks[0], false);
        assert_eq!(
            serde_json::to_string(&tally.finish(1).functions[0]).unwrap(),
            r#"{"function":"b","module":"m","blocks":1,"covered":0,"refused":0,"percent":0.0}"#
        );
    }

    /// The one block row ([`BlockRow`]) writes each target's fields as docs/kernel.md and
    /// docs/process.md list them: a refused kernel block's `count` is `null`, a program's
    /// block without a site has no `hits`.
    #[test]
    fn a_block_row_writes_each_targets_fields_as_documented() {
        use super::super::kernel::InKernel;
        use super::super::InProgram;
        use serde_json::{json, Value};

        fn row<X: Serialize>(r: BlockRow<X>) -> Value {
            serde_json::to_value(r).unwrap()
        }

        let (live, refused) = (
            block("f", 0x1000, 0x1004, false),
            block("f", 0x1000, 0x1004, true),
        );
        let on = InKernel {
            module: Some("sch_netem".into()),
            site: Some("0x1009".into()),
            count: Some(3),
        };
        assert_eq!(
            row(BlockRow::of(&live, true, on)),
            json!({"function": "f", "module": "sch_netem", "offset": 4, "address": "0x1004",
                   "site": "0x1009", "length": 4, "hit": true, "count": 3, "succs": []})
        );
        let on = InKernel {
            module: None,
            site: None,
            count: None,
        };
        assert_eq!(
            row(BlockRow::of(&refused, false, on)),
            json!({"function": "f", "offset": 4, "address": "0x1004", "length": 4, "hit": false,
                   "count": null, "refusal": "overlaps_fentry", "reason": "why", "succs": []})
        );
        let on = InProgram {
            object: "/bin/x".into(),
            mechanism: None,
            hits: None,
            disarmed: None,
        };
        assert_eq!(
            row(BlockRow::of(&refused, false, on)),
            json!({"object": "/bin/x", "function": "f", "offset": 4, "address": "0x1004",
                   "length": 4, "hit": false, "refusal": "overlaps_fentry", "reason": "why",
                   "succs": []})
        );
        let on = InProgram {
            object: "/bin/x".into(),
            mechanism: Some("jmp".into()),
            hits: Some(0),
            disarmed: Some(false),
        };
        let mut branching = live.clone();
        branching.succs = vec![0x1010, 0x1008];
        branching.branch = Some(Branch {
            insn: 0x1006,
            taken: 0x1010,
            fallthrough: 0x1008,
        });
        let text = serde_json::to_string_pretty(&BlockRow::of(&branching, false, on)).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            json!({"object": "/bin/x", "function": "f", "offset": 4, "address": "0x1004",
                   "length": 4, "mechanism": "jmp", "hits": 0, "hit": false, "disarmed": false,
                   "succs": [16, 8], "branch": {"insn": 6, "taken": 16, "fallthrough": 8}})
        );
        // Read back, the row is the block it was written from.
        let back: BlockRow<InProgram> = serde_json::from_str(&text).unwrap();
        let b = back.block(Mechanism::Jmp).unwrap();
        assert_eq!(
            (b.func_addr, b.start, b.end, &b.succs, b.branch, &b.site),
            (
                0x1000,
                0x1004,
                0x1008,
                &branching.succs,
                branching.branch,
                &Ok(Mechanism::Jmp)
            )
        );
        let back: BlockRow<InProgram> = serde_json::from_value(json!({"object": "/bin/x",
            "function": "f", "offset": 4, "address": "1004", "length": 4, "hit": false}))
        .unwrap();
        assert!(back.succs.is_none());
        assert_eq!(
            back.block(Mechanism::Jmp).unwrap_err(),
            "block f+0x4: `address` \"1004\" is not a hex address"
        );
        // In this order, one key a line: the address, then the hits.
        let at = |key: &str| text.find(&format!("\"{key}\": ")).unwrap();
        assert!(at("address") < at("hits"), "{text}");
    }
}
