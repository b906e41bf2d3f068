//! The loader never panics: random bytes, truncations and byte mutations of real components are
//! loaded into the fake target; each attempt either loads (and then unloads cleanly) or fails
//! with an error, leaving no live allocation.

mod common;

use std::sync::OnceLock;

use common::{compile, FakeTarget};
use component_manager::{ComponentManager, LoadOptions, NoExtra};
use proptest::prelude::*;
use trapvec::SymbolKind;

const NEAR: u64 = 0x5555_5555_0000;

/// Real objects to mutate: plain, PIC (GOT relocations), a far call (stub), function pointers.
fn seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        vec![
            compile("basic.c", &[]),
            compile("got.c", &["-fPIC"]),
            compile("far_call.c", &[]),
            compile("table.c", &[]),
            compile("orig.c", &[]),
        ]
    })
}

fn target() -> FakeTarget {
    FakeTarget::new(&[
        ("target_fn", NEAR + 0x1000, SymbolKind::Function),
        ("ext_fn", NEAR + 0x2000, SymbolKind::Function),
        ("ext_var", NEAR + 0x4000, SymbolKind::Object),
        ("puts", 0x7fff_f7a5_0e50, SymbolKind::Function),
        ("__trapvec_orig_compute", NEAR + 0x3000, SymbolKind::Function),
    ])
}

/// Load `bytes`; on success unload again. Either way nothing may stay allocated.
fn load_and_unload(bytes: &[u8]) -> Result<(), TestCaseError> {
    let (mut m, mut t) = (ComponentManager::new(), target());
    let opts = LoadOptions { near: NEAR, ..LoadOptions::default() };
    match m.load_bytes(&mut t, "fuzz", bytes, &opts, &mut NoExtra) {
        Ok(id) => {
            m.verify(&t, id).map_err(|e| TestCaseError::fail(e.to_string()))?;
            m.unload(&mut t, id).map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        Err(e) => prop_assert!(!e.to_string().is_empty()),
    }
    prop_assert_eq!(t.live(), 0);
    prop_assert_eq!(t.allocs, t.frees);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        load_and_unload(&bytes)?;
    }

    #[test]
    fn random_bytes_behind_a_valid_header_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..4096), seed in 0usize..5) {
        let mut bytes = seeds()[seed][..64].to_vec();
        bytes.extend_from_slice(&tail);
        load_and_unload(&bytes)?;
    }

    #[test]
    fn truncated_components_never_panic(seed in 0usize..5, cut in any::<prop::sample::Index>()) {
        let bytes = &seeds()[seed];
        load_and_unload(&bytes[..cut.index(bytes.len())])?;
    }

    #[test]
    fn mutated_components_never_panic(
        seed in 0usize..5,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..12),
    ) {
        let mut bytes = seeds()[seed].clone();
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        load_and_unload(&bytes)?;
    }
}

#[test]
fn every_seed_loads_unmutated() {
    for bytes in seeds() {
        let (mut m, mut t) = (ComponentManager::new(), target());
        let opts = LoadOptions { near: NEAR, ..LoadOptions::default() };
        let id = m.load_bytes(&mut t, "seed", bytes, &opts, &mut NoExtra).unwrap();
        m.unload(&mut t, id).unwrap();
    }
}
