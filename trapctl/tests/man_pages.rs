//! `trapctl man DIR` writes the man(5) pages beside the man(1) pages: the spec, trapd.toml and
//! the agent's environment, each with the sections a reader looks for (issue 28, item 3).

use std::process::Command;

#[test]
fn man_writes_the_section_5_pages_of_the_spec_trapd_toml_and_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .arg("man")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = |name: &str| {
        std::fs::read_to_string(dir.path().join(name))
            .unwrap_or_else(|e| panic!("{name} was not written: {e}"))
    };
    // man(1) still has its sections.
    let apply = page("trapctl-apply.1");
    assert!(apply.contains(".SH EXAMPLES\n"), "{apply}");
    assert!(apply.contains(".SH \"EXIT STATUS\"\n"), "{apply}");

    let spec = page("trapvec-spec.5");
    assert!(spec.starts_with(".TH TRAPVEC-SPEC 5 "), "{spec}");
    for section in [
        ".SH \"DESCRIPTION\"",
        ".SH \"[[component]]\"",
        ".SH \"[[splice]]\"",
        ".SH \"[[set]]\"",
        ".SH \"EXAMPLES\"",
    ] {
        assert!(
            spec.contains(section),
            "trapvec-spec.5 lacks {section}: {spec}"
        );
    }
    // The conventions: pid the process, tid the thread, tgid the old spelling.
    assert!(
        spec.contains(".TP\n\\fBpid\\fR\nOnly for the threads of process N"),
        "{spec}"
    );
    assert!(
        spec.contains(".TP\n\\fBtid\\fR\nOnly for thread N"),
        "{spec}"
    );
    assert!(
        spec.contains(".TP\n\\fBtgid\\fR\nThe old spelling of pid"),
        "{spec}"
    );
    // And a keyed count's key: tid the thread, pid the process.
    assert!(
        spec.contains("key the hits by tid (the thread") && spec.contains("pid (the process"),
        "{spec}"
    );

    let trapd = page("trapd.toml.5");
    for section in [
        ".SH \"TOP\\-LEVEL KEYS\"",
        ".SH \"[[metric]]\"",
        ".SH \"[[rule]]\"",
        ".SH \"[profile.NAME]\"",
        ".SH \"EXAMPLES\"",
    ] {
        assert!(
            trapd.contains(section),
            "trapd.toml.5 lacks {section}: {trapd}"
        );
    }
    assert!(trapd.contains("\\fBmin_dwell_s\\fR"), "{trapd}");

    let agent = page("trapvec-agent.5");
    for section in [
        ".SH \"ENVIRONMENT\"",
        ".SH \"EXIT STATUS\"",
        ".SH \"EXAMPLES\"",
    ] {
        assert!(
            agent.contains(section),
            "trapvec-agent.5 lacks {section}: {agent}"
        );
    }
    for var in [
        "TRAPVEC_SPEC",
        "TRAPVEC_STATS",
        "TRAPVEC_LOG",
        "TRAPVEC_SIGNAL",
        "TRAPVEC_INHERIT",
        "TRAPVEC_CONTROL",
    ] {
        assert!(
            agent.contains(&format!(".TP\n\\fB{var}\\fR\n")),
            "trapvec-agent.5 lacks {var}: {agent}"
        );
    }
    assert!(agent.contains(".TP\n\\fB86\\fR\n"), "{agent}");
    // Examples are kept as lines (no fill).
    assert!(
        spec.contains(".nf\n[[component]]\npath = \"mss_clamp.o\"\n"),
        "{spec}"
    );
}
