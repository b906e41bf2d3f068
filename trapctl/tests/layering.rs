//! trapctl is a front end beside trapd, not on top of it (DESIGN.md: dependencies point one
//! way, front ends share only `trapvec-proto`): no table of trapctl's manifest, tests included,
//! names the daemon crate, nor does any crate it links (read from Cargo.lock). Its tests run a
//! fake daemon behind `trapvec_proto::server`.

#[test]
fn trapctl_does_not_depend_on_trapd_not_even_in_its_tests() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let manifest: toml::Table = toml::from_str(&text).unwrap();
    let mut tables = Vec::new();
    for key in ["dependencies", "dev-dependencies", "build-dependencies"] {
        tables.extend(manifest.get(key).and_then(|t| t.as_table()));
    }
    if let Some(targets) = manifest.get("target").and_then(|t| t.as_table()) {
        for t in targets.values().filter_map(|t| t.as_table()) {
            for key in ["dependencies", "dev-dependencies", "build-dependencies"] {
                tables.extend(t.get(key).and_then(|t| t.as_table()));
            }
        }
    }
    assert!(!tables.is_empty(), "{path}: no dependency table found");
    for table in tables {
        for (name, spec) in table {
            let package = spec.get("package").and_then(|p| p.as_str()).unwrap_or(name);
            assert_ne!(package, "trapd", "{path}: `{name}` is the daemon crate");
        }
    }
}

/// The dependency closure of `package` in the workspace's Cargo.lock (normal, build and dev
/// dependencies alike: the lock file does not tell them apart), `package` itself included.
fn closure(lock: &toml::Table, package: &str) -> std::collections::BTreeSet<String> {
    let packages = lock["package"]
        .as_array()
        .expect("Cargo.lock's [[package]] list");
    let deps_of = |name: &str| -> Vec<String> {
        packages
            .iter()
            .filter(|p| p["name"].as_str() == Some(name))
            .flat_map(|p| {
                p.get("dependencies")
                    .and_then(|d| d.as_array())
                    .into_iter()
                    .flatten()
            })
            // "name", or "name version" where several versions are locked.
            .filter_map(|d| d.as_str()?.split(' ').next().map(str::to_string))
            .collect()
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = vec![package.to_string()];
    while let Some(name) = todo.pop() {
        if seen.insert(name.clone()) {
            todo.extend(deps_of(&name));
        }
    }
    seen
}

#[test]
fn nothing_trapctl_links_depends_on_trapd_either() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock");
    let lock: toml::Table = toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    // The closure is read right: the fuzz harnesses do link trapd (they feed its protocol), and
    // trapctl links the operations layer and the shared protocol.
    assert!(closure(&lock, "trapvec-fuzz").contains("trapd"));
    let linked = closure(&lock, "trapctl");
    for crate_ in ["instr-manager", "trapvec-proto", "trapvec", "serde_json"] {
        assert!(linked.contains(crate_), "{crate_} not found in {linked:?}");
    }
    let through: Vec<String> = linked
        .iter()
        .filter(|d| *d != "trapctl" && closure(&lock, d).contains("trapd"))
        .cloned()
        .collect();
    assert!(
        through.is_empty(),
        "trapctl links trapd through {through:?}"
    );
}
