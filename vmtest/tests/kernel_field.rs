//! The kernel module in the field (`vmtest/scenarios/kernel_field.sh`, issue 9), in one boot:
//! kprobes and splices kept apart in both orders, text the module refuses with a reason of its
//! own, the invariants between text and dispatch table, more dispatch entries than one batch,
//! kernel.modules_disabled and kernel lockdown. Every refusal leaves the kernel unchanged.

use vmtest::testing::{can_boot, can_boot_kernel, tvraw, Run, Scenario};

/// The `reason=N` word of a tvraw line printed as `key`.
fn reason(run: &Run, key: &str) -> String {
    let line = run.expect(key);
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("reason="))
        .unwrap_or_else(|| panic!("{key}={line} has no reason"))
        .to_owned()
}

/// The `ret=N` word of a tvraw line printed as `key`.
fn ret(run: &Run, key: &str) -> i64 {
    let line = run.expect(key);
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("ret=")?.parse().ok())
        .unwrap_or_else(|| panic!("{key}={line} has no ret"))
}

fn err(run: &Run, key: &str, words: &[&str]) {
    let msg = run.expect(key);
    assert!(
        msg.starts_with("trapctl: "),
        "{key}: one trapctl error line, got `{msg}`"
    );
    for w in words {
        assert!(msg.contains(w), "{key}: `{msg}` lacks `{w}`");
    }
}

#[test]
fn kprobes_protected_text_invariants_scale_and_lockdown_in_the_field() {
    if !can_boot("kernel scenario") {
        return;
    }
    field_safety(Scenario::named("kernel_field.sh"));
}

/// The same on Debian 13's kernel: every point 4 bytes further in (endbr64 before the ftrace
/// site), the springboard at __x64_sys_getsid+20.
#[test]
fn kprobes_protected_text_invariants_scale_and_lockdown_on_6_12_too() {
    if !can_boot_kernel("kernel scenario on 6.12", "6.12") {
        return;
    }
    field_safety(Scenario::named("kernel_field.sh").kernel("6.12"));
}

fn field_safety(scenario: Scenario) {
    let dir = tempfile::tempdir().unwrap();
    let run = scenario
        .file(tvraw(dir.path()))
        .timeout(900)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    // The first instructions past the entries (5 bytes on 6.1, 9 on 6.12), as the scenario
    // wrote its points.
    let (ge, me) = (run.number("ENTRY_GETPPID"), run.number("ENTRY_MSS"));
    let g0 = format!("__x64_sys_getppid+{ge}");
    let g1 = format!("__x64_sys_getppid+{}", ge + 1);
    let m1 = format!("tcp_sync_mss+{}", me + 1);

    // 8: a batch with a site in uprobes' die notifier, applied while int3s are taken: no endless
    // int3 recursion (the guest would freeze), every round applied and removed, every call right.
    assert_eq!(
        run.number("DIE_CHAIN_ROUNDS"),
        5,
        "apply and unsplice --all of the die-notifier batch, 5 times"
    );
    let die = run.expect("DIE_CHAIN_CALLS");
    assert!(
        field(&format!("CALLS={die}"), "CALLS") > 0,
        "ppidloop ran: {die}"
    );
    assert_eq!(
        field(&format!("x {die}"), "WRONG"),
        0,
        "getppid answered right through the batches: {die}"
    );

    // 1b: a splice first.
    assert_eq!(
        run.expect("BL_LIVE"),
        "yes",
        "the live window is on the kprobes blacklist"
    );
    assert_eq!(
        run.expect("KP_ON_SPLICE"),
        "refused",
        "a kprobe on the trap's first byte"
    );
    assert_eq!(
        run.expect("KP_IN_SPLICE"),
        "refused",
        "a kprobe on the window's second byte"
    );
    assert_eq!(run.expect("OOPS"), "no");
    assert_eq!(
        run.expect("KP_ENTRY"),
        "ok",
        "an ftrace-based kprobe at the entry beside the splice"
    );
    let splice = run.number("SPLICE_DELTA");
    assert!(
        splice >= 300,
        "sysbench made 300 getppid calls, the splice counted {splice}"
    );
    assert_eq!(
        run.number("PROBE_DELTA"),
        splice,
        "the entry kprobe and the splice count the same calls"
    );
    assert_eq!(
        run.expect("BL_AFTER"),
        "gone",
        "unsplice takes the window off the blacklist"
    );
    assert_eq!(run.expect("KP_AFTER_UNSPLICE"), "ok");

    // 1a: a kprobe first.
    err(
        &run,
        "ERR_KPROBE",
        &[
            &format!("a kprobe is registered at {g0}"),
            "remove it first",
        ],
    );
    assert_eq!(reason(&run, "CHECK_KPROBE"), "19");
    assert_eq!(run.expect("KP_MSS"), "ok");
    err(
        &run,
        "ERR_KPROBE_MSS",
        &[&format!("a kprobe is registered at {m1}")],
    );
    assert_eq!(
        run.expect("THROUGH_PROBE"),
        "same",
        "the boundary decoder reads the probe's saved bytes"
    );
    assert_eq!(
        reason_of(&run, "R_KPROBE_SLOT"),
        "22",
        "a kprobe instruction slot"
    );
    assert_eq!(run.expect("KPROBE_UNCHANGED"), "yes");

    // 1c: an armed, unoptimized kprobe: planning reads through its int3 (issue 24, item 8).
    assert_eq!(
        run.expect("ARMED_BYTE"),
        "cc",
        "the probe's int3 is in the live text"
    );
    err(
        &run,
        "ERR_ARMED_KPROBE",
        &[
            &format!("a kprobe is registered at {g0}"),
            "remove it first",
        ],
    );
    let neighbour = run.expect("ARMED_NEIGHBOUR");
    assert!(
        neighbour.starts_with(&format!("spliced {g1} ")) && neighbour.contains("displaced `call "),
        "ARMED_NEIGHBOUR={neighbour}"
    );
    let calls = field(&format!("CALLS={}", run.expect("ARMED_CALLS")), "CALLS");
    assert_eq!(calls, 501, "ppidloop -n 500 makes 501 calls");
    assert_eq!(
        field(&format!("x {}", run.expect("ARMED_CALLS")), "WRONG"),
        0,
        "getppid answered right behind the probe"
    );
    assert_eq!(
        run.number("ARMED_HITS"),
        calls,
        "the splice behind the probe counts every call"
    );
    assert_eq!(
        run.number("ARMED_PROBE_DELTA"),
        calls,
        "and so does the probe"
    );

    // 2: text the module refuses.
    // .cpuidle.text lies inside the noinstr text from 6.3 on (6.12): the module names that.
    let (idle_reason, idle_words) = match run.expect("CPUIDLE_IN_NOINSTR") {
        "yes" => ("5", "in noinstr text"),
        _ => ("20", ".cpuidle.text"),
    };
    assert_eq!(
        reason_of(&run, "R_CPUIDLE"),
        idle_reason,
        "default_idle: {idle_words}"
    );
    assert_eq!(reason_of(&run, "R_SCT"), "21", "__SCT__cond_resched");
    assert_eq!(reason_of(&run, "R_RETURN_THUNK"), "6");
    assert_eq!(reason_of(&run, "R_SRSO"), "6", "an SRSO thunk");
    assert_eq!(reason_of(&run, "R_BPF"), "23", "a BPF JIT image");
    assert_eq!(
        reason_of(&run, "R_FTRACE_TRAMP"),
        "24",
        "an ftrace trampoline"
    );
    assert_eq!(reason_of(&run, "R_FTRACE"), "8");
    err(
        &run,
        "ERR_CPUIDLE",
        &[run.expect("CPUIDLE_POINT"), idle_words],
    );

    // 4: invariants.
    assert_eq!(
        (ret(&run, "APPLY_NO_ENTRY"), reason(&run, "APPLY_NO_ENTRY")),
        (-22, "28".into())
    );
    assert_eq!(
        (ret(&run, "APPLY_FOREIGN"), reason(&run, "APPLY_FOREIGN")),
        (-22, "29".into())
    );
    assert_eq!(run.expect("TEXT_UNCHANGED"), "yes");
    assert_eq!(
        ret(&run, "REMOVE_LIVE"),
        -16,
        "DISPATCH_REMOVE of a live trap's entry: EBUSY"
    );
    assert!(
        run.number("HITS_AFTER_REMOVE") >= 50,
        "the splice kept working"
    );
    assert_eq!(
        run.number("UNKNOWN_TRAPS"),
        0,
        "no trap of ours was chained to the old handler"
    );

    // 7: a springboard: a jmp rel8 at the site to a jmp rel32 in padding, exact counts, and
    // both the site and the padding restored, the padding after a deferred revert.
    check_springboard(&run);

    // 6: scale.
    let scale = run.expect("SCALE");
    for w in ["added=70000", "listed=70000", "sorted=1", "removed=70000"] {
        assert!(scale.contains(w), "SCALE={scale} lacks {w}");
    }
    assert_eq!(run.expect("SOFT_LOCKUP"), "no");

    // 5: another vector: INFO reports it, user space writes it and the splice counts; an int of
    // another vector (0xf5 here) is refused rather than run.
    let vec = run.expect("OTHER_VECTOR");
    assert_ne!(
        vec, "none",
        "the module loads with another free system vector"
    );
    assert_eq!(vector_of(&run, "OTHER_INFO"), vec);
    assert_eq!(
        reason(&run, "OTHER_NO_ENTRY"),
        "28",
        "a trap of the module's vector without an entry"
    );
    assert_eq!(
        reason(&run, "OTHER_F5"),
        "29",
        "int 0xf5 while the module's vector is another"
    );
    assert_eq!(
        run.value("ERR_OTHER_VECTOR"),
        None,
        "trapctl splices with the module's vector"
    );
    assert_eq!(
        run.expect("OTHER_SITE_BYTES"),
        format!("cd{}", vec.trim_start_matches("0x")),
        "CD <vector> at the first instruction past tcp_sync_mss's entry"
    );
    assert_eq!(
        run.number("OTHER_HITS"),
        10,
        "two connections, five calls each"
    );
    assert_eq!(run.expect("OTHER_UNSPLICED"), "yes");

    // 3: modules_disabled, lockdown.
    err(
        &run,
        "ERR_MODULES_DISABLED",
        &["kernel.modules_disabled=1 forbids writing kernel text"],
    );
    assert_eq!(
        (
            ret(&run, "APPLY_MODULES_DISABLED"),
            reason(&run, "APPLY_MODULES_DISABLED")
        ),
        (-1, "27".into())
    );
    assert!(
        run.expect("LOCKDOWN_NOW").contains("[integrity]"),
        "lockdown is on"
    );
    err(
        &run,
        "ERR_LOCKDOWN",
        &["kernel lockdown (integrity) forbids writing kernel text"],
    );
    assert_eq!(
        (ret(&run, "APPLY_LOCKDOWN"), reason(&run, "APPLY_LOCKDOWN")),
        (-1, "26".into())
    );
    assert_eq!(
        run.expect("LOCKDOWN_UNCHANGED"),
        "yes",
        "bytes, list and arena use as before"
    );
    assert_eq!(run.expect("DMESG_CLEAN"), "yes");
}

/// A `KEY=N` line that rcheck printed (the reason alone), or tvraw's `reason=N` line.
fn reason_of(run: &Run, key: &str) -> String {
    let v = run.expect(key);
    v.strip_prefix("reason=")
        .map_or(v, |r| r.split_whitespace().next().unwrap_or(""))
        .to_owned()
}

/// What INFO's `vector=` word says.
fn vector_of(run: &Run, key: &str) -> String {
    run.expect(key)
        .split_whitespace()
        .find_map(|w| w.strip_prefix("vector="))
        .unwrap_or("")
        .to_owned()
}

/// `offset:old>new` words of a `text_diff` line, offsets from the site.
fn text_diff(run: &Run, key: &str) -> Vec<(i64, u8, u8)> {
    run.expect(key)
        .split_whitespace()
        .map(|w| {
            let (off, change) = w.split_once(':').unwrap_or_else(|| panic!("{key}: `{w}`"));
            let (old, new) = change
                .split_once('>')
                .unwrap_or_else(|| panic!("{key}: `{w}`"));
            let byte =
                |b: &str| u8::from_str_radix(b, 16).unwrap_or_else(|e| panic!("{key}: `{w}`: {e}"));
            (
                off.parse().unwrap_or_else(|e| panic!("{key}: `{w}`: {e}")),
                byte(old),
                byte(new),
            )
        })
        .collect()
}

/// The first number after `key=` in `line`.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {key}=N in {line:?}"))
}

fn check_springboard(run: &Run) {
    let spliced = run.expect("SB_SPLICE");
    assert!(
        spliced.contains("by jmp") && spliced.contains("displaced `test ebx, ebx`"),
        "SB_SPLICE={spliced}"
    );
    // While live: the site's 2 bytes are `jmp rel8` and the 5 bytes it lands on `jmp rel32`;
    // nothing else in the 272 bytes around the site changed.
    let live = text_diff(run, "SB_LIVE_DIFF");
    assert_eq!(
        live.len(),
        7,
        "the site's 2 bytes and the springboard's 5: {live:?}"
    );
    let (site, sb): (Vec<_>, Vec<_>) = live.iter().copied().partition(|d| d.0 == 0 || d.0 == 1);
    assert_eq!(
        site.iter().map(|d| d.0).collect::<Vec<_>>(),
        [0, 1],
        "{live:?}"
    );
    assert_eq!(site[0].2, 0xeb, "jmp rel8 at the site: {live:?}");
    let landing = 2 + i64::from(i8::from_ne_bytes([site[1].2]));
    assert_eq!(
        sb.iter().map(|d| d.0).collect::<Vec<_>>(),
        (landing..landing + 5).collect::<Vec<_>>(),
        "the springboard is where the rel8 lands: {live:?}"
    );
    assert_eq!(sb[0].2, 0xe9, "the springboard is a jmp rel32: {live:?}");
    assert!(
        !(0..2).contains(&landing),
        "the springboard lies outside the window: {live:?}"
    );
    assert_eq!(
        (site[0].1, site[1].1),
        (0x85, 0xdb),
        "`test ebx, ebx` was there: {live:?}"
    );
    // Exact counts: every getsid() the two threads made, counted by the splice and by the kprobe.
    let calls = field(&format!("CALLS={}", run.expect("SB_CALLS")), "CALLS");
    assert_eq!(
        field(&format!("x {}", run.expect("SB_CALLS")), "WRONG"),
        0,
        "getsid(0) answered right while spliced"
    );
    assert_eq!(calls, 6001);
    let unspliced = run.expect("SB_UNSPLICE");
    let hits: u64 = unspliced
        .split_once(": ")
        .and_then(|(_, r)| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("SB_UNSPLICE={unspliced}"));
    assert_eq!(hits, calls, "the splice counted every call: {unspliced}");
    assert_eq!(
        run.number("SB_KPROBE"),
        calls,
        "the entry kprobe counted the same calls"
    );
    // Removed: the site and the padding hold their original bytes again.
    assert_eq!(
        run.expect("SB_AFTER_DIFF").trim(),
        "",
        "every byte around the site restored"
    );
    assert_eq!(
        run.number("SB_DEFERRED"),
        1,
        "the module reverted the springboard after an RCU-tasks grace period"
    );
}
