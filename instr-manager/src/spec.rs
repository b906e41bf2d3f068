//! The splice spec: a TOML file naming components, splices and component variables, used by the
//! agent (`TRAPVEC_SPEC`), by `trapctl` against the kernel and by the daemon.
//!
//! ```toml
//! [[component]]
//! path = "handler.o"          # relative to the spec file
//! crc32 = 0x1234abcd          # optional: refuse to load if the file's CRC32 differs
//!
//! [[splice]]
//! at = "compute+0"            # symbol, symbol+offset, or 0xADDRESS; or a glob ("tcp_v4_*",
//!                             # "MOD:nf_*"): the entry of every matching function, one batch
//! action = "call"             # "call", "replace" or "count"
//! handler = "count_compute"   # a symbol of a loaded component (call, replace)
//! mechanism = "trap"          # "trap" (default) or "jmp"
//! cookie = 0                  # optional, passed to call handlers
//!
//! [[set]]                     # optional: component variables written after loading
//! symbol = "mss_clamp_mtu"
//! value = 1000
//! size = 4                    # 1, 2, 4 or 8 (default: the symbol's size, else 8)
//! ```
//!
//! Unknown keys are refused; every error names the spec file and the key (`splice[1].at`).
//!
//! A spec whose file name ends in `.json` is the same object written as JSON (`{"splice":
//! [{"at": "0x...", "action": "count"}], "owner": {...}}`): what a front end that writes
//! thousands of splices writes (`trapctl cover`): 10,000 owned count splices on the host are
//! read in 7.5 ms instead of 65 and written in 2.5 ms instead of 95 (`toml`'s reader and
//! writer; under TCG the TOML spec was 0.6 s of a coverage run's arm, 2026-12-07).
//! A `[[splice]]` table is the flat form of [`SpliceRequest`], read by serde as every other
//! way of writing a splice is (see [`crate::splice`]).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::SpecError;
use crate::point::PointSpec;
use crate::splice::SpliceRequest;

/// A component to load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentSpec {
    /// Resolved against the spec file's directory.
    pub path: PathBuf,
    /// Expected CRC32 of the file, when given.
    pub crc32: Option<u32>,
}

/// A component variable written after loading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetSpec {
    pub symbol: String,
    /// The value's bits: truncated to `size` bytes when a size is given (negative values are
    /// two's complement), else the 8-byte two's complement, fitted to the variable's own size
    /// when written (`crate::ops`).
    pub value: u64,
    /// 1, 2, 4 or 8; `None`: the symbol's size (else 8).
    pub size: Option<usize>,
}

/// A whole spec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spec {
    pub components: Vec<ComponentSpec>,
    pub splices: Vec<SpliceRequest>,
    pub sets: Vec<SetSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    #[serde(default)]
    component: Vec<RawComponent>,
    #[serde(default)]
    splice: Vec<SpliceRequest>,
    #[serde(default)]
    set: Vec<RawSet>,
    /// The owner of every splice that names none of its own (a front end's spec of thousands
    /// of splices held by one command: [`crate::ops::expand::spec_text`]).
    #[serde(default)]
    owner: Option<crate::owner::Owner>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawComponent {
    path: PathBuf,
    crc32: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSet {
    symbol: String,
    value: i64,
    #[serde(default)]
    size: Option<u8>,
}

/// `value` as `size` bytes, if it fits as a signed or an unsigned number of that size.
fn fit(value: i64, size: u8) -> Result<u64, String> {
    if !matches!(size, 1 | 2 | 4 | 8) {
        return Err(format!("size {size} is not 1, 2, 4 or 8"));
    }
    let bits = u32::from(size) * 8;
    let bits_u64 = u64::from_ne_bytes(value.to_ne_bytes());
    if bits == 64 {
        return Ok(bits_u64);
    }
    let min = -(1i64 << (bits - 1));
    let max = (1i64 << bits) - 1;
    if value < min || value > max {
        return Err(format!("value {value} does not fit in {size} byte(s)"));
    }
    Ok(bits_u64 & ((1u64 << bits) - 1))
}

impl Spec {
    /// Whether the spec file `file` is JSON (its name ends in `.json`, in any case).
    pub fn is_json(file: &Path) -> bool {
        file.extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"))
    }

    /// Read and check a spec file; relative component paths are resolved against its directory.
    pub fn from_path(path: &Path) -> Result<Spec, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Io {
            file: path.to_path_buf(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Spec::parse(&text, base, path)
    }

    /// Parse spec text; `base` resolves relative paths, `file` names the spec in errors and
    /// says its form: JSON when its name ends in `.json`, else TOML.
    pub fn parse(text: &str, base: &Path, file: &Path) -> Result<Spec, SpecError> {
        let parse_error = |message: String| SpecError::Parse {
            file: file.to_path_buf(),
            message: message.trim_end().to_string(),
        };
        let raw: RawSpec = if Spec::is_json(file) {
            serde_json::from_str(text).map_err(|e| parse_error(e.to_string()))?
        } else {
            toml::from_str(text).map_err(|e| parse_error(e.to_string()))?
        };
        let invalid = |key: String, reason: String| SpecError::Invalid {
            file: file.to_path_buf(),
            key,
            reason,
        };

        let mut components = Vec::with_capacity(raw.component.len());
        for (i, c) in raw.component.into_iter().enumerate() {
            if c.path.as_os_str().is_empty() {
                return Err(invalid(format!("component[{i}].path"), "empty path".into()));
            }
            let path = if c.path.is_absolute() {
                c.path
            } else {
                base.join(c.path)
            };
            components.push(ComponentSpec {
                path,
                crc32: c.crc32,
            });
        }

        for (i, s) in raw.splice.iter().enumerate() {
            // A glob stands for the entries of the functions it matches, expanded when the
            // spec is applied (ops::expand).
            let checked = if crate::glob::is_glob(&s.at) {
                crate::glob::FunctionGlob::new(&s.at)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            } else {
                s.at.parse::<PointSpec>()
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            };
            checked.map_err(|e| invalid(format!("splice[{i}].at"), e))?;
        }
        let mut splices = raw.splice;
        if let Some(owner) = raw.owner {
            for s in splices.iter_mut().filter(|s| s.options.owner.is_none()) {
                s.options.owner = Some(owner.clone());
            }
        }

        let mut sets = Vec::with_capacity(raw.set.len());
        for (i, s) in raw.set.into_iter().enumerate() {
            if s.symbol.trim().is_empty() {
                return Err(invalid(
                    format!("set[{i}].symbol"),
                    "empty symbol name".into(),
                ));
            }
            let size = s.size.unwrap_or(8);
            let key = if matches!(size, 1 | 2 | 4 | 8) {
                "value"
            } else {
                "size"
            };
            let value = fit(s.value, size).map_err(|r| invalid(format!("set[{i}].{key}"), r))?;
            sets.push(SetSpec {
                symbol: s.symbol,
                value,
                size: s.size.map(usize::from),
            });
        }
        log::debug!(
            "spec {}: {} component(s), {} splice(s), {} set(s)",
            file.display(),
            components.len(),
            splices.len(),
            sets.len()
        );
        Ok(Spec {
            components,
            splices,
            sets,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mechanism;
    use crate::splice::Action;

    fn parse(text: &str) -> Result<Spec, SpecError> {
        Spec::parse(text, Path::new("/specs"), Path::new("/specs/demo.toml"))
    }

    #[test]
    fn full_spec_parses_with_defaults_and_resolved_paths() {
        let spec = parse(
            r#"
            [[component]]
            path = "handler.o"
            crc32 = 0x1234abcd
            [[component]]
            path = "/abs/other.o"

            [[splice]]
            at = "compute+0"
            action = "call"
            handler = "count_compute"
            [[splice]]
            at = "0xffffffff81000000"
            action = "replace"
            handler = "my_fn"
            mechanism = "jmp"
            cookie = 7

            [[set]]
            symbol = "mss_clamp_mtu"
            value = 1000
            size = 4
            [[set]]
            symbol = "flag"
            value = -1
            size = 1
            "#,
        )
        .unwrap();
        assert_eq!(
            spec.components,
            vec![
                ComponentSpec {
                    path: PathBuf::from("/specs/handler.o"),
                    crc32: Some(0x1234_abcd)
                },
                ComponentSpec {
                    path: PathBuf::from("/abs/other.o"),
                    crc32: None
                },
            ]
        );
        let point = |i: usize| spec.splices[i].at.parse::<PointSpec>().unwrap();
        assert_eq!(
            point(0),
            PointSpec::Symbol {
                name: "compute".into(),
                offset: 0,
                object: None,
                version: None,
                addr: None
            }
        );
        assert_eq!(
            (&spec.splices[0].action, spec.splices[0].mechanism),
            (
                &Action::Call {
                    handler: "count_compute".into(),
                    cookie: 0
                },
                Mechanism::Trap
            )
        );
        assert_eq!(point(1), PointSpec::Address(0xffff_ffff_8100_0000));
        // A cookie means nothing to `replace`.
        assert_eq!(
            (&spec.splices[1].action, spec.splices[1].mechanism),
            (
                &Action::Replace {
                    with: "my_fn".into()
                },
                Mechanism::Jmp
            )
        );
        assert_eq!(
            spec.sets[0],
            SetSpec {
                symbol: "mss_clamp_mtu".into(),
                value: 1000,
                size: Some(4)
            }
        );
        assert_eq!(
            spec.sets[1],
            SetSpec {
                symbol: "flag".into(),
                value: 0xFF,
                size: Some(1)
            }
        );
    }

    #[test]
    fn empty_spec_is_valid_and_empty() {
        assert_eq!(parse("").unwrap(), Spec::default());
    }

    #[test]
    fn unknown_key_is_refused_naming_file_and_key() {
        let err = parse(
            "[[splice]]\nat = \"f\"\naction = \"call\"\nhandler = \"h\"\nmechansim = \"jmp\"\n",
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, SpecError::Parse { .. }));
        assert!(
            msg.contains("/specs/demo.toml") && msg.contains("mechansim"),
            "{msg}"
        );
        let err = parse("[[splices]]\nat = \"f\"\n").unwrap_err();
        assert!(err.to_string().contains("splices"), "{err}");
    }

    #[test]
    fn bad_values_name_the_entry_and_field() {
        let err =
            parse("[[splice]]\nat = \"f+zz\"\naction = \"call\"\nhandler = \"h\"\n").unwrap_err();
        assert!(
            matches!(&err, SpecError::Invalid { key, .. } if key == "splice[0].at"),
            "{err}"
        );
        let err =
            parse("[[splice]]\nat = \"f\"\naction = \"jump\"\nhandler = \"h\"\n").unwrap_err();
        assert!(err.to_string().contains("jump"), "{err}");
        let err = parse(
            "[[splice]]\nat = \"f\"\naction = \"call\"\nhandler = \"h\"\nmechanism = \"int3\"\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("int3"), "{err}");
        let err = parse("[[set]]\nsymbol = \"x\"\nvalue = 300\nsize = 1\n").unwrap_err();
        assert!(
            matches!(&err, SpecError::Invalid { key, reason, .. } if key == "set[0].value" && reason.contains("300")),
            "{err}"
        );
        let err = parse("[[set]]\nsymbol = \"x\"\nvalue = 3\nsize = 3\n").unwrap_err();
        assert!(
            matches!(&err, SpecError::Invalid { key, .. } if key == "set[0].size"),
            "{err}"
        );
        let err = parse("[[component]]\npath = \"a.o\"\ncrc32 = -1\n").unwrap_err();
        assert!(
            err.to_string().contains("crc32") || err.to_string().contains("line 3"),
            "{err}"
        );
        let err = parse("[[splice]]\nat = \"f\"\naction = \"call\"\n").unwrap_err();
        assert!(err.to_string().contains("handler"), "{err}");
    }

    #[test]
    fn a_json_spec_is_the_same_spec_and_its_errors_name_file_and_key() {
        let toml = parse(
            "[[component]]\npath = \"h.o\"\ncrc32 = 7\n\n[[splice]]\nat = \"f+2\"\naction = \"count\"\nmechanism = \"jmp\"\nby = \"cpu\"\n\n[[set]]\nsymbol = \"v\"\nvalue = -1\nsize = 2\n",
        )
        .unwrap();
        let json =
            |text: &str| Spec::parse(text, Path::new("/specs"), Path::new("/specs/gen.json"));
        let from_json = json(
            r#"{"component": [{"path": "h.o", "crc32": 7}],
                "splice": [{"at": "f+2", "action": "count", "mechanism": "jmp", "by": "cpu"}],
                "set": [{"symbol": "v", "value": -1, "size": 2}]}"#,
        )
        .unwrap();
        assert_eq!(from_json, toml);
        assert_eq!(from_json.sets[0].value, 0xFFFF);
        // Unknown keys are refused in JSON too, naming the file and the key.
        let err = json(r#"{"splice": [{"at": "f", "action": "count", "mechansim": "jmp"}]}"#)
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, SpecError::Parse { .. }), "{msg}");
        assert!(
            msg.contains("/specs/gen.json") && msg.contains("mechansim"),
            "{msg}"
        );
        // The same checks after the parse: a bad point names its entry.
        let err = json(
            r#"{"splice": [{"at": "f", "action": "count"}, {"at": "f+zz", "action": "count"}]}"#,
        )
        .unwrap_err();
        assert!(
            matches!(&err, SpecError::Invalid { key, .. } if key == "splice[1].at"),
            "{err}"
        );
        // TOML in a `.json` file is not JSON: the error says where.
        let err = json("[[splice]]\nat = \"f\"\n").unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
        assert!(Spec::is_json(Path::new("a.Json")) && !Spec::is_json(Path::new("json")));
    }

    #[test]
    fn from_path_resolves_components_next_to_the_spec() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("spec.toml");
        std::fs::write(&file, "[[component]]\npath = \"h.o\"\n").unwrap();
        let spec = Spec::from_path(&file).unwrap();
        assert_eq!(spec.components[0].path, dir.path().join("h.o"));
        let missing = dir.path().join("nope.toml");
        let err = Spec::from_path(&missing).unwrap_err();
        assert!(matches!(err, SpecError::Io { .. }) && err.to_string().contains("nope.toml"));
    }

    #[test]
    fn count_splices_need_no_handler_and_empty_handlers_are_refused() {
        let spec =
            parse("[[splice]]\nat = \"f\"\naction = \"count\"\nmechanism = \"jmp\"\n").unwrap();
        assert_eq!(
            spec.splices[0],
            SpliceRequest {
                at: "f".into(),
                action: Action::Count,
                mechanism: Mechanism::Jmp,
                options: Default::default()
            }
        );
        let err =
            parse("[[splice]]\nat = \"f\"\naction = \"call\"\nhandler = \" \"\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("f: action `call` needs a `handler`"),
            "{err}"
        );
    }
}
