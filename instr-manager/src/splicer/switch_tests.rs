//! [`Splicer::switch`] over the fake kernel of `tests.rs`: one text batch, old splices kept on
//! any failure.

use super::*;

#[test]
fn switch_swaps_one_set_of_splices_for_another_in_one_text_batch() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let old = sp.apply(&[count("f0", Mechanism::Trap)]).unwrap();
    k.state().hits.insert(func_addr("f0") + 5, 3);
    let batches = k.state().batches;
    let (new, hits) = sp.switch(&old, &[count("f1", Mechanism::Trap), count("f2", Mechanism::Trap)]).unwrap();
    assert_eq!(k.state().batches, batches + 1, "removal and application in one batch");
    assert_eq!(hits, vec![super::super::Hits { hits: 3, missed: 0 }]);
    assert_eq!(k.text(func_addr("f0"), 32), FUNC, "the old site is restored");
    for f in ["f1", "f2"] {
        assert_eq!(k.text(func_addr(f) + 5, 2), [0xCD, 0xF5], "{f} is spliced");
    }
    let sites: Vec<u64> = k.state().dispatch.keys().copied().collect();
    assert_eq!(sites, vec![func_addr("f1") + 5, func_addr("f2") + 5]);
    assert_eq!(sp.live().map(|s| s.id).collect::<Vec<_>>(), new);
    // Back to nothing: a plain removal.
    let (none, _) = sp.switch(&new, &[]).unwrap();
    assert!(none.is_empty());
    assert_eq!(k.live_blocks(), 0);
    for f in FUNCS {
        assert_eq!(k.text(func_addr(f), 32), FUNC);
    }
}

#[test]
fn refused_switch_leaves_the_old_splices_live_and_frees_what_it_built() {
    let k = FakeKernel::new();
    k.state().refuse.insert(func_addr("f3") + 5, SiteRefusal::Extable);
    let mut sp = Splicer::new(k.clone());
    let old = sp.apply(&[count("f0", Mechanism::Trap)]).unwrap();
    let blocks = k.live_blocks();
    let batches = k.state().batches;
    let err = sp.switch(&old, &[count("f1", Mechanism::Trap), count("f3", Mechanism::Trap)]).unwrap_err();
    assert!(trapvec::error_chain(&err).starts_with("f3: "), "{err}");
    assert_eq!(k.state().batches, batches, "no text written");
    assert_eq!(k.live_blocks(), blocks);
    assert_eq!(k.text(func_addr("f0") + 5, 2), [0xCD, 0xF5]);
    assert_eq!(k.text(func_addr("f1"), 32), FUNC);
    assert_eq!(sp.live().map(|s| s.id).collect::<Vec<_>>(), old);
}

#[test]
fn switch_refuses_a_site_that_would_change_hands_in_the_batch() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let old = sp.apply(&[count("f0", Mechanism::Trap)]).unwrap();
    let err = sp.switch(&old, &[count("f0+0x5", Mechanism::Trap)]).unwrap_err();
    assert!(matches!(err, SpliceError::AlreadySpliced { .. }), "{err}");
    assert_eq!(sp.live().count(), 1);
    assert!(matches!(sp.switch(&[super::super::SpliceId(99)], &[]), Err(SpliceError::UnknownSplice(99))));
}
