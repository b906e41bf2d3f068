//! [`Splicer::switch`] over the fake kernel of `tests.rs`: one text batch, old splices kept on
//! any failure.

use super::*;
use crate::splicer::Handovers;

#[test]
fn switch_swaps_one_set_of_splices_for_another_in_one_text_batch() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let old = sp.apply(&[count("f0", Mechanism::Trap)]).unwrap();
    k.state().hits.insert(func_addr("f0") + 5, 3);
    let batches = k.state().batches;
    let (new, hits) = sp
        .switch(
            &old,
            &[count("f1", Mechanism::Trap), count("f2", Mechanism::Trap)],
        )
        .unwrap();
    assert_eq!(
        k.state().batches,
        batches + 1,
        "removal and application in one batch"
    );
    assert_eq!(hits, vec![super::super::Hits { hits: 3, missed: 0 }]);
    assert_eq!(
        k.text(func_addr("f0"), 32),
        FUNC,
        "the old site is restored"
    );
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
    k.state()
        .refuse
        .insert(func_addr("f3") + 5, SiteRefusal::Extable);
    let mut sp = Splicer::new(k.clone());
    let old = sp.apply(&[count("f0", Mechanism::Trap)]).unwrap();
    let blocks = k.live_blocks();
    let batches = k.state().batches;
    let err = sp
        .switch(
            &old,
            &[count("f1", Mechanism::Trap), count("f3", Mechanism::Trap)],
        )
        .unwrap_err();
    assert!(trapvec::error_chain(&err).starts_with("f3: "), "{err}");
    assert_eq!(k.state().batches, batches, "no text written");
    assert_eq!(k.live_blocks(), blocks);
    assert_eq!(k.text(func_addr("f0") + 5, 2), [0xCD, 0xF5]);
    assert_eq!(k.text(func_addr("f1"), 32), FUNC);
    assert_eq!(sp.live().map(|s| s.id).collect::<Vec<_>>(), old);
}

/// Trap to trap, a site changes hands in place: its trap stays (no text for it in the batch),
/// its dispatch entry is replaced, the old splice's final count comes back and its code is
/// freed. A batch refused after the replacement puts the old entry back, counting on.
#[test]
fn a_trap_site_changes_hands_in_place_and_gets_its_old_entry_back_when_the_batch_is_refused() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let site = func_addr("f0") + 5;
    let old = sp.apply(&[count("f0", Mechanism::Trap)]).unwrap();
    let old_entry = k.state().dispatch[&site];
    let (text, blocks) = (k.text(func_addr("f0"), 32), k.live_blocks());
    k.state().hits.insert(site, 3);
    let batches = k.state().batches;
    let mut only = count("f0", Mechanism::Trap);
    only.options.only.tgid = Some(42);
    let add = [only, count("f1", Mechanism::Trap)];
    assert_eq!(
        sp.handovers(&old, &add).unwrap(),
        Handovers {
            in_place: old.clone(),
            out_first: vec![]
        }
    );
    let (new, hits) = sp.switch(&old, &add).unwrap();
    assert_eq!(
        hits,
        vec![super::super::Hits { hits: 3, missed: 0 }],
        "the old entry's final count"
    );
    let state = k.state();
    assert_eq!(
        (state.batches, state.replaced),
        (batches + 1, 1),
        "one batch (f1), one replacement (f0)"
    );
    let entry = state.dispatch[&site];
    assert_eq!(state.hits[&site], 0, "the new entry counts from zero");
    drop(state);
    assert_eq!(entry.only.map(|o| o.tgid), Some(Some(42)));
    assert_ne!(entry.dest, old_entry.dest, "the new splice's code");
    assert_eq!(
        k.text(func_addr("f0"), 32),
        text,
        "f0's trap and bytes never changed"
    );
    assert!(k.trapped("f1"));
    assert_eq!(
        k.live_blocks(),
        2 * blocks,
        "the old splice's blocks freed, two splices' held"
    );
    assert_eq!(sp.live().map(|s| s.id).collect::<Vec<_>>(), new);

    // Back to a plain count of f0 and f2 in a batch the target refuses: f0's tgid 42 entry is
    // back with its count, f2 untouched, nothing built is left.
    k.state().hits.insert(site, 5);
    k.state().refuse_next_batch = Some("the batch is refused".into());
    let err = sp
        .switch(
            &new,
            &[count("f0", Mechanism::Trap), count("f2", Mechanism::Trap)],
        )
        .unwrap_err();
    assert!(
        trapvec::error_chain(&err).contains("the batch is refused"),
        "{err}"
    );
    let state = k.state();
    assert_eq!(
        (state.dispatch[&site], state.hits[&site], state.replaced),
        (entry, 5, 3),
        "replaced, then put back counting on"
    );
    drop(state);
    assert!(!k.trapped("f2") && k.trapped("f1"));
    assert_eq!(k.live_blocks(), 2 * blocks);
    assert_eq!(sp.live().map(|s| s.id).collect::<Vec<_>>(), new);
    sp.remove_all().unwrap();
    assert!(k.pristine());
}

/// Any other change of hands goes through the original bytes, which one batch cannot: the
/// switch refuses it, and `handovers` says to take the old splice out first.
#[test]
fn switch_refuses_a_site_that_would_change_mechanism_in_the_batch() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let old = sp.apply(&[count("f0", Mechanism::Trap)]).unwrap();
    let add = [count("f0+0x5", Mechanism::Jmp)];
    assert_eq!(
        sp.handovers(&old, &add).unwrap(),
        Handovers {
            in_place: vec![],
            out_first: old.clone()
        }
    );
    let err = sp.switch(&old, &add).unwrap_err();
    assert!(matches!(err, SpliceError::AlreadySpliced { .. }), "{err}");
    assert_eq!(sp.live().count(), 1);
    assert!(k.trapped("f0"));
    assert!(matches!(
        sp.switch(&[super::super::SpliceId(99)], &[]),
        Err(SpliceError::UnknownSplice(99))
    ));
}
