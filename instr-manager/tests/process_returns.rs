//! Return points and timers in this process (`when = return`, action `time`): real functions
//! (C++, built at test time into a shared object loaded here) with several returns, a tail call,
//! recursion, `longjmp` out of a call and an exception thrown through calls; handlers from a real
//! component check each return value against the entry's arguments. Exact counts, results and
//! restored bytes are checked, by trap and by jmp.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use instr_manager::session::{ComponentHandle, Session, SessionError};
use instr_manager::splicer::SpliceError;
use instr_manager::Mechanism::{Jmp, Trap};
use trapvec::returns::{bucket_of, Clock};
use trapvec::Target;

mod common;

use common::{compile_component, fixture_source, serial, session_with};

struct Fixture {
    handlers: PathBuf,
}

/// Build `returns.cc` with g++ (bind now: no lazy PLT resolution under a test) and load it for
/// good, its symbols global.
fn load_cxx(src: &Path, so: &Path) {
    let out = Command::new("g++")
        .args(["-O2", "-shared", "-fPIC", "-Wl,-z,now", "-o"])
        .arg(so)
        .arg(src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: loading a library we just built; it stays loaded.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!h.is_null());
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        load_cxx(&fixture_source("returns.cc"), &dir.join("libreturns.so"));
        let handlers = dir.join("return_handlers.o");
        compile_component(&fixture_source("return_handlers.c"), &handlers);
        Fixture { handlers }
    })
}

fn session() -> (Session, ComponentHandle) {
    session_with(&fixture().handlers)
}

fn addr(s: &Session, name: &str) -> u64 {
    s.with(|sp| {
        sp.target()
            .symbols()
            .lookup(name)
            .unwrap_or_else(|| panic!("no symbol {name}"))
            .addr
    })
}

fn f_int(s: &Session, name: &str) -> extern "C" fn(i32) -> i32 {
    // SAFETY: the fixture functions named here have the C signature `int f(int)`.
    unsafe { std::mem::transmute(usize::try_from(addr(s, name)).unwrap()) }
}

fn f_long(s: &Session, name: &str) -> extern "C" fn(i64) -> i64 {
    // SAFETY: `long f(long)`.
    unsafe { std::mem::transmute(usize::try_from(addr(s, name)).unwrap()) }
}

fn bytes(s: &Session, name: &str, len: usize) -> Vec<u8> {
    let a = addr(s, name);
    s.with(|sp| sp.target().read(a, len).unwrap())
}

fn var(c: &ComponentHandle, name: &str) -> i64 {
    let a = c.symbol(name).unwrap();
    // SAFETY: a `long` variable of the loaded component.
    unsafe { std::ptr::read_volatile(a as *const i64) }
}

fn reset(c: &ComponentHandle) {
    for name in ["calls", "bad", "last_arg", "last_ret"] {
        let a = c.symbol(name).unwrap();
        // SAFETY: a `long` variable of the loaded component; no splice runs its handlers now.
        unsafe { std::ptr::write_volatile(a as *mut i64, 0) };
    }
}

fn multi(x: i32) -> i32 {
    match x {
        x if x < 0 => -1,
        0 => 100,
        x if x > 1000 => x / 3,
        x => x * 2,
    }
}

#[test]
fn a_function_with_several_returns_reports_each_return_value_with_its_argument() {
    let _g = serial();
    for mech in [Trap, Jmp] {
        let (s, c) = session();
        reset(&c);
        let before = bytes(&s, "rp_multi", 16);
        let f = f_int(&s, "rp_multi");
        let h = s
            .splice_return("rp_multi", &c, "on_multi", 0, None, mech)
            .unwrap();
        let inputs = [-5, 0, 7, 2000, 1, -1, 999, 3001];
        for &x in &inputs {
            assert_eq!(f(x), multi(x), "{mech}: rp_multi({x})");
        }
        let st = h.return_stats().unwrap().unwrap();
        assert_eq!((st.returns, st.missed, st.active), (8, 0, 0), "{mech}");
        assert_eq!(h.hits().unwrap(), 8);
        assert_eq!(
            (var(&c, "calls"), var(&c, "bad")),
            (8, 0),
            "{mech}: every return value matched its argument"
        );
        assert_eq!((var(&c, "last_arg"), var(&c, "last_ret")), (3001, 1000));
        h.remove().unwrap();
        assert_eq!(
            bytes(&s, "rp_multi", 16),
            before,
            "{mech}: the original bytes are back"
        );
        assert_eq!(f(7), 14);
        assert_eq!(var(&c, "calls"), 8, "no handler after removal");
    }
}

#[test]
fn a_return_handler_may_change_the_return_value() {
    let _g = serial();
    let (s, c) = session();
    let f = f_int(&s, "rp_multi");
    let h = s
        .splice_return("rp_multi", &c, "plus_thousand", 0, None, Jmp)
        .unwrap();
    assert_eq!(f(21), 1042);
    assert_eq!(f(-3), 999);
    drop(h);
    assert_eq!(f(21), 42);
}

#[test]
fn a_tail_call_returns_through_the_stub_with_the_callees_value() {
    let _g = serial();
    let (s, c) = session();
    // The odd path leaves rp_tail by `jmp` (to rp_leaf or its PLT entry), never by its own ret.
    let tail = addr(&s, "rp_tail");
    let code = bytes(&s, "rp_tail", 24);
    let jmps = (0..code.len() - 4).filter(|&i| code[i] == 0xe9).count();
    assert!(
        jmps >= 1,
        "no tail jmp in rp_tail at {tail:#x}: {code:02x?}"
    );
    reset(&c);
    let f = f_int(&s, "rp_tail");
    let h = s
        .splice_return("rp_tail", &c, "on_tail", 0, None, Trap)
        .unwrap();
    for x in [1, 2, 3, 10, 11] {
        assert_eq!(f(x), if x & 1 == 1 { x * 3 + 7 } else { x - 1 });
    }
    let st = h.return_stats().unwrap().unwrap();
    assert_eq!((st.returns, st.missed), (5, 0));
    assert_eq!((var(&c, "calls"), var(&c, "bad")), (5, 0));
    assert_eq!((var(&c, "last_arg"), var(&c, "last_ret")), (11, 40));
}

/// Calls of fib(n) made by fib(n) itself included.
fn fib_calls(n: i64) -> u64 {
    if n < 2 {
        1
    } else {
        1 + fib_calls(n - 1) + fib_calls(n - 2)
    }
}

#[test]
fn recursion_in_four_threads_sees_every_return_exactly() {
    let _g = serial();
    for mech in [Trap, Jmp] {
        let (s, c) = session();
        reset(&c);
        let f = f_long(&s, "rp_fib");
        // Four threads, each at most 16 deep: 64 calls in progress at once at most.
        let h = s
            .splice_return("rp_fib", &c, "on_fib", 0, Some(64), mech)
            .unwrap();
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(move || (0..5).map(|_| f(15)).collect::<Vec<_>>()))
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), vec![610; 5]);
        }
        let n = 20 * fib_calls(15);
        let st = h.return_stats().unwrap().unwrap();
        assert_eq!((st.returns, st.missed, st.active), (n, 0, 0), "{mech}");
        assert_eq!(h.hits().unwrap(), n);
        assert_eq!(
            (var(&c, "calls"), var(&c, "bad")),
            (i64::try_from(n).unwrap(), 0),
            "{mech}: each return value is fib of its argument"
        );
    }
}

#[test]
fn calls_beyond_maxactive_are_counted_missed_and_still_return_right() {
    let _g = serial();
    let (s, c) = session();
    reset(&c);
    let f = f_long(&s, "rp_fib");
    // fib(10) is 10 calls deep at most: the 4 outermost take instances, the deeper ones miss.
    let h = s
        .splice_return("rp_fib", &c, "on_fib", 0, Some(4), Trap)
        .unwrap();
    assert_eq!(f(10), 55);
    let st = h.return_stats().unwrap().unwrap();
    assert_eq!(st.returns + st.missed, fib_calls(10));
    assert!(st.missed > 0 && st.returns >= 4, "{st:?}");
    assert_eq!(st.active, 0);
    assert_eq!(
        (u64::try_from(var(&c, "calls")).unwrap(), var(&c, "bad")),
        (st.returns, 0)
    );
}

#[test]
fn longjmp_out_of_a_call_is_counted_missed_and_the_pool_is_not_used_up() {
    let _g = serial();
    let (s, _c) = session();
    let try_jump = f_int(&s, "rp_try_jump");
    // Only the function left by longjmp: its instance is found over at the next call.
    let jumper = s.count_returns("rp_jumper", Some(1), Trap).unwrap();
    for _ in 0..500 {
        assert_eq!(try_jump(10), -2);
    }
    let st = jumper.return_stats().unwrap().unwrap();
    assert_eq!(
        (st.returns, st.missed),
        (0, 499),
        "each left call is dropped when the next one comes: {st:?}"
    );
    assert_eq!(
        st.active, 1,
        "the last one waits for the next entry: {st:?}"
    );
    assert_eq!(try_jump(1), 2);
    let st = jumper.return_stats().unwrap().unwrap();
    assert_eq!(jumper.hits().unwrap(), 501);
    assert_eq!((st.returns, st.missed, st.active), (1, 500, 0), "{st:?}");
    // With the caller spliced too, its return drops the left call at once.
    let outer = s.count_returns("rp_try_jump", None, Jmp).unwrap();
    assert_eq!(try_jump(10), -2);
    assert_eq!(try_jump(3), 4);
    let (o, j) = (
        outer.return_stats().unwrap().unwrap(),
        jumper.return_stats().unwrap().unwrap(),
    );
    assert_eq!((o.returns, o.missed, o.active), (2, 0, 0), "{o:?}");
    assert_eq!((j.returns, j.missed, j.active), (2, 501, 0), "{j:?}");
}

#[test]
fn an_exception_thrown_through_calls_with_pending_returns_finds_its_handler() {
    let _g = serial();
    let (s, _c) = session();
    let catch = f_int(&s, "rp_catch");
    let through = s.count_returns("rp_through", None, Trap).unwrap();
    let thrower = s.count_returns("rp_thrower", None, Jmp).unwrap();
    // Thrown in rp_thrower, through rp_through (both return addresses hijacked), caught above.
    assert_eq!(catch(9), -9);
    assert_eq!(catch(2), 16);
    assert_eq!(catch(40), -40);
    assert_eq!(catch(0), 12);
    let (t, r) = (
        through.return_stats().unwrap().unwrap(),
        thrower.return_stats().unwrap().unwrap(),
    );
    assert_eq!((through.hits().unwrap(), thrower.hits().unwrap()), (4, 4));
    // Each left call is dropped at the next call of the same function: all but the last.
    assert_eq!((t.returns, t.missed, t.active), (2, 2, 0), "{t:?}");
    assert_eq!((r.returns, r.missed, r.active), (2, 2, 0), "{r:?}");
}

#[test]
fn a_float_result_survives_a_handler_that_clobbers_vector_registers() {
    let _g = serial();
    let (s, c) = session();
    reset(&c);
    // SAFETY: `double rp_float(double)`.
    let f: extern "C" fn(f64) -> f64 =
        unsafe { std::mem::transmute(usize::try_from(addr(&s, "rp_float")).unwrap()) };
    let h = s
        .splice_return("rp_float", &c, "clobber_vectors", 0, None, Trap)
        .unwrap();
    assert_eq!(f(3.0), 4.5);
    assert_eq!(f(-0.5), -0.75);
    assert_eq!(var(&c, "calls"), 2);
    drop(h);
}

#[test]
fn a_timer_puts_each_call_in_its_log2_bucket() {
    let _g = serial();
    let (s, _c) = session();
    // SAFETY: `int usleep(useconds_t)` of libc, called through its address like any function.
    let usleep: extern "C" fn(u32) -> i32 =
        unsafe { std::mem::transmute(usize::try_from(addr(&s, "usleep")).unwrap()) };
    let t = s.time("usleep", Clock::Wall, Jmp).unwrap();
    for _ in 0..3 {
        assert_eq!(usleep(1_000), 0);
    }
    for _ in 0..2 {
        assert_eq!(usleep(20_000), 0);
    }
    let st = t.return_stats().unwrap().unwrap();
    let h = st.histogram.unwrap();
    assert_eq!((st.returns, st.missed, h.count()), (5, 0, 5));
    // A sleep lasts at least what it asks for, and on a busy machine a few ms more: the 1 ms
    // calls land from [1M, 2M) ns up to below the 20 ms calls' bucket, [16M, 32M), where the
    // 20 ms calls land (or one later).
    let ms1 = bucket_of(1_000_000);
    let ms20 = bucket_of(20_000_000);
    assert_eq!(h.buckets[..ms1].iter().sum::<u64>(), 0, "{}", h.render());
    assert_eq!(
        h.buckets[ms1..ms20].iter().sum::<u64>(),
        3,
        "{}",
        h.render()
    );
    assert_eq!(h.buckets[ms20] + h.buckets[ms20 + 1], 2, "{}", h.render());
    assert!(h.max >= 20_000_000 && h.sum >= 43_000_000, "{h:?}");
    assert!(
        (1_000_000..16_000_000).contains(&h.percentile(50.0)),
        "p50 is a 1 ms call: {}",
        h.render()
    );
    assert!(h.percentile(99.0) >= 20_000_000, "p99 is a 20 ms call");
    drop(t);
    // A cpu-clock timer of the same sleeps sees almost nothing: the thread was off CPU.
    let t = s.time("usleep", Clock::Cpu, Trap).unwrap();
    assert_eq!(usleep(20_000), 0);
    let h = t.return_stats().unwrap().unwrap().histogram.unwrap();
    assert_eq!(h.count(), 1);
    assert!(h.max < 5_000_000, "cpu time of a 20 ms sleep: {} ns", h.max);
}

#[test]
fn a_return_point_off_the_entry_is_refused_and_nothing_is_written() {
    let _g = serial();
    let (s, c) = session();
    let before = bytes(&s, "rp_multi", 16);
    let e = s
        .splice_return("rp_multi+4", &c, "on_multi", 0, None, Trap)
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            SessionError::Splice(SpliceError::ReturnNotAtEntry { offset: 4, .. })
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("a return point needs the function's entry"),
        "{e}"
    );
    assert_eq!(bytes(&s, "rp_multi", 16), before);
}

#[test]
fn removing_a_return_point_while_a_call_is_in_progress_lets_it_return() {
    let _g = serial();
    let (s, c) = session();
    reset(&c);
    let wait = f_int(&s, "rp_wait");
    let mut fds = [0i32; 2];
    // SAFETY: a pipe for the waiting thread.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let h = s
        .splice_return("rp_wait", &c, "on_multi", 0, None, Trap)
        .unwrap();
    let waiter = std::thread::spawn(move || wait(fds[0]));
    let start = std::time::Instant::now();
    while h.return_stats().unwrap().unwrap().active == 0 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "the waiter never entered"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The waiter is inside rp_wait with its return address on the stub; the splice goes.
    h.remove().unwrap();
    // SAFETY: one byte to the pipe.
    assert_eq!(unsafe { libc::write(fds[1], b"z".as_ptr().cast(), 1) }, 1);
    assert_eq!(
        waiter.join().unwrap(),
        i32::from(b'z'),
        "the call returned its value to its caller"
    );
    assert_eq!(var(&c, "calls"), 0, "no handler once the splice is gone");
    // SAFETY: closing our pipe.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

#[test]
fn counts_by_thread_process_and_cpu_add_up_to_the_exact_hits() {
    let _g = serial();
    let (s, _c) = session();
    let f = f_int(&s, "rp_multi");
    for mech in [Trap, Jmp] {
        let by_tid = s
            .count_by("rp_multi", trapvec::keyed::KeyBy::Tid, mech)
            .unwrap();
        // Four threads, each calling a different number of times, each knowing its own id.
        let four_threads = || -> Vec<(String, u64)> {
            let threads: Vec<_> = (1..=4u64)
                .map(|k| {
                    std::thread::spawn(move || {
                        for x in 0..i32::try_from(k * 100).unwrap() {
                            assert_eq!(f(x), multi(x));
                        }
                        (
                            // SAFETY: gettid takes no arguments.
                            unsafe { libc::syscall(libc::SYS_gettid) }.to_string(),
                            k * 100,
                        )
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        };
        let mut want = four_threads();
        want.sort_by_key(|w| std::cmp::Reverse(w.1));
        let table = by_tid.key_counts().unwrap().unwrap();
        let got: Vec<(String, u64)> = table
            .keys
            .iter()
            .map(|k| (k.key.clone(), k.count))
            .collect();
        assert_eq!(got, want, "{mech}: one entry per thread, most hits first");
        assert_eq!(
            (table.overflow, table.total(), by_tid.hits().unwrap()),
            (0, 1000, 1000),
            "{mech}"
        );
        assert!(
            want.iter()
                .all(|(tid, _)| *tid != std::process::id().to_string()),
            "{mech}: the threads are not the process's main thread"
        );
        drop(by_tid);
        // By process: four threads again, their hits under one key, this process's id.
        let by_pid = s
            .count_by("rp_multi", trapvec::keyed::KeyBy::Pid, mech)
            .unwrap();
        assert_eq!(four_threads().len(), 4);
        let table = by_pid.key_counts().unwrap().unwrap();
        let got: Vec<(String, u64)> = table
            .keys
            .iter()
            .map(|k| (k.key.clone(), k.count))
            .collect();
        assert_eq!(
            (got, table.overflow),
            (vec![(std::process::id().to_string(), 1000)], 0),
            "{mech}: by pid, every thread's hits under the process's one key"
        );
        assert_eq!(by_pid.hits().unwrap(), 1000, "{mech}");
        drop(by_pid);
        let by_cpu = s
            .count_by("rp_multi", trapvec::keyed::KeyBy::Cpu, mech)
            .unwrap();
        for x in 0..250 {
            f(x);
        }
        let table = by_cpu.key_counts().unwrap().unwrap();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        assert!(
            table
                .keys
                .iter()
                .all(|k| k.key.parse::<u64>().unwrap() < cpus.max(64)),
            "{table:?}"
        );
        assert_eq!(
            (table.total(), by_cpu.hits().unwrap()),
            (250, 250),
            "{mech}"
        );
    }
}

#[test]
fn the_kernel_key_comm_is_refused_in_a_process_and_nothing_is_written() {
    let _g = serial();
    let (s, _c) = session();
    let before = bytes(&s, "rp_multi", 16);
    let e = s
        .count_by("rp_multi", trapvec::keyed::KeyBy::Comm, Trap)
        .err()
        .unwrap();
    let text = trapvec::error_chain(&e);
    assert!(text.starts_with("rp_multi: counts by comm"), "{text}");
    assert!(text.contains("not supported on a process"), "{text}");
    assert_eq!(bytes(&s, "rp_multi", 16), before);
    s.with(|sp| assert_eq!(sp.live().count(), 0));
}
