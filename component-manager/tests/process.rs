//! End to end in the running test process: a component is loaded into the process's own
//! repository (trapvec::process) and its functions are called through their addresses.

mod common;

use component_manager::{ComponentManager, LoadOptions, NoExtra};
use trapvec::process::ProcessTarget;
use trapvec::Target;

/// Called by the component: a symbol of the test executable, found in its `.symtab`.
#[no_mangle]
pub extern "C" fn cm_e2e_host_add(a: i32, b: i32) -> i32 {
    a + b
}

#[test]
fn component_loaded_into_this_process_runs_calling_the_executable_and_libc() {
    let host =
        std::hint::black_box(cm_e2e_host_add as extern "C" fn(i32, i32) -> i32) as usize as u64;
    let bytes = common::compile("e2e.c", &[]);
    let mut t = ProcessTarget::new().unwrap();
    assert_eq!(
        t.symbols().lookup("cm_e2e_host_add").map(|s| s.addr),
        Some(host)
    );
    let mut m = ComponentManager::new();
    let opts = LoadOptions {
        near: host,
        ..LoadOptions::default()
    };
    let id = m
        .load_bytes(&mut t, "e2e", &bytes, &opts, &mut NoExtra)
        .unwrap();
    m.verify(&t, id).unwrap();
    let c = m.get(id).unwrap().clone();
    assert!(
        c.code_addr.abs_diff(host) < 1 << 31,
        "the code block is within rel32 reach of the executable"
    );
    let atoi = t.symbols().lookup("atoi").unwrap().addr;
    if atoi.abs_diff(c.code_addr) >= 1 << 31 {
        assert_eq!(
            c.stubs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["atoi"],
            "libc is far: called through a stub"
        );
    }

    let combine = c.symbol("combine").unwrap().addr;
    let calls = c.symbol("combine_calls").unwrap().addr;
    // SAFETY: both addresses are functions of the component just loaded, sealed executable, with
    // these C signatures (tests/fixtures/e2e.c); the component stays loaded while they run.
    let (combine, calls) = unsafe {
        (
            std::mem::transmute::<usize, extern "C" fn(i32, i32) -> i32>(
                usize::try_from(combine).unwrap(),
            ),
            std::mem::transmute::<usize, extern "C" fn() -> i32>(usize::try_from(calls).unwrap()),
        )
    };
    assert_eq!(combine(2, 3), 57);
    assert_eq!(combine(40, 2), 427);
    assert_eq!(calls(), 2);

    m.unload(&mut t, id).unwrap();
    assert_eq!(t.live_blocks(), 0);
}
