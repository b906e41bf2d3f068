//! Shell-style globs over function names: `tcp_*`, `__x64_sys_get?id`, `ext4_[a-f]*`, optionally
//! qualified by the object that holds the function (`nf_conntrack:*`, `libc.so.6:str*`), the way
//! a point is qualified ([`crate::point`]).
//!
//! `*` matches any run of characters, `?` one character, `[abc]`, `[a-z]` and `[!abc]` one of (or
//! none of) a set; every other character stands for itself. A glob matches a whole name. The
//! object part matches a kernel module's name, or a process object's path or its file name;
//! without one, every object's functions are candidates. Globs are translated to anchored
//! regular expressions (the `regex` crate): matching 46,000 kernel names takes milliseconds.

use regex::Regex;
use trapvec::{Symbol, SymbolKind, SymbolTable};

/// Whether `text` is a glob rather than one point: it holds `*`, `?` or `[` in its symbol part.
pub fn is_glob(text: &str) -> bool {
    let name = text.rsplit_once(':').map_or(text, |(_, n)| n);
    name.contains(['*', '?', '['])
}

/// Why a glob is not one.
#[derive(Debug, thiserror::Error)]
#[error("bad glob `{text}`: {reason}")]
pub struct GlobError {
    pub text: String,
    pub reason: String,
}

/// A compiled glob over function names, with its optional object part.
#[derive(Clone, Debug)]
pub struct FunctionGlob {
    text: String,
    object: Option<Regex>,
    name: Regex,
    /// The name part when it has no `*`, `?` or `[` (it matches only itself): looked up by
    /// [`matching_functions`] in a set, where tens of thousands of plain names (`trapctl cover`
    /// of every function ftrace lists) would otherwise each be tried on every symbol.
    literal: Option<String>,
}

impl FunctionGlob {
    /// Compile `[OBJECT:]NAME`, each part a glob.
    pub fn new(text: &str) -> Result<FunctionGlob, GlobError> {
        let t = text.trim();
        let bad = |reason: &str| GlobError {
            text: text.to_string(),
            reason: reason.to_string(),
        };
        if t.is_empty() {
            return Err(bad("empty"));
        }
        let (object, name) = match t.rsplit_once(':') {
            Some(("", _)) => return Err(bad("no object before `:`")),
            Some((o, n)) => (Some(o), n),
            None => (None, t),
        };
        // The object part may hold a `+` (`libstdc++.so.6`); the name part may not.
        if name.contains('+') {
            return Err(bad("a glob names functions; it takes no `+offset`"));
        }
        if name.is_empty() {
            return Err(bad("no name after `:`"));
        }
        let object = object
            .map(|o| to_regex(o).map_err(|r| bad(&format!("in the object part: {r}"))))
            .transpose()?;
        let literal = (!name.contains(['*', '?', '['])).then(|| name.to_string());
        let name = to_regex(name).map_err(|r| bad(&r))?;
        Ok(FunctionGlob {
            text: t.to_string(),
            object,
            name,
            literal,
        })
    }

    /// The glob as written (trimmed).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether `name` of `origin` (`None`: vmlinux or the main executable) matches.
    pub fn matches(&self, name: &str, origin: Option<&str>) -> bool {
        if !self.name.is_match(name) {
            return false;
        }
        match (&self.object, origin) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(o), Some(origin)) => {
                let file = origin.rsplit('/').next().unwrap_or(origin);
                o.is_match(origin) || o.is_match(file)
            }
        }
    }
}

/// The functions of `symbols` any of `globs` matches, by address, each address once (the first
/// name listed there: aliases are one function). Parts a compiler split out (`f.cold`,
/// `f.part.0`) are functions of their own here, as in kallsyms.
pub fn matching_functions<'a>(symbols: &'a SymbolTable, globs: &[FunctionGlob]) -> Vec<&'a Symbol> {
    // Plain names without an object part match by name alone: one set lookup per symbol for
    // all of them; the others are tried in turn.
    let (plain, patterns): (Vec<&FunctionGlob>, Vec<&FunctionGlob>) = globs
        .iter()
        .partition(|g| g.object.is_none() && g.literal.is_some());
    let names: std::collections::HashSet<&str> =
        plain.iter().filter_map(|g| g.literal.as_deref()).collect();
    let mut out: Vec<&Symbol> = symbols
        .iter()
        .filter(|s| s.kind == SymbolKind::Function)
        .filter(|s| {
            names.contains(s.name.as_str())
                || patterns
                    .iter()
                    .any(|g| g.matches(&s.name, s.origin.as_deref()))
        })
        .collect();
    out.sort_by_key(|s| s.addr);
    out.dedup_by_key(|s| s.addr);
    out
}

/// `glob` as an anchored regular expression, or why not.
fn to_regex(glob: &str) -> Result<Regex, String> {
    let mut re = String::with_capacity(glob.len() * 2 + 2);
    re.push('^');
    let mut chars = glob.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' => re.push_str(".*"),
            '?' => re.push('.'),
            '[' => {
                let mut class = String::new();
                if matches!(chars.peek(), Some('!') | Some('^')) {
                    chars.next();
                    class.push('^');
                }
                let mut closed = false;
                let mut first = true;
                for c in chars.by_ref() {
                    if c == ']' && !first {
                        closed = true;
                        break;
                    }
                    first = false;
                    if matches!(c, '\\' | '[' | '&' | '~') {
                        class.push('\\');
                    }
                    class.push(c);
                }
                if !closed {
                    return Err(format!("`[` at `{glob}` is never closed"));
                }
                re.push('[');
                re.push_str(&class);
                re.push(']');
            }
            c => re.push_str(&regex::escape(c.encode_utf8(&mut [0; 4]))),
        }
    }
    re.push('$');
    Regex::new(&re).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(t: &str) -> FunctionGlob {
        FunctionGlob::new(t).unwrap()
    }

    #[test]
    fn stars_questions_and_sets_match_whole_names() {
        assert!(g("tcp_*").matches("tcp_sync_mss", None));
        assert!(g("tcp_*").matches("tcp_", None));
        assert!(!g("tcp_*").matches("__tcp_sync_mss", None));
        assert!(g("*mss*").matches("tcp_sync_mss", None));
        assert!(g("__x64_sys_get?id").matches("__x64_sys_getpid", None));
        assert!(!g("__x64_sys_get?id").matches("__x64_sys_getppid", None));
        assert!(g("ext4_[a-c]*").matches("ext4_bread", None));
        assert!(!g("ext4_[a-c]*").matches("ext4_dirty_inode", None));
        assert!(g("ext4_[!a-c]*").matches("ext4_dirty_inode", None));
        assert!(!g("ext4_[!a-c]*").matches("ext4_bread", None));
        // Characters a regex would read are literal.
        assert!(g("a.b").matches("a.b", None));
        assert!(!g("a.b").matches("axb", None));
        assert!(g("f.cold*").matches("f.cold.1", None));
        assert!(g("[]]x").matches("]x", None));
    }

    #[test]
    fn the_object_part_matches_a_module_a_path_or_its_file_name() {
        assert!(g("nf_*:*").matches("nf_ct_get", Some("nf_conntrack")));
        assert!(!g("nf_*:*").matches("tcp_v4_rcv", None));
        assert!(g("libc.so.6:str*").matches("strlen", Some("/usr/lib/x86_64-linux-gnu/libc.so.6")));
        assert!(!g("libc.so.6:str*").matches("strlen", Some("/lib/libm.so.6")));
        assert!(g("str*").matches("strlen", Some("/lib/libc.so.6")));
    }

    #[test]
    fn bad_globs_name_the_text_and_why() {
        for (t, why) in [
            ("", "empty"),
            ("tcp_*+4", "takes no `+offset`"),
            ("libstdc++.so.6:_ZSt*+4", "takes no `+offset`"),
            (":tcp_*", "no object before"),
            ("mod:", "no name after"),
            ("tcp_[a-", "never closed"),
        ] {
            let e = FunctionGlob::new(t).unwrap_err().to_string();
            assert!(e.contains(why), "{t:?}: {e}");
        }
    }

    #[test]
    fn an_object_part_may_hold_a_plus() {
        let g = FunctionGlob::new("libstdc++.so.6:_ZSt9terminate*").unwrap();
        assert!(g.matches(
            "_ZSt9terminatev",
            Some("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
        ));
        assert!(!g.matches("_ZSt9terminatev", Some("/usr/lib/libstdcxx.so.6")));
        assert!(is_glob("libstdc++.so.6:_ZSt*"));
    }

    #[test]
    fn is_glob_looks_at_the_symbol_part_only() {
        assert!(is_glob("tcp_*"));
        assert!(is_glob("libc.so.6:str?"));
        assert!(!is_glob("tcp_sync_mss+0x4"));
        assert!(!is_glob("0xffffffff81000000"));
    }

    #[test]
    fn matching_functions_are_functions_by_address_each_once() {
        let sym = |name: &str, addr: u64, kind: SymbolKind| Symbol {
            name: name.to_string(),
            addr,
            size: 16,
            kind,
            origin: None,
            version: None,
        };
        let table = SymbolTable::new(vec![
            sym("tcp_b", 0x2000, SymbolKind::Function),
            sym("tcp_a", 0x1000, SymbolKind::Function),
            sym("tcp_alias", 0x1000, SymbolKind::Function),
            sym("tcp_table", 0x3000, SymbolKind::Object),
            sym("udp_a", 0x4000, SymbolKind::Function),
        ]);
        let found: Vec<u64> = matching_functions(&table, &[g("tcp_*"), g("tcp_a")])
            .iter()
            .map(|s| s.addr)
            .collect();
        assert_eq!(found, vec![0x1000, 0x2000]);
    }

    #[test]
    fn plain_names_match_as_their_globs_do() {
        let sym = |name: &str, addr: u64, origin: Option<&str>| Symbol {
            name: name.to_string(),
            addr,
            size: 16,
            kind: SymbolKind::Function,
            origin: origin.map(str::to_string),
            version: None,
        };
        let table = SymbolTable::new(vec![
            sym("tcp_a", 0x1000, None),
            sym("tcp_ab", 0x2000, None),
            sym("tcp_a.cold", 0x3000, None),
            sym("tcp_a", 0x9000, Some("nf_conntrack")),
            sym("udp_a", 0x4000, None),
            sym("tcpxa", 0x5000, None),
        ]);
        let at = |globs: &[&str]| -> Vec<u64> {
            let globs: Vec<FunctionGlob> = globs.iter().map(|t| g(t)).collect();
            matching_functions(&table, &globs)
                .iter()
                .map(|s| s.addr)
                .collect()
        };
        // A plain name is the whole name, of any object, as its glob would match it; a `.` is
        // no wildcard.
        assert_eq!(at(&["tcp_a"]), vec![0x1000, 0x9000]);
        assert_eq!(at(&["tcp_a.cold"]), vec![0x3000]);
        assert_eq!(at(&["tcp.a"]), Vec::<u64>::new());
        // With an object part, only that object's; beside patterns, the union.
        assert_eq!(at(&["nf_conntrack:tcp_a"]), vec![0x9000]);
        assert_eq!(at(&["udp_a", "tcp_a?"]), vec![0x2000, 0x4000]);
        // Many plain names: each matches itself only.
        let many: Vec<String> = (0..5000).map(|i| format!("f{i}")).collect();
        let mut names: Vec<&str> = many.iter().map(String::as_str).collect();
        names.push("tcpxa");
        assert_eq!(at(&names), vec![0x5000]);
    }
}
