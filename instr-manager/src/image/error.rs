//! What can go wrong reading a code image.

use object::ObjectKind;
use thiserror::Error;

/// What went wrong reading an image.
#[derive(Debug, Error)]
pub enum ImageError {
    #[error("{file}: not an ELF file object can read")]
    Parse {
        file: String,
        #[source]
        source: object::Error,
    },
    #[error("{file}: {machine:?} code, not x86-64")]
    Machine {
        file: String,
        machine: object::Architecture,
    },
    #[error("{file}: unsupported ELF file kind {kind:?}")]
    Kind { file: String, kind: ObjectKind },
    #[error("{file}: cannot read section {section}")]
    Section {
        file: String,
        section: String,
        #[source]
        source: object::Error,
    },
    #[error("{file}: relocation at {section}+{offset:#x}: {reason}")]
    Relocation {
        file: String,
        section: String,
        offset: u64,
        reason: String,
    },
    #[error("{file}: no symbol `{symbol}` is defined in it")]
    NoSymbol { file: String, symbol: String },
    #[error("{file}: symbol `{symbol}` is not in an executable section")]
    NotInCode { file: String, symbol: String },
    #[error("{file}: no `.text` section to anchor kallsyms' `_text` to")]
    NoText { file: String },
    #[error("kallsyms has no `_text` symbol: cannot undo KASLR")]
    NoTextSymbol,
    #[error(transparent)]
    Kallsyms(#[from] trapvec::kernel::kallsyms::KallsymsError),
    #[error("{file}: no function of kallsyms lies in the image's code (wrong kernel version?)")]
    NoFunctions { file: String },
    #[error("cannot read {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}
