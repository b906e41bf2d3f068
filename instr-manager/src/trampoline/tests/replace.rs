//! Tests of the `replace` entry trampoline (`trampoline/replace.rs`): its bytes, and runs of it
//! in this process.

use super::*;

fn replace_tramp(exit: Option<u64>) -> ReplaceTrampoline {
    ReplaceTrampoline {
        addr: TRAMP,
        hits: HITS,
        inflight: INFLIGHT,
        dest: HANDLER,
        exit,
    }
}

#[test]
fn replace_trampoline_counts_the_task_in_calls_with_one_stack_word_and_counts_it_out() {
    let l = listing(
        &emit_replace_trampoline(&replace_tramp(None), REPLACE_STACK_WORDS).unwrap(),
        TRAMP,
    );
    #[rustfmt::skip]
    let want = vec![
        format!("lock inc qword ptr [{HITS:#x}]"),
        format!("lock inc qword ptr [{INFLIGHT:#x}]"),
        "push qword ptr [rsp+0x8]".to_string(),   // the 7th argument, below our call
        format!("call {HANDLER:#x}"),
        "lea rsp, [rsp+0x8]".into(),
        format!("lock dec qword ptr [{INFLIGHT:#x}]"),
        "ret".into(),
    ];
    assert_eq!(l, want);
}

#[test]
fn kernel_replace_trampoline_leaves_through_the_modules_exit_with_r11_at_its_counter() {
    let exit = TRAMP - 0x40_0000;
    let l = listing(
        &emit_replace_trampoline(&replace_tramp(Some(exit)), 1).unwrap(),
        TRAMP,
    );
    assert_eq!(
        l[4..],
        [
            "lea rsp, [rsp+0x8]".to_string(),
            format!("lea r11, [{INFLIGHT:#x}]"),
            format!("jmp {exit:#x}")
        ]
    );
    assert!(
        !l.iter().any(|x| x.contains("dec") || x == "ret"),
        "nothing runs in the block after the call returns but the lea and jmp: {l:#?}"
    );
}

#[test]
fn replace_trampoline_pads_an_even_number_of_copied_words_to_keep_the_call_aligned() {
    let l = listing(
        &emit_replace_trampoline(&replace_tramp(None), 0).unwrap(),
        TRAMP,
    );
    assert_eq!(
        l[2..5],
        [
            "lea rsp, [rsp-0x8]".to_string(),
            format!("call {HANDLER:#x}"),
            "lea rsp, [rsp+0x8]".into()
        ]
    );
    // Two words: pad, then [rsp+0x18] twice (the 8th argument word, then the 7th).
    let l = listing(
        &emit_replace_trampoline(&replace_tramp(None), 2).unwrap(),
        TRAMP,
    );
    assert_eq!(
        l[2..6],
        [
            "lea rsp, [rsp-0x8]",
            "push qword ptr [rsp+0x18]",
            "push qword ptr [rsp+0x18]",
            &format!("call {HANDLER:#x}")
        ]
    );
    assert_eq!(l[6], "lea rsp, [rsp+0x18]");
    // Three words: no pad.
    let l = listing(
        &emit_replace_trampoline(&replace_tramp(None), 3).unwrap(),
        TRAMP,
    );
    assert_eq!(l[2..5], ["push qword ptr [rsp+0x18]"; 3]);
}

#[test]
fn replace_trampoline_reaches_far_counters_through_r11_and_a_far_replacement_through_a_pointer() {
    let far = 0x7fff_1234_0000;
    let t = ReplaceTrampoline {
        addr: TRAMP,
        hits: far,
        inflight: far + 8,
        dest: HANDLER,
        exit: None,
    };
    let l = listing(&emit_replace_trampoline(&t, 1).unwrap(), TRAMP);
    assert_eq!(
        l[..4],
        [
            format!("mov r11, {far:#x}"),
            "lock inc qword ptr [r11]".into(),
            format!("mov r11, {:#x}", far + 8),
            "lock inc qword ptr [r11]".into()
        ]
    );
    assert_eq!(
        l[l.len() - 3..],
        [
            format!("mov r11, {:#x}", far + 8),
            "lock dec qword ptr [r11]".into(),
            "ret".into()
        ]
    );

    let t = ReplaceTrampoline {
        dest: far,
        ..replace_tramp(None)
    };
    let out = emit_replace_trampoline(&t, 1).unwrap();
    let d = decode(&out, TRAMP);
    let call = d
        .iter()
        .find(|i| i.is_call_near_indirect())
        .unwrap_or_else(|| panic!("{:#?}", listing(&out, TRAMP)));
    assert!(call.is_ip_rel_memory_operand());
    let off = usize::try_from(call.ip_rel_memory_address() - TRAMP).unwrap();
    assert_eq!(
        u64::from_le_bytes(out[off..off + 8].try_into().unwrap()),
        far
    );
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod run_replace {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    static COUNTER_ADDR: AtomicU64 = AtomicU64::new(0);
    static SEEN_INFLIGHT: AtomicU64 = AtomicU64::new(0);
    static SEEN_ALIGN: AtomicU64 = AtomicU64::new(1);

    #[inline(never)]
    extern "C" fn replacement(a: u64, b: u64, c: u64, d: u64, e: u64, f: u64, g: u64) -> u64 {
        let counter = COUNTER_ADDR.load(Ordering::SeqCst) as *const u64;
        // SAFETY: the test stores the address of the in-flight counter, in a mapping that
        // lives until after every call.
        SEEN_INFLIGHT.store(unsafe { counter.read_volatile() }, Ordering::SeqCst);
        let here = 0u128;
        SEEN_ALIGN.store(std::ptr::addr_of!(here) as u64 % 16, Ordering::SeqCst);
        a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g
    }

    /// Both ways out (inline `lock dec; ret`, and the kernel's shape: `jmp exit` to a stub that
    /// decrements through r11), run for real as a 7-argument function.
    #[test]
    fn replace_trampoline_runs_with_seven_arguments_and_counts_the_task_out() {
        const PAGE: usize = 4096;
        // SAFETY: an anonymous private mapping; no existing memory is affected.
        let mem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(mem, libc::MAP_FAILED);
        let base = mem as u64;
        let (inline_at, kernel_at, exit_at) = (base, base + 0x100, base + 0x200);
        let (hits, inflight) = (base + PAGE as u64, base + PAGE as u64 + 8);
        let dest =
            replacement as extern "C" fn(u64, u64, u64, u64, u64, u64, u64) -> u64 as usize as u64;
        let t = ReplaceTrampoline {
            addr: inline_at,
            hits,
            inflight,
            dest,
            exit: None,
        };
        let inline = emit_replace_trampoline(&t, REPLACE_STACK_WORDS).unwrap();
        let t = ReplaceTrampoline {
            addr: kernel_at,
            exit: Some(exit_at),
            ..t
        };
        let kernel = emit_replace_trampoline(&t, REPLACE_STACK_WORDS).unwrap();
        let exit = [0xF0, 0x49, 0xFF, 0x0B, 0xC3]; // lock dec qword [r11]; ret
                                                   // SAFETY: every write stays inside the first page of the mapping made above (each piece
                                                   // is under 0x100 bytes at its own 0x100 offset); nothing refers to it yet.
        unsafe {
            let p = mem.cast::<u8>();
            std::ptr::copy_nonoverlapping(inline.as_ptr(), p, inline.len());
            std::ptr::copy_nonoverlapping(kernel.as_ptr(), p.add(0x100), kernel.len());
            std::ptr::copy_nonoverlapping(exit.as_ptr(), p.add(0x200), exit.len());
            assert_eq!(
                libc::mprotect(mem, PAGE, libc::PROT_READ | libc::PROT_EXEC),
                0
            );
        }
        COUNTER_ADDR.store(inflight, Ordering::SeqCst);
        for at in [inline_at, kernel_at] {
            // SAFETY: the page holds a trampoline that behaves as a function with the C ABI of
            // `replacement` (it calls it with the same registers and stack word).
            let f: extern "C" fn(u64, u64, u64, u64, u64, u64, u64) -> u64 =
                unsafe { std::mem::transmute(usize::try_from(at).unwrap()) };
            assert_eq!(
                f(1, 10, 100, 1000, 10_000, 100_000, 1_000_000),
                1 + 20 + 300 + 4000 + 50_000 + 600_000 + 7_000_000
            );
            assert_eq!(
                SEEN_INFLIGHT.load(Ordering::SeqCst),
                1,
                "counted in while the replacement runs"
            );
            assert_eq!(
                SEEN_ALIGN.load(Ordering::SeqCst),
                0,
                "a 16-aligned local: rsp was aligned at the call"
            );
        }
        // SAFETY: the counters are in the second, still writable page of the mapping.
        let (h, i) = unsafe { (*(hits as *const u64), *(inflight as *const u64)) };
        assert_eq!((h, i), (2, 0));
        // SAFETY: the mapping is ours and no longer used.
        unsafe { libc::munmap(mem, 2 * PAGE) };
    }
}
