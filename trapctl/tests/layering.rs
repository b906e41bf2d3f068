//! trapctl is a front end beside trapd, not on top of it (DESIGN.md: dependencies point one
//! way, front ends share only `trapvec-proto`): no table of trapctl's manifest, tests included,
//! names the daemon crate. Its tests run a fake daemon behind `trapvec_proto::server`.

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
