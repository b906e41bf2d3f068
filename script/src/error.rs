//! Compile errors: each names the line and column of the culprit and shows the line with a caret.

/// A position in the program text (1-based line and column, in characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

/// Why a program does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("error at {}:{}: {message}\n{source_line}\n{caret}", pos.line, pos.col)]
pub struct CompileError {
    pub pos: Pos,
    pub message: String,
    /// The program's line the error is on.
    pub source_line: String,
    /// Spaces and a `^` under the culprit.
    pub caret: String,
}

impl CompileError {
    /// An error at `pos` of `source`.
    pub fn new(source: &str, pos: Pos, message: impl Into<String>) -> CompileError {
        let line = source
            .lines()
            .nth(pos.line.saturating_sub(1) as usize)
            .unwrap_or("")
            .to_string();
        let caret = format!("{}^", " ".repeat(pos.col.saturating_sub(1) as usize));
        CompileError {
            pos,
            message: message.into(),
            source_line: line,
            caret,
        }
    }

    /// The first line alone: `error at 1:17: unknown builtin 'pidd'`.
    pub fn headline(&self) -> String {
        format!(
            "error at {}:{}: {}",
            self.pos.line, self.pos.col, self.message
        )
    }
}

/// A message at a position, turned into a [`CompileError`] once the source is at hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spanned {
    pub pos: Pos,
    pub message: String,
}

pub(crate) fn err<T>(pos: Pos, message: impl Into<String>) -> Result<T, Spanned> {
    Err(Spanned {
        pos,
        message: message.into(),
    })
}
