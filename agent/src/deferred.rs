//! Deferred splices: points in a library that is not loaded yet (`libfoo.so.1:sym`, or a path),
//! applied when the program loads it with `dlopen`/`dlmopen` and removed before `dlclose` unmaps
//! it, as kprobes wait for a module that is not loaded yet.
//!
//! - **Which points wait.** Only a point qualified by an object that no loaded object matches
//!   (the same rule as `object:name` everywhere: a path, a file name, or a file name's start up
//!   to a dot). Everything else about it is checked before `main` as for any point (the spec's
//!   syntax, the mechanism, the handler being a function of a loaded component); a point whose
//!   object never loads stays `pending` in the stats, without an error.
//! - **Load.** After a successful `dlopen` (the outermost one of the thread: a `dlopen` made by a
//!   library's constructor is picked up when the outer call returns, with everything it loaded,
//!   its `DT_NEEDED` libraries included), the pending splices whose object is now loaded are
//!   applied as one all-or-nothing batch. A batch that fails is reported on stderr with the
//!   reason and the program goes on without those splices (`failed` in the stats): a deferred
//!   splice cannot stop the program with status 86, `main` has run by then. Code that runs in the
//!   library's constructors, before `dlopen` returns, is not counted.
//! - **Unload.** Before the real `dlclose`, the applied splices in every object the call may
//!   unload (the handle's object and its `DT_NEEDED` closure) are removed, trampolines quiesced
//!   and freed, so nothing is left pointing into text about to be unmapped. glibc does not say
//!   whether a `dlclose` drops the last reference, so removal always happens; after the call,
//!   splices whose object is still loaded are applied again (hits that other threads make in
//!   that object during the call are missed). If the removal fails, the real `dlclose` is not
//!   called (the library stays loaded, as with `RTLD_NODELETE`) and the reason is reported.
//! - **Threads.** One reentrant lock (the thread's nested calls go through) is held across each
//!   hooked `dlopen`/`dlmopen`/`dlclose`, the real call included, so a splice is never applied
//!   between its removal and the unmapping; it is never taken on the trap path. `fork` takes it
//!   too, so a child never starts with it held by a thread it does not have.
//!
//! Limits (README): loads and unloads that bypass these functions (glibc's own, for NSS modules,
//! `iconv` and `libgcc_s`) are seen at the next hooked call only, and an unload that way is not
//! seen before the unmapping; while a spec has deferred points, `dlopen` is called from the
//! agent, so a bare name is searched without the calling object's `DT_RUNPATH`.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

use instr_manager::ops;
use instr_manager::point::object_matches;
use instr_manager::splicer::{SpliceId, SpliceRequest, Splicer};
use instr_manager::PointSpec;
use trapvec::process::ProcessTarget;

use crate::real;

/// Set once the spec has deferred points and the agent's state holds them: the hooks do nothing
/// else until then (a plain pass-through, before the agent's constructor too).
pub(crate) static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Where a deferred splice stands.
#[derive(Debug)]
pub(crate) enum DState {
    /// Its object has not been loaded (or loaded and failed to apply: see `Failed`).
    Pending,
    /// Live in the loaded object `origin`.
    Applied { id: SpliceId, origin: String },
    /// Its object was unloaded; it waits for the next load.
    Removed,
    /// Applying it failed; it is not tried again.
    Failed(String),
}

/// A splice of the spec waiting for, or living in, a library loaded by `dlopen`.
#[derive(Debug)]
pub(crate) struct Deferred {
    pub request: SpliceRequest,
    /// The object as the point names it.
    pub object: String,
    pub state: DState,
    /// Hits of the splice's earlier lives (before each removal).
    pub hits_before: u64,
    /// How many times it was applied.
    pub loads: u32,
}

impl Deferred {
    pub(crate) fn state_name(&self) -> &'static str {
        match self.state {
            DState::Pending => "pending",
            DState::Applied { .. } => "applied",
            DState::Removed => "removed",
            DState::Failed(_) => "failed",
        }
    }

    /// Hits over every life of the splice.
    pub(crate) fn hits(&self, splicer: &Splicer<ProcessTarget>) -> u64 {
        let now = match &self.state {
            DState::Applied { id, .. } => splicer.hits(*id).map(|h| h.hits).unwrap_or(0),
            _ => 0,
        };
        self.hits_before + now
    }
}

/// The objects loaded now, by the names the dynamic linker gives them (the executable, whose
/// name is empty, and the vDSO are left out).
pub(crate) fn loaded_objects() -> Vec<String> {
    unsafe extern "C" fn collect(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the Vec passed below; `info` is valid during the callback and its
        // name, when not null, a C string.
        unsafe {
            let out = &mut *data.cast::<Vec<String>>();
            let name = (*info).dlpi_name;
            if !name.is_null() {
                let s = CStr::from_ptr(name).to_string_lossy();
                if !s.is_empty() && !s.starts_with("linux-vdso") {
                    out.push(s.into_owned());
                }
            }
        }
        0
    }
    let mut out: Vec<String> = Vec::new();
    // SAFETY: `collect` has the callback's signature and only touches `out`.
    unsafe { libc::dl_iterate_phdr(Some(collect), (&mut out as *mut Vec<String>).cast()) };
    out
}

/// The object a point waits for: `Some` when it names an object that no loaded object matches.
pub(crate) fn waits_for(point: &PointSpec, loaded: &[String]) -> Option<String> {
    match point {
        PointSpec::Symbol {
            object: Some(o), ..
        } if !loaded.iter().any(|l| object_matches(l, o)) => Some(o.clone()),
        _ => None,
    }
}

// ---- the lock ----------------------------------------------------------------------------

/// Owner (`pthread_self`, 0 when free) and depth of the reentrant dl lock.
static OWNER: AtomicUsize = AtomicUsize::new(0);
static DEPTH: AtomicUsize = AtomicUsize::new(0);

#[allow(clippy::cast_possible_truncation)] // x86-64 Linux only: pthread_t and usize are 64 bits.
fn me() -> usize {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize }
}

/// Take the dl lock (reentrant); returns the depth, 1 for the outermost call of the thread.
fn lock() -> usize {
    let me = me();
    if OWNER.load(SeqCst) != me {
        let mut spins = 0u32;
        while OWNER.compare_exchange(0, me, SeqCst, SeqCst).is_err() {
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }
    DEPTH.fetch_add(1, SeqCst) + 1
}

fn unlock() {
    if DEPTH.fetch_sub(1, SeqCst) == 1 {
        OWNER.store(0, SeqCst);
    }
}

extern "C" fn fork_prepare() {
    lock();
}

extern "C" fn fork_parent() {
    unlock();
}

/// In the child, the forking thread is the only thread and keeps its `pthread_self`: the lock
/// it took in `fork_prepare` is released as in the parent.
extern "C" fn fork_child() {
    OWNER.store(me(), SeqCst);
    unlock();
}

/// Make the hooks act (the state holds the deferred splices) and keep the lock over `fork`.
pub(crate) fn activate() {
    // SAFETY: registering plain extern "C" functions with no arguments.
    unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    ACTIVE.store(true, SeqCst);
}

// ---- the hooks -----------------------------------------------------------------------------

/// `dlopen` or `dlmopen` through the lock; after the outermost successful call, apply what
/// became ready.
fn load(what: &str, call: impl FnOnce() -> *mut c_void) -> *mut c_void {
    let depth = lock();
    let handle = call();
    if !handle.is_null() && depth == 1 {
        crate::with_state(|state| apply_ready(state, what));
        if crate::attached::loaded_by_attach() {
            // The objects it loaded call dlopen through their own GOT slots.
            crate::got::hook_all();
        }
    }
    unlock();
    handle
}

fn describe(file: *const c_char) -> String {
    if file.is_null() {
        return "dlopen(NULL)".into();
    }
    format!(
        "dlopen({})",
        // SAFETY: a non-null `file` given to dlopen is a C string.
        unsafe { CStr::from_ptr(file) }.to_string_lossy()
    )
}

/// Apply, as one batch, the deferred splices whose object is loaded and that wait for it
/// (`pending` or `removed`); `why` names the call that made them ready, for messages.
fn apply_ready(state: &mut crate::State, why: &str) {
    let loaded = loaded_objects();
    let ready: Vec<usize> = state
        .deferred
        .iter()
        .enumerate()
        .filter(|(_, d)| {
            matches!(d.state, DState::Pending | DState::Removed)
                && loaded.iter().any(|l| object_matches(l, &d.object))
        })
        .map(|(i, _)| i)
        .collect();
    if ready.is_empty() {
        return;
    }
    let splicer = &mut state.splicer;
    let requests: Vec<SpliceRequest> = ready
        .iter()
        .map(|&i| state.deferred[i].request.clone())
        .collect();
    log::debug!("{why}: applying {} deferred splices", requests.len());
    let result = seccomp_refusal().map_or(Ok(()), Err).and_then(|()| {
        splicer
            .target_mut()
            .refresh_symbols()
            .map_err(|e| trapvec::error_chain(&e))
    });
    let result = result
        .and_then(|()| ops::splice_batch(splicer, &requests).map_err(|e| trapvec::error_chain(&e)));
    match result {
        Ok((_, made)) => {
            let ids = made.splices;
            for (&i, id) in ready.iter().zip(ids) {
                let origin = splicer
                    .get(id)
                    .and_then(|s| s.point.function.origin.clone())
                    .unwrap_or_default();
                let d = &mut state.deferred[i];
                d.state = DState::Applied { id, origin };
                d.loads += 1;
            }
        }
        Err(reason) => {
            let points: Vec<&str> = requests.iter().map(|r| r.at.as_str()).collect();
            eprintln!("trapvec: after {why}: cannot apply the deferred splices {}: {reason}; the program goes on without them", points.join(", "));
            for &i in &ready {
                state.deferred[i].state = DState::Failed(reason.clone());
            }
        }
    }
}

// ---- seccomp -------------------------------------------------------------------------------

/// A process's seccomp state as `/proc/self/status` gives it: `Seccomp:` (0 none, 1 strict,
/// 2 filter) and `Seccomp_filters:` (Linux 5.9 and later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SeccompState {
    pub mode: u32,
    pub filters: Option<u32>,
}

/// Parse the `Seccomp:` and `Seccomp_filters:` lines of a `/proc/<pid>/status` text.
fn parse_seccomp(status: &str) -> Option<SeccompState> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':')))
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    Some(SeccompState {
        mode: field("Seccomp")?,
        filters: field("Seccomp_filters"),
    })
}

/// This process's seccomp state, read with `open`/`read`/`close` only (`None`: no `/proc`, or a
/// kernel without seccomp).
pub(crate) fn seccomp_state() -> Option<SeccompState> {
    let mut buf = vec![0u8; 8192];
    // SAFETY: a C string path; the descriptor is read into our buffer and closed.
    let text = unsafe {
        let fd = libc::open(
            c"/proc/self/status".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return None;
        }
        let mut got = 0;
        while got < buf.len() {
            let n = libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got);
            if n <= 0 {
                break;
            }
            got += n.unsigned_abs();
        }
        libc::close(fd);
        String::from_utf8_lossy(&buf[..got]).into_owned()
    };
    parse_seccomp(&text)
}

/// The seccomp state when the agent started, before `main`.
static SECCOMP_AT_START: std::sync::OnceLock<Option<SeccompState>> = std::sync::OnceLock::new();

/// Record the seccomp state at start.
pub(crate) fn note_seccomp_at_start() {
    let _ = SECCOMP_AT_START.set(seccomp_state());
}

/// Why a deferred batch must not be applied now, if it must not: the program put itself under
/// a seccomp filter after the agent started (a sandbox entered before loading plugins). A
/// batch makes system calls (`mmap` and `memfd_create` for the repository near the library,
/// `mprotect` of the text, `membarrier` to sync every core, `rt_tgsigqueueinfo` to scan the
/// threads) that such a filter may answer with SIGSYS and kill the process; the filter cannot be
/// read back without CAP_SYS_ADMIN, so the batch is refused with the reason instead. Filters
/// that were there before `main` (a container's, inherited through exec) are the ones the
/// agent's own start ran under: the same `Seccomp_filters:` count as at start lets the batch
/// go on. Strict mode (1) allows nothing a batch needs.
fn seccomp_refusal() -> Option<String> {
    let now = seccomp_state()?;
    let start = SECCOMP_AT_START.get().copied().flatten();
    let inherited_only = now.mode == 2 && now.filters.is_some() && start == Some(now);
    if now.mode == 0 || inherited_only {
        return None;
    }
    let filters = |s: Option<SeccompState>| match s {
        Some(SeccompState {
            mode,
            filters: Some(n),
        }) => format!("Seccomp: {mode}, Seccomp_filters: {n}"),
        Some(SeccompState {
            mode,
            filters: None,
        }) => format!("Seccomp: {mode}"),
        None => "unknown".into(),
    };
    Some(format!(
        "the process runs under a seccomp {} it entered after trapvec started ({} in /proc/self/status; at start: {}): \
         applying the batch makes system calls (mmap, memfd_create, mprotect, membarrier, rt_tgsigqueueinfo) it may be killed on (SIGSYS), so the batch is refused",
        if now.mode == 1 { "strict mode" } else { "filter" },
        filters(Some(now)),
        filters(start),
    ))
}

/// Link map of glibc's `<link.h>` (the public part).
#[repr(C)]
struct LinkMap {
    l_addr: u64,
    l_name: *const c_char,
    l_ld: *const Elf64Dyn,
    l_next: *const LinkMap,
    l_prev: *const LinkMap,
}

/// `Elf64_Dyn` of `<elf.h>`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Elf64Dyn {
    d_tag: i64,
    d_val: u64,
}

// Dynamic section tags (elf.h).
const DT_NULL: i64 = 0;
const DT_NEEDED: i64 = 1;
const DT_STRTAB: i64 = 5;
const DT_SONAME: i64 = 14;

/// One object of a namespace: its name, soname and `DT_NEEDED` names.
struct ObjectDeps {
    name: String,
    soname: Option<String>,
    needed: Vec<String>,
}

/// Read an object's dynamic section.
///
/// # Safety
/// `m` is a live link map of the dynamic linker.
unsafe fn deps_of(m: *const LinkMap) -> ObjectDeps {
    // SAFETY: guaranteed by the caller; l_name is a C string (maybe empty).
    let (base, name, dynamic) = unsafe { ((*m).l_addr, (*m).l_name, (*m).l_ld) };
    let name = if name.is_null() {
        String::new()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    };
    let mut out = ObjectDeps {
        name,
        soname: None,
        needed: Vec::new(),
    };
    if dynamic.is_null() {
        return out;
    }
    let (mut strtab, mut soname, mut needed) = (0u64, None, Vec::new());
    let mut i = 0;
    loop {
        // SAFETY: the dynamic section of a loaded object ends with DT_NULL.
        let d = unsafe { *dynamic.add(i) };
        i += 1;
        match d.d_tag {
            DT_NULL => break,
            DT_STRTAB => strtab = d.d_val,
            DT_SONAME => soname = Some(d.d_val),
            DT_NEEDED => needed.push(d.d_val),
            _ => {}
        }
    }
    if strtab == 0 {
        return out;
    }
    // glibc relocates the pointers of a writable dynamic section in place; a read-only one (the
    // vDSO's) keeps link-time values.
    if strtab < base {
        strtab += base;
    }
    let string = |off: u64| {
        // SAFETY: offsets into the object's string table, which is mapped while it is loaded.
        unsafe { CStr::from_ptr((strtab + off) as *const c_char) }
            .to_string_lossy()
            .into_owned()
    };
    out.soname = soname.map(string);
    out.needed = needed.into_iter().map(string).collect();
    out
}

/// The names of the objects `dlclose(handle)` may unload: the handle's object and, through
/// `DT_NEEDED`, every object of its namespace it depends on. `None` when the handle cannot be
/// read (every applied deferred splice is then treated as in danger).
fn closure(handle: *mut c_void) -> Option<Vec<String>> {
    let mut lm: *const LinkMap = std::ptr::null();
    // SAFETY: dlinfo writes a `struct link_map *` for RTLD_DI_LINKMAP; a bad handle gives -1.
    if unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&mut lm as *mut *const LinkMap).cast(),
        )
    } != 0
        || lm.is_null()
    {
        return None;
    }
    let mut head = lm;
    // SAFETY: the namespace's list is stable while we hold the dl lock and the object is open
    // (the hooked dlopen/dlclose are serialised; the loader's own calls only add to it).
    unsafe {
        while !(*head).l_prev.is_null() {
            head = (*head).l_prev;
        }
    }
    let mut all = Vec::new();
    let mut m = head;
    let mut start = 0;
    while !m.is_null() {
        if m == lm {
            start = all.len();
        }
        // SAFETY: `m` is a live link map of the list (see above).
        all.push(unsafe { deps_of(m) });
        // SAFETY: as above.
        m = unsafe { (*m).l_next };
    }
    let mut seen = vec![false; all.len()];
    let mut todo = vec![start];
    seen[start] = true;
    while let Some(i) = todo.pop() {
        for n in &all[i].needed {
            let file = |o: &ObjectDeps| o.name.rsplit('/').next().map(str::to_string);
            if let Some(j) = all.iter().position(|o| {
                o.soname.as_deref() == Some(n.as_str()) || file(o).as_deref() == Some(n.as_str())
            }) {
                if !seen[j] {
                    seen[j] = true;
                    todo.push(j);
                }
            }
        }
    }
    Some(
        all.into_iter()
            .zip(seen)
            .filter(|(_, s)| *s)
            .map(|(o, _)| o.name)
            .collect(),
    )
}

/// `dlclose` with the deferred splices of the objects it may unload removed first.
fn close(handle: *mut c_void) -> c_int {
    lock();
    let mut removed: Vec<usize> = Vec::new();
    let mut refused = false;
    crate::with_state(|state| {
        let danger = closure(handle);
        let victims: Vec<(usize, SpliceId)> = state
            .deferred
            .iter()
            .enumerate()
            .filter_map(|(i, d)| match &d.state {
                DState::Applied { id, origin }
                    if danger.as_ref().is_none_or(|names| names.contains(origin)) =>
                {
                    Some((i, *id))
                }
                _ => None,
            })
            .collect();
        if victims.is_empty() {
            return;
        }
        if let Some(why) = seccomp_refusal() {
            // Removing is a batch of text writes too: better a library left loaded than SIGSYS.
            eprintln!("trapvec: dlclose: the deferred splices of the library are not removed: {why}; it stays loaded");
            refused = true;
            return;
        }
        let ids: Vec<SpliceId> = victims.iter().map(|v| v.1).collect();
        match state.splicer.remove(&ids) {
            Ok(hits) => {
                for (&(i, _), h) in victims.iter().zip(hits) {
                    let d = &mut state.deferred[i];
                    d.hits_before += h.hits;
                    d.state = DState::Removed;
                    removed.push(i);
                }
            }
            Err(e) => {
                eprintln!("trapvec: dlclose: cannot remove the deferred splices of the library: {}; it stays loaded", trapvec::error_chain(&e));
                refused = true;
            }
        }
    });
    let rc = if refused {
        0
    } else {
        // SAFETY: libc's dlclose with the caller's handle.
        unsafe { real::dlclose()(handle) }
    };
    if !removed.is_empty() {
        // The objects still loaded (a reference remains) get their splices back.
        crate::with_state(|state| apply_ready(state, "dlclose"));
    }
    unlock();
    rc
}

thread_local! {
    /// Set while this thread runs the agent's own machinery: its own `dlopen(RTLD_NOLOAD)` and
    /// `dlclose` (trapvec's IFUNC lookup) go straight to libc.
    static IN_AGENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f` with the thread marked as inside the agent.
pub(crate) fn as_agent<R>(f: impl FnOnce() -> R) -> R {
    let was = IN_AGENT.replace(true);
    let r = f();
    IN_AGENT.set(was);
    r
}

/// Whether a hook passes straight through to libc.
fn pass_through() -> bool {
    !ACTIVE.load(SeqCst) || IN_AGENT.get()
}

/// `dlopen`: libc's, then the deferred splices its libraries make ready.
#[no_mangle]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    // SAFETY: the caller's arguments, as dlopen's.
    unsafe { hook::dlopen(file, mode) }
}

/// `dlmopen`: as `dlopen`, in namespace `lmid`.
#[no_mangle]
pub unsafe extern "C" fn dlmopen(
    lmid: libc::Lmid_t,
    file: *const c_char,
    mode: c_int,
) -> *mut c_void {
    // SAFETY: the caller's arguments, as dlmopen's.
    unsafe { hook::dlmopen(lmid, file, mode) }
}

/// `dlclose`: the deferred splices of what it may unload removed first.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    // SAFETY: the caller's handle, as dlclose's.
    unsafe { hook::dlclose(handle) }
}

/// The hooks' bodies, under names the agent does not export: their addresses are the agent's
/// own (the exported names are bound, inside the agent too, to the first definition in the
/// process's lookup order, libc's when the agent was not preloaded), for the GOT slots
/// `crate::got` hooks.
pub(crate) mod hook {
    use super::{c_char, c_int, c_void, close, describe, load, pass_through, real};

    pub(crate) unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
        if pass_through() {
            // SAFETY: libc's dlopen with the caller's arguments.
            return unsafe { real::dlopen()(file, mode) };
        }
        // SAFETY: as above.
        load(&describe(file), || unsafe { real::dlopen()(file, mode) })
    }

    pub(crate) unsafe extern "C" fn dlmopen(
        lmid: libc::Lmid_t,
        file: *const c_char,
        mode: c_int,
    ) -> *mut c_void {
        if pass_through() {
            // SAFETY: libc's dlmopen with the caller's arguments.
            return unsafe { real::dlmopen()(lmid, file, mode) };
        }
        // SAFETY: as above.
        load(
            &format!("dlm{}", describe(file).trim_start_matches("dl")),
            || unsafe { real::dlmopen()(lmid, file, mode) },
        )
    }

    pub(crate) unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
        if pass_through() {
            // SAFETY: libc's dlclose with the caller's handle.
            return unsafe { real::dlclose()(handle) };
        }
        close(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seccomp_mode_and_filter_count_are_read_from_a_status_text() {
        let text = "Name:\tx\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t3\nSpeculation_Store_Bypass:\tx\n";
        assert_eq!(
            parse_seccomp(text),
            Some(SeccompState {
                mode: 2,
                filters: Some(3)
            })
        );
        assert_eq!(
            parse_seccomp("Seccomp:\t0\n"),
            Some(SeccompState {
                mode: 0,
                filters: None
            })
        );
        assert_eq!(parse_seccomp("Name:\tx\n"), None);
    }

    #[test]
    fn only_points_naming_an_object_that_is_not_loaded_wait() {
        let loaded = vec![
            "/lib/x86_64-linux-gnu/libc.so.6".to_string(),
            "/tmp/x/libfoo.so.1".to_string(),
        ];
        let p = |s: &str| s.parse::<PointSpec>().unwrap();
        assert_eq!(
            waits_for(&p("libbar.so.1:bar"), &loaded),
            Some("libbar.so.1".into())
        );
        assert_eq!(
            waits_for(&p("/tmp/y/libfoo.so.1:foo+4"), &loaded),
            Some("/tmp/y/libfoo.so.1".into())
        );
        assert_eq!(waits_for(&p("libfoo:foo"), &loaded), None);
        assert_eq!(waits_for(&p("libc:getpid"), &loaded), None);
        assert_eq!(waits_for(&p("getpid"), &loaded), None);
        assert_eq!(waits_for(&p("0x1000"), &loaded), None);
    }
}
