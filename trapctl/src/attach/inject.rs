//! Loading the agent into a running process with ptrace: seize and stop every thread, make one
//! of them call libc's public `dlopen(agent, RTLD_NOW)` and then the agent's
//! `trapvec_agent_attach()`, put its registers (general, x87/SSE/AVX state, `errno`) back exactly
//! as they were, let every thread go.
//!
//! A call is made by setting the thread's registers as for a function call: the arguments in
//! rdi, rsi, ..., a string written on its stack below the 128-byte red zone, a return address
//! of 0 pushed, `orig_rax = -1` so that the kernel does not take the new registers for an
//! interrupted system call. The function's `ret` to 0 faults: the SIGSEGV stops the thread
//! (signal-delivery-stop) before any handler of the program sees it, and is never delivered.
//!
//! Threads stopped inside a restartable system call (`read`, `accept`, `futex`, `nanosleep`,
//! `epoll_wait`: rax is -ERESTARTSYS, -ERESTARTNOINTR, -ERESTARTNOHAND or
//! -ERESTART_RESTARTBLOCK, orig_rax the call's number) are not told anything: the saved
//! registers are written back as they were, and when the thread goes on the kernel restarts the
//! call (it looks at rax and orig_rax only then), so the program sees no EINTR.

// x86-64 only: registers are u64 slots read as i64 bit for bit (rax = -ERESTARTSYS, a C int
// status in rax's low half), signal numbers are small positive ints, and microseconds held fit
// in u64.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::maps;

/// What went wrong while the process was held.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("cannot seize thread {tid} of process {pid}: {source} (ptrace refused: is the process dumpable, and does yama allow it?)")]
    Seize {
        pid: i32,
        tid: i32,
        source: std::io::Error,
    },
    #[error("thread {tid}: ptrace {what}: {source}")]
    Ptrace {
        tid: i32,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("thread {tid} did not stop within {ms} ms")]
    NoStop { tid: i32, ms: u128 },
    #[error(
        "process {pid} has no thread that stopped for a call (every thread has a signal pending)"
    )]
    NoThread { pid: i32 },
    #[error("process {pid}: /proc/{pid}/mem: {source}")]
    Mem { pid: i32, source: std::io::Error },
    #[error("{0}")]
    Maps(#[from] maps::MapsError),
    #[error("thread {tid}: the call of {func} ({addr:#x}) {how}")]
    CallFailed {
        tid: i32,
        func: &'static str,
        addr: u64,
        how: String,
    },
    #[error("thread {tid}: the call of {func} did not return within {s:.1} s, even with the other threads let go; it was undone ({how}): the process is as it was, nothing was loaded")]
    CallUndone {
        tid: i32,
        func: &'static str,
        s: f64,
        how: String,
    },
    #[error("thread {tid}: the call of {func} did not return within {s:.1} s, even with the other threads let go, and it cannot be undone: {why}; its registers were put back, which leaves that call unfinished")]
    CallTimeout {
        tid: i32,
        func: &'static str,
        s: f64,
        why: String,
    },
    #[error("executable mappings are forbidden in process {pid}: {why}; trapvec needs mprotect(PROT_EXEC) to write its splices (nothing was changed)")]
    NoExec { pid: i32, why: String },
    #[error("dlopen({agent}) failed in process {pid}: {why}")]
    Dlopen {
        pid: i32,
        agent: String,
        why: String,
    },
    #[error("the agent's trapvec_agent_attach() failed in process {pid} (status {status}; its reason is on the process's stderr)")]
    AgentAttach { pid: i32, status: i32 },
}

/// How long a thread may take to stop, and an injected call to return by default
/// (`--attach-timeout`).
const STOP_TIMEOUT: Duration = Duration::from_secs(2);
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a call may run with the other threads stopped; after that they go on (still
/// seized), in case one of them holds a lock the call waits for (the loader's, malloc's).
const HOLD_TIMEOUT: Duration = Duration::from_secs(1);

/// `PTRACE_EVENT_STOP`: the stop of `PTRACE_INTERRUPT` (or a group stop) of a seized thread.
const PTRACE_EVENT_STOP: i32 = 128;
/// The regset of the whole xsave area (x87, SSE, AVX, ...).
const NT_X86_XSTATE: libc::c_int = 0x202;
/// `prctl(PR_GET_MDWE)` and its flag `PR_MDWE_REFUSE_EXEC_GAIN` (Linux 6.3).
const PR_GET_MDWE: u64 = 66;
const PR_MDWE_REFUSE_EXEC_GAIN: u64 = 1;

/// Where the calls go, found before the process is stopped (reading the objects' symbol
/// tables takes milliseconds the threads need not be held for).
pub struct Plan {
    agent: PathBuf,
    /// The start of libc's first executable mapping (the page `mprotect` is probed on).
    libc_exec: u64,
    errno_location: u64,
    prctl: u64,
    mprotect: u64,
    dlopen: u64,
    dlerror: u64,
    /// `trapvec_agent_attach` from the agent's load bias.
    attach_offset: u64,
}

impl Plan {
    pub fn new(pid: i32, agent: &Path) -> Result<Plan, InjectError> {
        let libc = maps::libc_of(pid)?;
        let names = ["__errno_location", "prctl", "mprotect", "dlopen", "dlerror"];
        let a = maps::file_symbols(pid, &libc.path, &names)?;
        // The agent is read as this process sees it: it is given to dlopen by this path.
        let attach = maps::file_symbols(
            std::process::id().cast_signed(),
            agent,
            &["trapvec_agent_attach"],
        )?;
        Ok(Plan {
            agent: agent.into(),
            libc_exec: libc.exec_start,
            errno_location: libc.base + a[0],
            prctl: libc.base + a[1],
            mprotect: libc.base + a[2],
            dlopen: libc.base + a[3],
            dlerror: libc.base + a[4],
            attach_offset: attach[0],
        })
    }
}

/// Figures of one attach.
#[derive(Debug, Default)]
pub struct Figures {
    /// Threads held.
    pub threads: usize,
    /// The thread that made the calls.
    pub caller: i32,
    /// How long each thread was held stopped (from its stop to its release), µs, by tid.
    pub held_us: Vec<(i32, u64)>,
    /// Threads found in a restartable system call.
    pub in_syscall: usize,
}

/// One seized thread.
struct Thread {
    tid: i32,
    /// When it was seen stopped.
    stopped_at: Option<Instant>,
    /// A signal that stopped it (signal-delivery-stop) rather than the interrupt: delivered when
    /// it is let go.
    pending: i32,
    /// Let go before the end (a call took longer than [`HOLD_TIMEOUT`]); still seized.
    running: bool,
}

fn ptrace(req: libc::c_uint, tid: i32, addr: usize, data: usize) -> std::io::Result<libc::c_long> {
    // SAFETY: every request made here passes either 0 or a pointer to a live buffer of the size
    // the request writes (user_regs_struct, an iovec over a buffer), established by the caller.
    let r = unsafe { libc::ptrace(req, tid, addr, data) };
    if r == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Wait for a stop of `tid` (polling, up to `timeout`): the raw status.
fn wait_stop(tid: i32, timeout: Duration) -> std::io::Result<Option<i32>> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes one int to `status`.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == tid {
            return Ok(Some(status));
        }
        if r == -1 {
            return Err(std::io::Error::last_os_error());
        }
        if start.elapsed() > timeout {
            return Ok(None);
        }
        spins += 1;
        if spins > 200 {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The process held: every thread seized and stopped. Dropping it lets every thread go.
pub struct Held {
    pid: i32,
    threads: Vec<Thread>,
    mem: File,
    released: bool,
    /// How long an injected call may take before it is given up.
    call_timeout: Duration,
    /// The calling thread's block as it was before the calls: its address and bytes.
    thread_block: Option<(u64, Vec<u8>)>,
    pub figures: Figures,
}

impl Held {
    /// Seize and stop every thread of `pid` (threads started meanwhile are caught by listing
    /// the tasks again until no new one appears).
    pub fn stop_all(pid: i32, call_timeout: Duration) -> Result<Held, InjectError> {
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|source| InjectError::Mem { pid, source })?;
        let mut held = Held {
            pid,
            threads: Vec::new(),
            mem,
            released: false,
            call_timeout,
            thread_block: None,
            figures: Figures::default(),
        };
        loop {
            let tids = tasks(pid).map_err(|source| InjectError::Seize {
                pid,
                tid: pid,
                source,
            })?;
            let new: Vec<i32> = tids
                .into_iter()
                .filter(|t| !held.threads.iter().any(|h| h.tid == *t))
                .collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                match ptrace(libc::PTRACE_SEIZE, tid, 0, 0) {
                    Ok(_) => {}
                    // A thread that exited meanwhile.
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) && tid != pid => continue,
                    Err(source) => return Err(InjectError::Seize { pid, tid, source }),
                }
                held.threads.push(Thread {
                    tid,
                    stopped_at: None,
                    pending: 0,
                    running: false,
                });
                ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0).map_err(|source| {
                    InjectError::Ptrace {
                        tid,
                        what: "INTERRUPT",
                        source,
                    }
                })?;
            }
        }
        let mut gone = Vec::new();
        for t in &mut held.threads {
            match wait_stop(t.tid, STOP_TIMEOUT) {
                Ok(Some(status)) if libc::WIFSTOPPED(status) => {
                    t.stopped_at = Some(Instant::now());
                    if status >> 16 != PTRACE_EVENT_STOP {
                        t.pending = libc::WSTOPSIG(status);
                    }
                }
                // Exited (or killed) meanwhile.
                Ok(Some(_)) => gone.push(t.tid),
                Err(e) if e.raw_os_error() == Some(libc::ECHILD) => gone.push(t.tid),
                Ok(None) => {
                    return Err(InjectError::NoStop {
                        tid: t.tid,
                        ms: STOP_TIMEOUT.as_millis(),
                    })
                }
                Err(source) => {
                    return Err(InjectError::Ptrace {
                        tid: t.tid,
                        what: "wait",
                        source,
                    })
                }
            }
        }
        held.threads.retain(|t| !gone.contains(&t.tid));
        held.figures.threads = held.threads.len();
        Ok(held)
    }

    /// A thread to make the calls in: one stopped by the interrupt, the main thread first.
    fn caller(&self) -> Result<i32, InjectError> {
        self.threads
            .iter()
            .filter(|t| t.pending == 0)
            .map(|t| t.tid)
            .min_by_key(|t| (*t != self.pid, *t))
            .ok_or(InjectError::NoThread { pid: self.pid })
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), InjectError> {
        self.mem
            .read_exact_at(buf, addr)
            .map_err(|source| InjectError::Mem {
                pid: self.pid,
                source,
            })
    }

    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), InjectError> {
        self.mem
            .write_all_at(buf, addr)
            .map_err(|source| InjectError::Mem {
                pid: self.pid,
                source,
            })
    }

    /// Load `agent` and start its control channel, from one thread; every register of that
    /// thread is put back as it was, whatever happens after the first call.
    pub fn load_agent(&mut self, plan: &Plan) -> Result<(), InjectError> {
        let tid = self.caller()?;
        self.figures.caller = tid;
        self.figures.in_syscall = self
            .threads
            .iter()
            .filter(|t| get_regs(t.tid).map(|r| is_restartable(&r)).unwrap_or(false))
            .count();
        // The calls need only the calling thread: the others go now, so that each is held
        // for the stop alone, not for the agent's dlopen (which is thread-safe; a thread held
        // with a lock the dlopen needs would only make it wait).
        self.release_others(tid);
        let saved = Saved::take(tid)?;
        self.read_thread_block(&saved.regs);
        let r = self.calls(tid, &saved.regs, plan);
        // Back exactly as it was (errno was restored by `calls` if it could be read).
        let restored = saved.restore(tid);
        r?;
        restored
    }

    fn calls(
        &mut self,
        tid: i32,
        regs: &libc::user_regs_struct,
        plan: &Plan,
    ) -> Result<(), InjectError> {
        // errno first: dlopen and the probes may set it.
        let errno_loc = self.call(tid, regs, "__errno_location", plan.errno_location, &[])?;
        let mut errno = [0u8; 4];
        self.read(errno_loc, &mut errno)?;
        let r = self.calls_with_errno(tid, regs, plan, errno_loc);
        let put_back = self.write(errno_loc, &errno);
        r?;
        put_back
    }

    fn calls_with_errno(
        &mut self,
        tid: i32,
        regs: &libc::user_regs_struct,
        plan: &Plan,
        errno_loc: u64,
    ) -> Result<(), InjectError> {
        let pid = self.pid;
        // Executable mappings: the kernel's own switch (PR_SET_MDWE, Linux 6.3) ...
        let mdwe = self.call(tid, regs, "prctl", plan.prctl, &[PR_GET_MDWE, 0, 0, 0, 0])?;
        if mdwe as i64 > 0 && mdwe & PR_MDWE_REFUSE_EXEC_GAIN != 0 {
            return Err(InjectError::NoExec {
                pid,
                why: "prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN) is set (systemd's MemoryDenyWriteExecute=yes on a recent kernel)".into(),
            });
        }
        // ... and a seccomp filter's: mprotect of one page of libc's text to what it is already
        // (read, execute) changes nothing, and fails where PROT_EXEC is forbidden.
        if maps::seccomp_mode(pid) == Some(2) {
            let r = self.call(
                tid,
                regs,
                "mprotect",
                plan.mprotect,
                &[
                    plan.libc_exec,
                    4096,
                    (libc::PROT_READ | libc::PROT_EXEC) as u64,
                ],
            )?;
            if r as i64 != 0 {
                let mut e = [0u8; 4];
                self.read(errno_loc, &mut e)?;
                return Err(InjectError::NoExec {
                    pid,
                    why: format!(
                        "a seccomp filter refuses mprotect(PROT_EXEC) with {} (systemd's MemoryDenyWriteExecute=yes, or a sandbox)",
                        std::io::Error::from_raw_os_error(i32::from_ne_bytes(e))
                    ),
                });
            }
        }
        let mut cpath = plan.agent.as_os_str().as_encoded_bytes().to_vec();
        cpath.push(0);
        let handle = self.call_with_string(
            tid,
            regs,
            "dlopen",
            plan.dlopen,
            &cpath,
            &[libc::RTLD_NOW as u64],
        )?;
        if handle == 0 {
            let msg = self.call(tid, regs, "dlerror", plan.dlerror, &[])?;
            let why = if msg == 0 {
                "no reason given".to_string()
            } else {
                let mut buf = vec![0u8; 512];
                let _ = self.read(msg, &mut buf);
                let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
                String::from_utf8_lossy(&buf[..end]).into_owned()
            };
            return Err(InjectError::Dlopen {
                pid,
                agent: plan.agent.display().to_string(),
                why,
            });
        }
        let agent_map = maps::object_of(pid, &plan.agent)?;
        let attach = agent_map.base + plan.attach_offset;
        let status = self.call(tid, regs, "trapvec_agent_attach", attach, &[])? as i32;
        if status != 0 {
            return Err(InjectError::AgentAttach { pid, status });
        }
        Ok(())
    }

    /// Call `func` with `string` (NUL-terminated) as its first argument, then `args`.
    fn call_with_string(
        &mut self,
        tid: i32,
        regs: &libc::user_regs_struct,
        name: &'static str,
        func: u64,
        string: &[u8],
        args: &[u64],
    ) -> Result<u64, InjectError> {
        let at = (regs.rsp - 128 - string.len() as u64) & !15;
        self.write(at, string)?;
        let mut all = vec![at];
        all.extend_from_slice(args);
        self.call_below(tid, regs, name, func, &all, at)
    }

    fn call(
        &mut self,
        tid: i32,
        regs: &libc::user_regs_struct,
        name: &'static str,
        func: u64,
        args: &[u64],
    ) -> Result<u64, InjectError> {
        self.call_below(tid, regs, name, func, args, regs.rsp - 128)
    }

    /// Call `func(args)` in thread `tid` with its stack below `top`; its return value.
    fn call_below(
        &mut self,
        tid: i32,
        regs: &libc::user_regs_struct,
        name: &'static str,
        func: u64,
        args: &[u64],
        top: u64,
    ) -> Result<u64, InjectError> {
        let failed = |how: String| InjectError::CallFailed {
            tid,
            func: name,
            addr: func,
            how,
        };
        // At a function's first instruction rsp is 8 modulo 16 (the return address just pushed).
        let rsp = (top & !15) - 8;
        self.write(rsp, &0u64.to_ne_bytes())?;
        let mut r = *regs;
        r.rsp = rsp;
        r.rip = func;
        r.rax = 0;
        // Not a system call: no restart on the way back to user mode.
        r.orig_rax = u64::MAX;
        let slots = [
            &mut r.rdi, &mut r.rsi, &mut r.rdx, &mut r.rcx, &mut r.r8, &mut r.r9,
        ];
        for (slot, a) in slots.into_iter().zip(args) {
            *slot = *a;
        }
        set_regs(tid, &r)?;
        let mut sig = 0;
        let start = Instant::now();
        loop {
            ptrace(libc::PTRACE_CONT, tid, 0, sig as usize).map_err(|source| {
                InjectError::Ptrace {
                    tid,
                    what: "CONT",
                    source,
                }
            })?;
            // The others go on after HOLD_TIMEOUT (or half the call's time, if shorter).
            let hold = HOLD_TIMEOUT.min(self.call_timeout / 2);
            let status = loop {
                let others_held = self.threads.iter().any(|t| t.tid != tid && !t.running);
                let limit = if others_held { hold } else { self.call_timeout };
                match wait_stop(tid, limit.saturating_sub(start.elapsed())) {
                    Ok(None) if others_held => self.let_others_go(tid),
                    other => break other,
                }
            };
            let status = match status {
                Ok(Some(s)) => s,
                Ok(None) => return Err(self.give_up(tid, name, regs)),
                Err(e) => return Err(failed(format!("ended the thread: {e}"))),
            };
            if !libc::WIFSTOPPED(status) {
                return Err(failed(format!("ended the thread (status {status:#x})")));
            }
            let now = get_regs(tid)?;
            let stop = libc::WSTOPSIG(status);
            if status >> 16 == PTRACE_EVENT_STOP {
                // A group stop or an interrupt: go on.
                sig = 0;
                continue;
            }
            if stop == libc::SIGSEGV && now.rip == 0 {
                return Ok(now.rax);
            }
            if stop == libc::SIGSEGV || stop == libc::SIGBUS || stop == libc::SIGILL {
                return Err(failed(format!("faulted (signal {stop}) at {:#x}", now.rip)));
            }
            // A signal for the program: its handler runs as it would have (the call is
            // interrupted, as any code of the thread can be).
            sig = stop;
        }
    }

    /// The call in `tid` (made from the registers `regs`) did not return in time: take the
    /// thread back, and undo what the call did, if it can be known (see [`Held::undo`]).
    fn give_up(
        &mut self,
        tid: i32,
        func: &'static str,
        regs: &libc::user_regs_struct,
    ) -> InjectError {
        let s = self.call_timeout.as_secs_f64();
        let _ = ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
        match wait_stop(tid, STOP_TIMEOUT) {
            Ok(Some(status)) if libc::WIFSTOPPED(status) && status >> 16 != PTRACE_EVENT_STOP => {
                // A signal for the program stopped it first: delivered when it is let go.
                if let Some(t) = self.threads.iter_mut().find(|t| t.tid == tid) {
                    t.pending = libc::WSTOPSIG(status);
                }
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                return InjectError::CallTimeout {
                    tid,
                    func,
                    s,
                    why: "the thread does not stop".into(),
                }
            }
        }
        match self.undo(tid, regs) {
            Ok(how) => InjectError::CallUndone { tid, func, s, how },
            Err(why) => InjectError::CallTimeout { tid, func, s, why },
        }
    }

    /// Whether the unfinished call can be dropped as if it had never been made, and the
    /// thread's state it changed put back: so when the thread waits in `futex` for a mutex that
    /// another thread of the process holds (a `dlopen` waiting for the loader's lock, held by
    /// a thread inside a library's constructor), because then it has taken nothing yet. What
    /// such a call has changed is in the thread's own block (glibc points the thread's error
    /// catcher at a frame of `dlopen`): every word near the thread pointer that changed since
    /// the call began and now points into the call's frames gets its old value back. The
    /// registers and errno are put back by the caller, as after any call.
    fn undo(&mut self, tid: i32, regs: &libc::user_regs_struct) -> Result<String, String> {
        let now = get_regs(tid).map_err(|e| e.to_string())?;
        if now.orig_rax != libc::SYS_futex as u64 || !is_restartable(&now) {
            return Err(format!(
                "it is at {:#x} (system call {}), not waiting for a lock another thread holds",
                now.rip, now.orig_rax as i64
            ));
        }
        // FUTEX_WAIT or FUTEX_WAIT_BITSET, with FUTEX_PRIVATE_FLAG or not.
        let op = now.rsi & 0x7f;
        if op != 0 && op != 9 {
            return Err(format!("it is in futex operation {op}, not a wait"));
        }
        // pthread_mutex_t (bits/struct_mutex.h): __lock at 0, __count at 4, __owner at 8.
        let mut owner = [0u8; 4];
        self.read(now.rdi + 8, &mut owner)
            .map_err(|e| e.to_string())?;
        let owner = i32::from_ne_bytes(owner);
        let ours = owner > 0
            && owner != tid
            && std::path::Path::new(&format!("/proc/{}/task/{owner}", self.pid)).exists();
        if !ours {
            return Err(format!(
                "it waits on the futex at {:#x}, which is not a mutex another thread of the process holds (owner field {owner})",
                now.rdi
            ));
        }
        let Some((start, before)) = self.thread_block.take() else {
            return Err("its thread block was not read before the call".into());
        };
        let mut after = vec![0u8; before.len()];
        self.read(start, &mut after).map_err(|e| e.to_string())?;
        // The call's frames: from where it is now up to where it began.
        let frames = now.rsp..regs.rsp;
        let mut put_back = 0;
        for (i, (old, new)) in before
            .chunks_exact(8)
            .zip(after.chunks_exact(8))
            .enumerate()
        {
            let value = u64::from_ne_bytes(new.try_into().expect("8 bytes"));
            if old != new && frames.contains(&value) {
                self.write(start + 8 * i as u64, old)
                    .map_err(|e| e.to_string())?;
                put_back += 1;
            }
        }
        Ok(format!(
            "thread {tid} waited for the mutex at {:#x} that thread {owner} holds; {put_back} pointer(s) of its thread block into the call's frames put back",
            now.rdi
        ))
    }

    /// Read the words around the thread pointer of the calling thread (glibc's thread block
    /// above it, the static TLS below), for [`Held::undo`].
    fn read_thread_block(&mut self, regs: &libc::user_regs_struct) {
        let tp = regs.fs_base & !4095;
        // The page below and the page of the thread pointer, and the one after, as far as
        // they can be read.
        for (start, len) in [(tp - 4096, 3 * 4096), (tp, 2 * 4096), (tp, 4096)] {
            let mut buf = vec![0u8; len];
            if self.read(start, &mut buf).is_ok() {
                self.thread_block = Some((start, buf));
                return;
            }
        }
    }

    /// Detach every thread but `caller` (with the signal that stopped it, if one did), and
    /// record how long each was held.
    fn release_others(&mut self, caller: i32) {
        let now = Instant::now();
        for t in self.threads.iter().filter(|t| t.tid != caller) {
            if let Some(at) = t.stopped_at {
                self.figures
                    .held_us
                    .push((t.tid, now.duration_since(at).as_micros() as u64));
            }
            if let Err(e) = ptrace(libc::PTRACE_DETACH, t.tid, 0, t.pending as usize) {
                log::debug!("detach of thread {}: {e}", t.tid);
            }
        }
        self.threads.retain(|t| t.tid == caller);
    }

    /// A call is taking long: let every other thread go on (still seized), in case it holds
    /// what the call waits for.
    fn let_others_go(&mut self, caller: i32) {
        log::warn!(
            "a call in thread {caller} takes more than {} ms: the other threads go on meanwhile",
            HOLD_TIMEOUT.as_millis()
        );
        let now = Instant::now();
        for t in self.threads.iter_mut().filter(|t| t.tid != caller) {
            if let Some(at) = t.stopped_at.take() {
                self.figures
                    .held_us
                    .push((t.tid, now.duration_since(at).as_micros() as u64));
            }
            if ptrace(libc::PTRACE_CONT, t.tid, 0, t.pending as usize).is_ok() {
                t.pending = 0;
                t.running = true;
            }
        }
    }

    /// Let every thread go (restoring nothing: the caller's registers are already back), and
    /// record how long each was held. A thread let go earlier is stopped again first (a
    /// detach needs it stopped), and a signal that stopped it meanwhile goes with it.
    pub fn release(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        for t in self.threads.iter_mut().filter(|t| t.running) {
            let _ = ptrace(libc::PTRACE_INTERRUPT, t.tid, 0, 0);
            match wait_stop(t.tid, STOP_TIMEOUT) {
                Ok(Some(status))
                    if libc::WIFSTOPPED(status) && status >> 16 != PTRACE_EVENT_STOP =>
                {
                    // Stopped by a signal before the interrupt: delivered by the detach (which
                    // also clears the interrupt still pending).
                    t.pending = libc::WSTOPSIG(status);
                }
                _ => {}
            }
        }
        let now = Instant::now();
        for t in &self.threads {
            if let Some(at) = t.stopped_at {
                self.figures
                    .held_us
                    .push((t.tid, now.duration_since(at).as_micros() as u64));
            }
            if let Err(e) = ptrace(libc::PTRACE_DETACH, t.tid, 0, t.pending as usize) {
                log::debug!("detach of thread {}: {e}", t.tid);
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}

/// The registers of the calling thread as they were.
struct Saved {
    regs: libc::user_regs_struct,
    xstate: Vec<u8>,
}

impl Saved {
    fn take(tid: i32) -> Result<Saved, InjectError> {
        let regs = get_regs(tid)?;
        let mut xstate = vec![0u8; 16 * 1024];
        let mut iov = libc::iovec {
            iov_base: xstate.as_mut_ptr().cast(),
            iov_len: xstate.len(),
        };
        ptrace(
            libc::PTRACE_GETREGSET,
            tid,
            NT_X86_XSTATE as usize,
            std::ptr::addr_of_mut!(iov) as usize,
        )
        .map_err(|source| InjectError::Ptrace {
            tid,
            what: "GETREGSET NT_X86_XSTATE",
            source,
        })?;
        xstate.truncate(iov.iov_len);
        Ok(Saved { regs, xstate })
    }

    fn restore(mut self, tid: i32) -> Result<(), InjectError> {
        let mut iov = libc::iovec {
            iov_base: self.xstate.as_mut_ptr().cast(),
            iov_len: self.xstate.len(),
        };
        let x = ptrace(
            libc::PTRACE_SETREGSET,
            tid,
            NT_X86_XSTATE as usize,
            std::ptr::addr_of_mut!(iov) as usize,
        );
        set_regs(tid, &self.regs)?;
        x.map_err(|source| InjectError::Ptrace {
            tid,
            what: "SETREGSET NT_X86_XSTATE",
            source,
        })?;
        Ok(())
    }
}

fn get_regs(tid: i32) -> Result<libc::user_regs_struct, InjectError> {
    // SAFETY: user_regs_struct is plain integers; all zero is a valid value.
    let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    ptrace(
        libc::PTRACE_GETREGS,
        tid,
        0,
        std::ptr::addr_of_mut!(r) as usize,
    )
    .map_err(|source| InjectError::Ptrace {
        tid,
        what: "GETREGS",
        source,
    })?;
    Ok(r)
}

fn set_regs(tid: i32, r: &libc::user_regs_struct) -> Result<(), InjectError> {
    ptrace(libc::PTRACE_SETREGS, tid, 0, std::ptr::from_ref(r) as usize).map_err(|source| {
        InjectError::Ptrace {
            tid,
            what: "SETREGS",
            source,
        }
    })?;
    Ok(())
}

/// Whether a thread stopped inside a system call the kernel will restart when it goes on.
pub fn is_restartable(r: &libc::user_regs_struct) -> bool {
    // -ERESTARTSYS, -ERESTARTNOINTR, -ERESTARTNOHAND, -ERESTART_RESTARTBLOCK.
    (r.orig_rax as i64) >= 0 && matches!(r.rax as i64, -516..=-512)
}

/// The thread ids of `pid`.
fn tasks(pid: i32) -> std::io::Result<Vec<i32>> {
    let mut v: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// The agent's path as the process must be given it (absolute, symlinks resolved).
pub fn agent_path(agent: &Path) -> std::io::Result<PathBuf> {
    std::fs::canonicalize(agent)
}
