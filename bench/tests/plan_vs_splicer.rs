//! `plan` agrees with what the splicer actually does: every instruction boundary of the
//! hand-assembled fixture, built as a shared object and loaded into this process, is planned by
//! bench from the file and then spliced for real through the process backend; a point `plan`
//! calls spliceable by a mechanism is spliced by it (with the predicted patch: 5-byte `jmp rel32`
//! or 2-byte `jmp rel8` to a springboard), and one it refuses is refused.

mod common;

use bench::coverage::{plan_function, JmpKind, DISTANCES};
use bench::fixtures::{dlopen, Fixture};
use instr_manager::image::CodeImage;
use instr_manager::session::{Session, SessionError};
use instr_manager::splicer::SpliceError;
use instr_manager::Mechanism;

#[test]
fn plan_agrees_with_the_splicer_at_every_boundary_of_the_fixture() {
    let b = common::build();
    let so = b.path("libknown.so");
    let img = CodeImage::from_path(&so).unwrap();
    assert!(!img.kernel);
    let _lib = dlopen(&so).unwrap();
    let fx = Fixture::build().unwrap();
    let session = Session::open().unwrap();
    session.refresh_symbols().unwrap();
    let comp = session.load(&fx.handler).unwrap();

    let (mut checked, mut trap_ok, mut jmp_kinds) = (0, 0, [0usize; 3]);
    for (fi, f) in img.functions.iter().enumerate() {
        let mut points = Vec::new();
        plan_function(&img, fi, &DISTANCES[..1], |p| points.push(p));
        for p in points {
            let at = format!("{}+{}", f.name, p.site - f.start);
            let a = p.at[0];

            let trap = session.splice_call(&at, &comp, "empty_handler", Mechanism::Trap);
            match (&a.trap, trap) {
                (Ok(()), Ok(h)) => {
                    trap_ok += 1;
                    drop(h);
                }
                (Err(_), Err(SessionError::Splice(SpliceError::Refused { .. }))) => {}
                (want, Ok(_)) => panic!("{at}: plan says trap {want:?}, the splicer spliced it"),
                (want, Err(e)) => panic!(
                    "{at}: plan says trap {want:?}, the splicer: {}",
                    trapvec::error_chain(&e)
                ),
            }

            let jmp = session.splice_call(&at, &comp, "empty_handler", Mechanism::Jmp);
            match (a.jmp, jmp) {
                (JmpKind::Impossible, Err(SessionError::Splice(SpliceError::Refused { .. }))) => {
                    jmp_kinds[2] += 1
                }
                (JmpKind::Impossible, r) => panic!(
                    "{at}: plan says jmp is impossible ({:?}), the splicer: {:?}",
                    a.jmp_refusal,
                    r.map(|h| h.id())
                ),
                (kind, Ok(h)) => {
                    let patch = session
                        .with(|s| {
                            s.get(h.id())
                                .map(|l| (l.plan.patch_len, l.plan.springboard.is_some()))
                        })
                        .unwrap();
                    let want = if kind == JmpKind::Rel32 {
                        (5, false)
                    } else {
                        (2, true)
                    };
                    assert_eq!(patch, want, "{at}: plan says {kind:?}");
                    jmp_kinds[usize::from(kind == JmpKind::Rel8Springboard)] += 1;
                    drop(h);
                }
                (kind, Err(e)) => panic!(
                    "{at}: plan says {kind:?}, the splicer refused: {}",
                    trapvec::error_chain(&e)
                ),
            }
            checked += 1;
        }
    }
    // f_lengths 8 + f_short 2 + f_loop 5 + f_end 1 boundaries.
    assert_eq!(checked, 16);
    assert_eq!(trap_ok, 12, "all but the three final 1-byte rets and f_end");
    assert!(
        jmp_kinds[0] > 0 && jmp_kinds[1] > 0 && jmp_kinds[2] > 0,
        "every jmp outcome is exercised: {jmp_kinds:?}"
    );
}
