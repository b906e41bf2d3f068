//! Shell completions and man pages generated from a command's clap definition: what the
//! `completions SHELL` and `man DIR` subcommands of `trapctl` and `trapd` print and
//! write; each page also gets the EXAMPLES and EXIT STATUS sections its tool gives ([`ManExtras`]). The Debian packages run them at build time (`packaging/build-deb`), so what is
//! installed always matches the binaries' real options.

use std::io::Write;
use std::path::{Path, PathBuf};

pub use clap_complete::Shell;

/// Why the pages could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing man pages to {dir}: {source}")]
pub struct ManError {
    pub dir: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Write `shell`'s completion script for `cmd` (named `bin`) to `out`.
pub fn completions(mut cmd: clap::Command, bin: &str, shell: Shell, out: &mut dyn Write) {
    clap_complete::generate(shell, &mut cmd, bin, out);
}

/// What a tool's man pages say beyond its options.
#[derive(Clone, Copy, Debug, Default)]
pub struct ManExtras<'a> {
    /// EXIT STATUS, on every page: (status, meaning).
    pub exit_status: &'a [(&'a str, &'a str)],
    /// EXAMPLES, by page (`trapctl`, `trapctl-count`, ...): command lines, each followed by
    /// what it does.
    pub examples: &'a [(&'a str, &'a [(&'a str, &'a str)])],
}

/// `text` for roff: backslashes and hyphens escaped, a leading `.` or `'` defused.
fn roff(text: &str) -> String {
    let s = text.replace('\\', "\\\\").replace('-', "\\-");
    if s.starts_with(['.', '\'']) {
        format!("\\&{s}")
    } else {
        s
    }
}

impl ManExtras<'_> {
    /// The sections for the page named `page`.
    fn sections(&self, page: &str) -> String {
        let mut out = String::new();
        if let Some((_, examples)) = self.examples.iter().find(|(p, _)| *p == page) {
            out.push_str(".SH EXAMPLES\n");
            for (line, what) in *examples {
                out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", roff(line), roff(what)));
            }
        }
        if !self.exit_status.is_empty() {
            out.push_str(".SH \"EXIT STATUS\"\n");
            for (status, what) in self.exit_status {
                out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", roff(status), roff(what)));
            }
        }
        out
    }
}

/// Write `cmd`'s man page (`NAME.1`) and one per visible subcommand (`NAME-SUB.1`) into
/// `dir` (created if missing), each with `extras`' sections; hidden subcommands get none.
/// Returns the files written, in order: the command's own page first.
pub fn man_pages(
    cmd: clap::Command,
    dir: &Path,
    extras: &ManExtras,
) -> Result<Vec<PathBuf>, ManError> {
    fn write(
        cmd: clap::Command,
        dir: &Path,
        extras: &ManExtras,
        out: &mut Vec<PathBuf>,
    ) -> std::io::Result<()> {
        let subs: Vec<clap::Command> = cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .cloned()
            .collect();
        let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_string();
        let page = clap_mangen::Man::new(cmd).generate_to(dir)?;
        let extra = extras.sections(&name);
        if !extra.is_empty() {
            let mut f = std::fs::OpenOptions::new().append(true).open(&page)?;
            f.write_all(extra.as_bytes())?;
        }
        out.push(page);
        for s in subs {
            write(s, dir, extras, out)?;
        }
        Ok(())
    }
    let err = |source| ManError {
        dir: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    // Built, subcommands are named `trapctl-list` (their display names) and `help` is no
    // subcommand of its own page.
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    write(cmd, dir, extras, &mut out).map_err(err)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool() -> clap::Command {
        clap::Command::new("tool")
            .version("1.2.3")
            .about("Does things")
            .subcommand(
                clap::Command::new("list").about("Lists").arg(
                    clap::Arg::new("json")
                        .long("json")
                        .action(clap::ArgAction::SetTrue),
                ),
            )
            .subcommand(clap::Command::new("secret").hide(true))
    }

    #[test]
    fn man_pages_are_one_per_visible_command_and_none_for_hidden_ones() {
        let dir = tempfile::tempdir().unwrap();
        let extras = ManExtras {
            exit_status: &[("0", "done"), ("3", "partly applied")],
            examples: &[("tool-list", &[("tool list --json", "lists, as JSON")])],
        };
        let pages = man_pages(tool(), &dir.path().join("man1"), &extras).unwrap();
        let names: Vec<String> = pages
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["tool.1", "tool-list.1"]);
        let list = std::fs::read_to_string(&pages[1]).unwrap();
        assert!(list.contains(".TH tool-list 1"), "{list}");
        assert!(list.contains("\\-\\-json"), "{list}");
        assert!(
            list.contains(".SH EXAMPLES\n.TP\n\\fBtool list \\-\\-json\\fR\nlists, as JSON\n"),
            "{list}"
        );
        assert!(
            list.contains(
                ".SH \"EXIT STATUS\"\n.TP\n\\fB0\\fR\ndone\n.TP\n\\fB3\\fR\npartly applied\n"
            ),
            "{list}"
        );
        let main = std::fs::read_to_string(&pages[0]).unwrap();
        assert!(
            main.contains("tool\\-list(1)"),
            "the main page names its subcommands' pages: {main}"
        );
        assert!(!main.contains("secret"), "hidden commands stay out: {main}");
        assert!(
            !main.contains("EXAMPLES") && main.contains("EXIT STATUS"),
            "examples only where given, exit statuses everywhere: {main}"
        );
    }

    #[test]
    fn completions_name_the_binary_its_commands_and_options() {
        let mut out = Vec::new();
        completions(tool(), "tool", Shell::Bash, &mut out);
        let script = String::from_utf8(out).unwrap();
        assert!(script.contains("complete -F _tool"), "{script}");
        assert!(
            script.contains("tool,list)") && script.contains("--json"),
            "{script}"
        );
        // clap_complete completes hidden commands too (docs/deployment.md).
        let mut out = Vec::new();
        completions(tool(), "tool", Shell::Fish, &mut out);
        let script = String::from_utf8(out).unwrap();
        assert!(
            script.contains("complete -c tool") && script.contains("-l json"),
            "{script}"
        );
    }

    #[test]
    fn an_unwritable_directory_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, "x").unwrap();
        let e = man_pages(tool(), &file.join("man1"), &ManExtras::default()).unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "writing man pages to {}",
                file.join("man1").display()
            )),
            "{e}"
        );
    }
}
