//! Guest kernel modules a scenario may load (`modprobe sch_netem`, or the kernel's own
//! request_module when `tc` asks for a qdisc): which `.ko` files to pack, from the guest
//! kernel's `modules.dep`, and the trimmed `modules.dep` that lets busybox `modprobe` find them.

use std::collections::BTreeMap;

/// Modules every initramfs carries, with their dependencies.
pub const DEFAULT_MODULES: &[&str] = &["sch_netem"];

/// Errors reading `modules.dep` or resolving a module.
#[derive(Debug, thiserror::Error)]
pub enum KmodError {
    /// A line without the `path:` prefix.
    #[error("modules.dep line {line}: expected `path.ko: deps...`, found {text:?}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// The guest kernel has no module of that name (it may be built in, or not exist).
    #[error("kernel module {name} is not in modules.dep (built in, or not built for this kernel)")]
    Unknown {
        /// The name asked for.
        name: String,
    },
    /// A module depends on a path modules.dep does not list.
    #[error("module {module} depends on {dependency}, which modules.dep does not list")]
    DanglingDependency {
        /// The module.
        module: String,
        /// The unlisted dependency path.
        dependency: String,
    },
}

/// `modules.dep`: each module's path (relative to `/lib/modules/<version>`) and the paths of
/// the modules it needs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ModulesDep {
    deps: BTreeMap<String, Vec<String>>,
}

impl ModulesDep {
    /// Parses the text of `modules.dep`.
    pub fn parse(text: &str) -> Result<Self, KmodError> {
        let mut deps = BTreeMap::new();
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let (path, rest) = line
                .split_once(':')
                .filter(|(path, _)| !path.trim().is_empty())
                .ok_or_else(|| KmodError::Malformed {
                    line: index + 1,
                    text: line.to_owned(),
                })?;
            deps.insert(
                path.trim().to_owned(),
                rest.split_whitespace().map(str::to_owned).collect(),
            );
        }
        Ok(Self { deps })
    }

    /// The path of module `name` (`-` and `_` are the same, as for modprobe).
    pub fn path_of(&self, name: &str) -> Result<&str, KmodError> {
        let wanted = normalize(name);
        self.deps
            .keys()
            .find(|path| module_name(path) == wanted)
            .map(String::as_str)
            .ok_or_else(|| KmodError::Unknown {
                name: name.to_owned(),
            })
    }

    /// The paths of `names` and everything they depend on, each once, dependencies first
    /// (the order `insmod` would need).
    pub fn closure(&self, names: &[&str]) -> Result<Vec<String>, KmodError> {
        let mut out = Vec::new();
        for name in names {
            let path = self.path_of(name)?.to_owned();
            self.visit(&path, &mut out)?;
        }
        log::debug!("guest modules for {names:?}: {out:?}");
        Ok(out)
    }

    fn visit(&self, path: &str, out: &mut Vec<String>) -> Result<(), KmodError> {
        if out.iter().any(|p| p == path) {
            return Ok(());
        }
        let deps = self
            .deps
            .get(path)
            .ok_or_else(|| KmodError::DanglingDependency {
                module: path.to_owned(),
                dependency: path.to_owned(),
            })?;
        for dep in deps {
            if !self.deps.contains_key(dep) {
                return Err(KmodError::DanglingDependency {
                    module: path.to_owned(),
                    dependency: dep.clone(),
                });
            }
            self.visit(dep, out)?;
        }
        out.push(path.to_owned());
        Ok(())
    }

    /// The `modules.dep` text for a guest that has only `paths` (a closure): their lines,
    /// unchanged.
    pub fn render_subset(&self, paths: &[String]) -> String {
        let mut text = String::new();
        for path in paths {
            let deps = self.deps.get(path).map(Vec::as_slice).unwrap_or_default();
            text.push_str(path);
            text.push(':');
            for dep in deps {
                text.push(' ');
                text.push_str(dep);
            }
            text.push('\n');
        }
        text
    }
}

/// `kernel/net/sched/sch_netem.ko[.xz]` → `sch_netem`.
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.find(".ko").map_or(file, |end| &file[..end]);
    normalize(stem)
}

fn normalize(name: &str) -> String {
    name.replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "\
kernel/net/sched/sch_netem.ko:
kernel/net/sched/cls-fancy.ko: kernel/lib/helper_b.ko kernel/lib/helper_a.ko
kernel/lib/helper_b.ko: kernel/lib/helper_a.ko
kernel/lib/helper_a.ko:
";

    #[test]
    fn closure_puts_dependencies_first_and_each_once() {
        let dep = ModulesDep::parse(DEP).unwrap();
        let paths = dep
            .closure(&["cls_fancy", "sch-netem", "helper_a"])
            .unwrap();
        assert_eq!(
            paths,
            [
                "kernel/lib/helper_a.ko",
                "kernel/lib/helper_b.ko",
                "kernel/net/sched/cls-fancy.ko",
                "kernel/net/sched/sch_netem.ko",
            ]
        );
    }

    #[test]
    fn unknown_module_is_named_in_the_error() {
        let dep = ModulesDep::parse(DEP).unwrap();
        let err = dep.closure(&["sch_nope"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "kernel module sch_nope is not in modules.dep (built in, or not built for this kernel)"
        );
    }

    #[test]
    fn dependency_missing_from_modules_dep_is_an_error() {
        let dep = ModulesDep::parse("kernel/a.ko: kernel/b.ko\n").unwrap();
        assert!(matches!(
            dep.closure(&["a"]),
            Err(KmodError::DanglingDependency { ref dependency, .. }) if dependency == "kernel/b.ko"
        ));
    }

    #[test]
    fn malformed_line_is_reported_with_its_number() {
        let err = ModulesDep::parse("kernel/a.ko:\nno colon here\n").unwrap_err();
        assert!(matches!(err, KmodError::Malformed { line: 2, .. }));
    }

    #[test]
    fn subset_keeps_only_packed_modules_with_their_dependency_lists() {
        let dep = ModulesDep::parse(DEP).unwrap();
        let paths = dep.closure(&["helper_b"]).unwrap();
        assert_eq!(
            dep.render_subset(&paths),
            "kernel/lib/helper_a.ko:\nkernel/lib/helper_b.ko: kernel/lib/helper_a.ko\n"
        );
    }

    #[test]
    fn debian_cloud_kernel_has_sch_netem_as_a_module() {
        let Ok(kernel) = crate::host::KernelInstall::newest() else {
            eprintln!("skipping: no Debian cloud kernel installed");
            return;
        };
        let text = std::fs::read_to_string(kernel.modules.join("modules.dep")).unwrap();
        let dep = ModulesDep::parse(&text).unwrap();
        let paths = dep.closure(DEFAULT_MODULES).unwrap();
        // 6.1 installs `sch_netem.ko`, 6.12 `sch_netem.ko.xz`.
        let last = paths.last().unwrap();
        assert!(
            [".ko", ".ko.xz", ".ko.zst"]
                .iter()
                .any(|ext| last.ends_with(&format!("net/sched/sch_netem{ext}"))),
            "{paths:?}"
        );
        for path in &paths {
            assert!(
                kernel.modules.join(path).is_file(),
                "{path} listed but not installed"
            );
        }
    }
}
