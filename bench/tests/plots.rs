//! The figures are produced from a small fixture and are valid PNG and SVG files.

mod common;

use std::sync::Arc;

use bench::cost::{CostRow, CostTable};
use bench::coverage::{coverage, HitCosts, DISTANCES};
use bench::plots;
use bench::sets::CodeSet;
use bench::sizes;
use instr_manager::image::CodeImage;

fn table() -> CostTable {
    let row = |key: &str, median: f64| CostRow {
        key: key.into(),
        name: key.into(),
        median,
        p10: median * 0.9,
        p90: median * 1.1,
        emulated: false,
    };
    CostTable {
        tsc_ghz: 2.5,
        rounds: 3,
        iters: 10,
        rows: vec![
            row("unpatched", 5.0),
            row("jmp_rel32", 130.0),
            row("short_unpatched", 5.0),
            row("jmp_springboard", 132.0),
            row("trap", 9000.0),
            row("floor_sigsegv", 8800.0),
        ],
        uprobe_unavailable: Some("not asked for".into()),
        vm: None,
        vm_unavailable: None,
    }
}

/// Width and height from a PNG's IHDR, after checking the signature and chunk layout.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR");
    assert_eq!(
        &bytes[bytes.len() - 8..bytes.len() - 4],
        b"IEND",
        "the file ends with IEND"
    );
    let be = |o: usize| u32::from_be_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    (be(16), be(20))
}

fn check_svg(text: &str, needle: &str) {
    assert!(text.trim_start().starts_with("<svg"), "SVG root element");
    assert!(text.trim_end().ends_with("</svg>"), "SVG closed");
    assert!(text.contains(needle), "the SVG holds `{needle}`");
}

#[test]
fn table1_fig4_and_fig5_are_valid_png_and_svg() {
    let b = common::build();
    let img = Arc::new(CodeImage::from_path(&b.path("known.o")).unwrap());
    let set = CodeSet::whole("known.o", "fixture", img);
    let rows = sizes::sizes(std::slice::from_ref(&set));
    let cov = coverage(&set, &DISTANCES, 1, &|_| {});
    let costs = HitCosts {
        trap: 9000.0,
        jmp_rel32: 125.0,
        jmp_springboard: 127.0,
    };
    let out = tempfile::tempdir().unwrap();

    let files = [
        (
            plots::draw_table1(&out.path().join("table1"), &table()).unwrap(),
            (1000, 620),
            "Table 1 today",
        ),
        (
            plots::draw_fig4(&out.path().join("fig4"), &rows).unwrap(),
            (1000, 600),
            "Fig. 4 today",
        ),
        (
            plots::draw_fig5(&out.path().join("fig5"), &[cov], &costs).unwrap(),
            (1000, 760),
            "Fig. 5 today",
        ),
    ];
    for ([png, svg], size, title) in files {
        assert_eq!(
            png_size(&std::fs::read(&png).unwrap()),
            size,
            "{}",
            png.display()
        );
        check_svg(&std::fs::read_to_string(&svg).unwrap(), title);
    }
}

#[test]
fn the_peers_goals_are_a_valid_png_and_svg() {
    let console = "PEERS_NS_BASE=600\nPEERS_NS_JMP_EMPTY=900\nPEERS_NS_TRAP_EMPTY=2000\nPEERS_NS_FENTRY_EMPTY=1000\n\
        PEERS_NS_FENTRY_COUNT=1100\nPEERS_FTRACE_1000 filter_ns=1000000 enable_ns=800000000 disable_ns=1\n\
        PEERS_TRAPVEC_1000_JMP apply_ns=3000000000 commit_ms=200 remove_ns=1\n\
        PEERS_FTRACE_10000 filter_ns=1000000 enable_ns=900000000 disable_ns=1\n\
        PEERS_TRAPVEC_10000_JMP apply_ns=4000000000 commit_ms=700 remove_ns=1\n\
        PEERS_FENTRY_HITS=22002 expected=22002\n\
        PEERS_TRAPVEC_HITS config=jmp_empty hits=22002 expected=22002\n\
        PEERS_LIVEPATCH load_ns=1 transition_ns=1500000000 disable_ns=1 unload_ns=1\n\
        PEERS_REPLACE_JMP splice_ns=1000000000 commit_ms=15 unsplice_ns=1\n";
    let peers = bench::peers::Peers {
        vm: Some(bench::peers::VmPeers::parse(console, "6.1.0").unwrap()),
        frida_unavailable: Some("not here".into()),
        ..Default::default()
    };
    let goals = peers.goals();
    assert!(
        goals.iter().filter(|g| g.margin.is_some()).count() >= 4,
        "{goals:?}"
    );
    let out = tempfile::tempdir().unwrap();
    let [png, svg] = plots::draw_peers(&out.path().join("peers"), &goals).unwrap();
    assert_eq!(png_size(&std::fs::read(&png).unwrap()), (1000, 560));
    check_svg(&std::fs::read_to_string(&svg).unwrap(), "Issue 13");
}
