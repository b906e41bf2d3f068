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
        let subs: Vec<clap::Command> = cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned().collect();
        out.push(clap_mangen::Man::new(cmd).generate_to(dir)?);
        for s in subs {
            write(s, dir, out)?;
        }
        Ok(())
    }
    let err = |source| ManError { dir: dir.to_owned(), source };
    std::fs::create_dir_all(dir).map_err(err)?;
    // Built, subcommands are named `trapctl-list` (their display names) and `help` is no
    // subcommand of its own page.
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    write(cmd, dir, &mut out).map_err(err)?;
    Ok(out)
}
