//! Shell completions and man pages generated from a command's clap definition: what the
//! hidden `completions SHELL` and `man DIR` subcommands of `trapctl` and `trapd` print and
//! write. The Debian packages run them at build time (`packaging/build-deb`), so what is
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

/// Write `cmd`'s man page (`NAME.1`) and one per visible subcommand (`NAME-SUB.1`) into
/// `dir` (created if missing); hidden subcommands get none. Returns the files written, in
/// order: the command's own page first.
pub fn man_pages(cmd: clap::Command, dir: &Path) -> Result<Vec<PathBuf>, ManError> {
    fn write(cmd: clap::Command, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        let subs: Vec<clap::Command> = cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .cloned()
            .collect();
        out.push(clap_mangen::Man::new(cmd).generate_to(dir)?);
        for s in subs {
            write(s, dir, out)?;
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
    write(cmd, dir, &mut out).map_err(err)?;
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
        let pages = man_pages(tool(), &dir.path().join("man1")).unwrap();
        let names: Vec<String> = pages
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["tool.1", "tool-list.1"]);
        let list = std::fs::read_to_string(&pages[1]).unwrap();
        assert!(list.contains(".TH tool-list 1"), "{list}");
        assert!(list.contains("\\-\\-json"), "{list}");
        let main = std::fs::read_to_string(&pages[0]).unwrap();
        assert!(
            main.contains("tool\\-list(1)"),
            "the main page names its subcommands' pages: {main}"
        );
        assert!(!main.contains("secret"), "hidden commands stay out: {main}");
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
        let e = man_pages(tool(), &file.join("man1")).unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "writing man pages to {}",
                file.join("man1").display()
            )),
            "{e}"
        );
    }
}
