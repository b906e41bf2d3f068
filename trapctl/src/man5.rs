//! The man(5) pages `trapctl man DIR` writes beside the man(1) pages: the spec
//! (`trapvec-spec.5`), trapd's configuration (`trapd.toml.5`) and the agent's environment
//! (`trapvec-agent.5`). Their keys are the ones the code reads (`instr_manager::splice`'s flat
//! form, `trapd::config`, the agent's `std::env` reads); a test in `tests/man_pages.rs` checks
//! that each page is written and has its sections.

use std::path::{Path, PathBuf};

/// One page: its file name and its sections, each (title, paragraphs); a paragraph that
/// starts with `KEY\t` is a tagged paragraph (`.TP`) for KEY.
struct Page {
    file: &'static str,
    name: &'static str,
    what: &'static str,
    sections: &'static [(&'static str, &'static [&'static str])],
}

const SPEC: Page = Page {
    file: "trapvec-spec.5",
    name: "trapvec-spec",
    what: "the splice spec of trapctl apply, trapd's profiles and the agent (TOML)",
    sections: &[
        (
            "DESCRIPTION",
            &[
                "A spec is a TOML file of [[component]], [[splice]] and [[set]] tables. The same \
                 form is read by `trapctl apply SPEC`, by the agent ($TRAPVEC_SPEC), as a \
                 profile of trapd.toml(5), and (as JSON, one object per splice) by trapd's \
                 protocol. A spec is applied all or nothing unless --best-effort is given. \
                 A spec file named *.json is the same object in JSON ({\"splice\": [{\"at\": \
                 ...}]}), what a program that writes thousands of splices should write: it is \
                 read about nine times as fast.",
            ],
        ),
        (
            "[[component]]",
            &[
                "path\tThe component object (ELF relocatable), relative to the spec file.",
                "crc32\tOptional: the object's CRC32; a different file is refused.",
            ],
        ),
        (
            "[[splice]]",
            &[
                "at\tThe point: [object:]symbol[@version|@0xADDRESS][+offset], 0xADDRESS, or a glob of \
                 functions ('tcp_v4_*') that expands to every matching function, applied as one batch.",
                "action\tcall (run handler, then the original), replace (go to handler instead; \
                 at a function's entry), count (only count the hits) or time (a log2 histogram \
                 of each call's time, entry to return).",
                "handler\tA symbol of a loaded component (call, replace).",
                "mechanism\ttrap (default) or jmp.",
                "cookie\tThe call handler's second argument (default 0).",
                "when\tentry (default) or return: run the action when the function returns.",
                "maxactive\tA return point's calls in progress at once (default 256).",
                "clock\tFor time: wall (default) or cpu.",
                "by\tFor count: key the hits by tid (the thread: the kernel's task->pid, a process's \
                 gettid()), pid (the process: task->tgid, getpid()), comm or cpu. tgid is read as \
                 pid with a warning (before this release by = \"pid\" meant the thread: write tid).",
                "pid\tOnly for the threads of process N (the kernel's task->tgid).",
                "tid\tOnly for thread N (gettid(); the kernel's task->pid).",
                "comm\tOnly for tasks named NAME (1 to 15 bytes, as ps -o comm shows it).",
                "tgid\tThe old spelling of pid (the process); accepted with a warning. Before \
                 this release `pid` meant the kernel's task->pid (a thread): a spec written \
                 then says tid instead.",
            ],
        ),
        (
            "[[set]]",
            &[
                "symbol\tA variable of a loaded component, written after loading.",
                "value\tIts new value.",
                "size\t1, 2, 4 or 8 bytes (default: the variable's size, else 8).",
            ],
        ),
        (
            "EXAMPLES",
            &[
                "[[component]]\npath = \"mss_clamp.o\"\n\n[[splice]]\nat = \"tcp_sync_mss\"\n\
                 action = \"replace\"\nhandler = \"mss_clamp_tcp_sync_mss\"\n\n[[splice]]\n\
                 at = \"tcp_v4_*\"\naction = \"count\"\npid = 4242",
            ],
        ),
        (
            "SEE ALSO",
            &["trapctl-apply(1), trapd.toml(5), trapvec-agent(5), docs/reference.md"],
        ),
    ],
};

const TRAPD_TOML: Page = Page {
    file: "trapd.toml.5",
    name: "trapd.toml",
    what: "the configuration of trapd, trapvec's reconfiguration daemon",
    sections: &[
        (
            "DESCRIPTION",
            &[
                "trapd reads one TOML file (trapd --config PATH): where it listens and \
                 journals, who may use its socket, the metrics it samples, the rules over them \
                 and the profiles the rules activate. Unknown keys are refused, naming them.",
            ],
        ),
        (
            "TOP-LEVEL KEYS",
            &[
                "socket\tThe socket path (default /run/trapd.sock; --socket overrides).",
                "journal\tThe journal (default /var/lib/trapd/journal; --journal overrides); \
                 every change is written and fsync'ed there first.",
                "listen\tWhere the Prometheus endpoint (GET /metrics) listens, e.g. \
                 \"127.0.0.1:9464\"; none when unset.",
                "allow_groups\tGroups (names or ids) whose members may use the socket besides root.",
                "interval_ms\tHow often metrics are sampled and rules evaluated (default 1000).",
                "min_dwell_s\tNo rule switches profiles until the active one has been active this long.",
                "initial_profile\tThe profile activated at start when the journal names none.",
            ],
        ),
        (
            "[[metric]]",
            &[
                "name\tThe metric's name, for rules.",
                "source\tsnmp (counter = \"Tcp:RetransSegs\", optional per = \"Tcp:OutSegs\" for \
                 a percentage, optional path) or file (path, optional delta = true).",
            ],
        ),
        (
            "[[rule]]",
            &[
                "metric\tA [[metric]]'s name.",
                "above, below\tExactly one: the condition holds while the value is strictly above or below.",
                "for_s\tSeconds the condition must hold before the rule fires (default 0).",
                "activate\tThe profile the rule activates.",
            ],
        ),
        (
            "[profile.NAME]",
            &[
                "components\tComponent objects loaded before the profile's splices (relative: to the config).",
                "splice\tSplices in the form of trapvec-spec(5)'s [[splice]] tables.",
                "set\tVariables written before the splices go live: { symbol, value, size }.",
            ],
        ),
        (
            "EXAMPLES",
            &[
                "socket = \"/run/trapd.sock\"\ninitial_profile = \"clean\"\n\n[[metric]]\n\
                 name = \"retrans\"\nsource = \"snmp\"\ncounter = \"Tcp:RetransSegs\"\n\
                 per = \"Tcp:OutSegs\"\n\n[[rule]]\nmetric = \"retrans\"\nabove = 5.0\n\
                 activate = \"lossy\"\n\n[profile.lossy]\ncomponents = [\"/components/mss_clamp.o\"]\n\
                 splice = [{ at = \"tcp_sync_mss\", action = \"replace\", handler = \"mss_clamp_tcp_sync_mss\" }]\n\n\
                 [profile.clean]",
            ],
        ),
        (
            "SEE ALSO",
            &["trapd(8), trapvec-spec(5), trapd/trapd.example.toml, docs/deployment.md"],
        ),
    ],
};

const AGENT_ENV: Page = Page {
    file: "trapvec-agent.5",
    name: "trapvec-agent",
    what: "the environment of libtrapvec_agent.so, trapvec's LD_PRELOAD agent",
    sections: &[
        (
            "DESCRIPTION",
            &[
                "A program started with LD_PRELOAD=libtrapvec_agent.so applies the spec named by \
                 TRAPVEC_SPEC before main runs. When the spec cannot be applied the program \
                 exits with status 86 and main never runs.",
            ],
        ),
        (
            "ENVIRONMENT",
            &[
                "TRAPVEC_SPEC\tThe spec to apply (trapvec-spec(5)); without it the agent does nothing.",
                "TRAPVEC_STATS\tWhere to write the splices' figures (JSON) at exit; %p becomes the pid.",
                "TRAPVEC_LOG\tThe agent's log level (error, warn, info, debug, trace); debug \
                 shows every decision.",
                "TRAPVEC_SIGNAL\tThe signal that scans the threads (default SIGRTMAX-1; a number, \
                 SIGUSR1, SIGUSR2, SIGRTMIN+n or SIGRTMAX-n), for a program that uses that one itself.",
                "TRAPVEC_INHERIT\t1: exec'd children keep the agent and apply the spec too.",
                "TRAPVEC_CONTROL\t1: open the control channel that trapctl -p PID uses \
                 (under $XDG_RUNTIME_DIR).",
            ],
        ),
        (
            "EXIT STATUS",
            &["86\tThe spec could not be applied (named on stderr); main never ran."],
        ),
        (
            "EXAMPLES",
            &["LD_PRELOAD=libtrapvec_agent.so TRAPVEC_SPEC=spec.toml TRAPVEC_STATS=stats-%p.json ./program"],
        ),
        (
            "SEE ALSO",
            &["trapctl(1), trapvec-spec(5), docs/process.md"],
        ),
    ],
};

/// The pages, in the order they are written.
const PAGES: [&Page; 3] = [&SPEC, &TRAPD_TOML, &AGENT_ENV];

/// `text` for roff: backslashes and hyphens escaped, a line that starts with `.` or `'` defused.
fn roff(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('-', "\\-")
        .lines()
        .map(|l| match l.starts_with(['.', '\'']) {
            true => format!("\\&{l}"),
            false => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl Page {
    fn render(&self, version: &str) -> String {
        let mut out = format!(
            ".TH {} 5 \"\" \"trapvec {version}\" \"File Formats\"\n.SH NAME\n{} \\- {}\n",
            self.name.to_uppercase(),
            roff(self.name),
            roff(self.what)
        );
        for (title, paragraphs) in self.sections {
            out.push_str(&format!(".SH \"{}\"\n", roff(title)));
            for p in *paragraphs {
                match p.split_once('\t') {
                    Some((key, text)) => {
                        out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", roff(key), roff(text)))
                    }
                    // A multi-line paragraph is an example: kept as written.
                    None if p.contains('\n') => {
                        out.push_str(&format!(".PP\n.nf\n{}\n.fi\n", roff(p)))
                    }
                    None => out.push_str(&format!(".PP\n{}\n", roff(p))),
                }
            }
        }
        out
    }
}

/// Write the man(5) pages into `dir` (which exists); returns their paths.
pub fn write(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::with_capacity(PAGES.len());
    for page in PAGES {
        let path = dir.join(page.file);
        std::fs::write(&path, page.render(env!("CARGO_PKG_VERSION")))?;
        out.push(path);
    }
    Ok(out)
}
