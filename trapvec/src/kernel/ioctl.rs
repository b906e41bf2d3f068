//! The one way to talk to `kmod/`: [`ioctl`] sends a [`Request`] to `/dev/trapvec`.
//!
//! Every ioctl of the kernel backend goes through [`ioctl`], so a unit test can put a fake
//! module in its place (`fake::override_ioctl`, test builds only) and check the backend's logic
//! on any host. Requests carry the argument struct *and* the slices its pointer fields refer to;
//! [`ioctl`] fills those fields from the slices itself, so no user pointer outlives the borrow
//! it was taken from and callers never handle raw addresses of their own memory.

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

use crate::abi::{
    TrapvecAlloc, TrapvecApply, TrapvecBlock, TrapvecCheck, TrapvecCheckMany, TrapvecDispatchAdd,
    TrapvecDispatchEntry, TrapvecDispatchRemove, TrapvecDispatchReplace, TrapvecHits, TrapvecInfo,
    TrapvecKeyAdd, TrapvecKeyEntry, TrapvecKeyRemove, TrapvecKeyStats, TrapvecList,
    TrapvecListEntry, TrapvecPatch, TrapvecQuiesce, TrapvecRead, TrapvecReturnAdd,
    TrapvecReturnRemove, TrapvecReturnStats, TrapvecState, TrapvecWrite, TRAPVEC_IOC_ALLOC,
    TRAPVEC_IOC_APPLY, TRAPVEC_IOC_CHECK, TRAPVEC_IOC_CHECK_MANY, TRAPVEC_IOC_DISPATCH_ADD,
    TRAPVEC_IOC_DISPATCH_REMOVE, TRAPVEC_IOC_DISPATCH_REPLACE, TRAPVEC_IOC_FREE, TRAPVEC_IOC_HITS,
    TRAPVEC_IOC_INFO, TRAPVEC_IOC_KEY_ADD, TRAPVEC_IOC_KEY_REMOVE, TRAPVEC_IOC_KEY_STATS,
    TRAPVEC_IOC_LIST, TRAPVEC_IOC_LIST_HIT, TRAPVEC_IOC_QUIESCE, TRAPVEC_IOC_READ,
    TRAPVEC_IOC_RETURN_ADD, TRAPVEC_IOC_RETURN_REMOVE, TRAPVEC_IOC_RETURN_STATS, TRAPVEC_IOC_SEAL,
    TRAPVEC_IOC_STATE_GET, TRAPVEC_IOC_STATE_PUT, TRAPVEC_IOC_WRITE,
};

/// One ioctl with its argument, and the memory its pointer fields name.
#[derive(Debug)]
pub(crate) enum Request<'a> {
    Info(&'a mut TrapvecInfo),
    /// `arg.buf`/`arg.len` are set from `buf`.
    Read {
        arg: &'a mut TrapvecRead,
        buf: &'a mut [u8],
    },
    Alloc(&'a mut TrapvecAlloc),
    /// `arg.buf`/`arg.len` are set from `bytes`.
    Write {
        arg: &'a mut TrapvecWrite,
        bytes: &'a [u8],
    },
    Seal(&'a mut TrapvecBlock),
    Free(&'a mut TrapvecBlock),
    Check(&'a mut TrapvecCheck),
    /// `arg.checks`/`arg.count` are set from `checks`, which the module answers in place.
    CheckMany {
        arg: &'a mut TrapvecCheckMany,
        checks: &'a mut [TrapvecCheck],
    },
    /// `arg.patches`/`arg.count` are set from `patches`.
    Apply {
        arg: &'a mut TrapvecApply,
        patches: &'a [TrapvecPatch],
    },
    /// `arg.entries`/`arg.count` are set from `entries`.
    DispatchAdd {
        arg: &'a mut TrapvecDispatchAdd,
        entries: &'a [TrapvecDispatchEntry],
    },
    /// `arg.sites`/`arg.count` are set from `sites`.
    DispatchRemove {
        arg: &'a mut TrapvecDispatchRemove,
        sites: &'a [u64],
    },
    /// `arg.entries`/`arg.counts`/`arg.count` are set from `entries` and `counts` (of the same
    /// length: in, the new entries' starting counts; out, the old entries' final ones).
    DispatchReplace {
        arg: &'a mut TrapvecDispatchReplace,
        entries: &'a [TrapvecDispatchEntry],
        counts: &'a mut [TrapvecHits],
    },
    Hits(&'a mut TrapvecHits),
    /// `arg.entries`/`arg.capacity` are set from `out`. LIST, or with `hit` LIST_HIT (the
    /// entries hit at least once only).
    List {
        arg: &'a mut TrapvecList,
        out: &'a mut [TrapvecListEntry],
        hit: bool,
    },
    Quiesce(&'a mut TrapvecQuiesce),
    /// `arg.buf`/`arg.len` are set from `buf`.
    StateGet {
        arg: &'a mut TrapvecState,
        buf: &'a mut [u8],
    },
    /// `arg.buf`/`arg.len` are set from `bytes`.
    StatePut {
        arg: &'a mut TrapvecState,
        bytes: &'a [u8],
    },
    ReturnAdd(&'a mut TrapvecReturnAdd),
    ReturnRemove(&'a mut TrapvecReturnRemove),
    ReturnStats(&'a mut TrapvecReturnStats),
    KeyAdd(&'a mut TrapvecKeyAdd),
    KeyRemove(&'a mut TrapvecKeyRemove),
    /// `arg.entries`/`arg.capacity` are set from `out`.
    KeyStats {
        arg: &'a mut TrapvecKeyStats,
        out: &'a mut [TrapvecKeyEntry],
    },
    Watch(&'a mut crate::abi::TrapvecWatch),
    Modevent(&'a mut crate::abi::TrapvecModevent),
    Modack(&'a mut crate::abi::TrapvecModack),
}

impl Request<'_> {
    /// The ioctl's name, for messages.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Request::Info(_) => "INFO",
            Request::Read { .. } => "READ",
            Request::Alloc(_) => "ALLOC",
            Request::Write { .. } => "WRITE",
            Request::Seal(_) => "SEAL",
            Request::Free(_) => "FREE",
            Request::Check(_) => "CHECK",
            Request::CheckMany { .. } => "CHECK_MANY",
            Request::Apply { .. } => "APPLY",
            Request::DispatchAdd { .. } => "DISPATCH_ADD",
            Request::DispatchRemove { .. } => "DISPATCH_REMOVE",
            Request::DispatchReplace { .. } => "DISPATCH_REPLACE",
            Request::Hits(_) => "HITS",
            Request::List { hit: false, .. } => "LIST",
            Request::List { hit: true, .. } => "LIST_HIT",
            Request::Quiesce(_) => "QUIESCE",
            Request::StateGet { .. } => "STATE_GET",
            Request::StatePut { .. } => "STATE_PUT",
            Request::ReturnAdd(_) => "RETURN_ADD",
            Request::ReturnRemove(_) => "RETURN_REMOVE",
            Request::ReturnStats(_) => "RETURN_STATS",
            Request::KeyAdd(_) => "KEY_ADD",
            Request::KeyRemove(_) => "KEY_REMOVE",
            Request::KeyStats { .. } => "KEY_STATS",
            Request::Watch(_) => "WATCH",
            Request::Modevent(_) => "MODEVENT",
            Request::Modack(_) => "MODACK",
        }
    }

    /// Point the argument's pointer and length fields at the request's slices.
    fn bind(&mut self) -> Result<(), Errno> {
        fn count(len: usize) -> Result<u32, Errno> {
            u32::try_from(len).map_err(|_| Errno::E2BIG)
        }
        fn addr<T>(p: *const T) -> u64 {
            p as usize as u64
        }
        match self {
            Request::Read { arg, buf } => {
                arg.buf = addr(buf.as_mut_ptr());
                arg.len = count(buf.len())?;
            }
            Request::Write { arg, bytes } => {
                arg.buf = addr(bytes.as_ptr());
                arg.len = count(bytes.len())?;
            }
            Request::CheckMany { arg, checks } => {
                arg.checks = addr(checks.as_mut_ptr());
                arg.count = count(checks.len())?;
            }
            Request::Apply { arg, patches } => {
                arg.patches = addr(patches.as_ptr());
                arg.count = count(patches.len())?;
            }
            Request::DispatchAdd { arg, entries } => {
                arg.entries = addr(entries.as_ptr());
                arg.count = count(entries.len())?;
            }
            Request::DispatchRemove { arg, sites } => {
                arg.sites = addr(sites.as_ptr());
                arg.count = count(sites.len())?;
            }
            Request::DispatchReplace {
                arg,
                entries,
                counts,
            } => {
                if entries.len() != counts.len() {
                    return Err(Errno::EINVAL);
                }
                arg.entries = addr(entries.as_ptr());
                arg.counts = addr(counts.as_mut_ptr());
                arg.count = count(entries.len())?;
            }
            Request::List { arg, out, .. } => {
                arg.entries = addr(out.as_mut_ptr());
                arg.capacity = count(out.len())?;
            }
            Request::StateGet { arg, buf } => {
                arg.buf = addr(buf.as_mut_ptr());
                arg.len = buf.len() as u64;
            }
            Request::StatePut { arg, bytes } => {
                arg.buf = addr(bytes.as_ptr());
                arg.len = bytes.len() as u64;
            }
            Request::KeyStats { arg, out } => {
                arg.entries = addr(out.as_mut_ptr());
                arg.capacity = count(out.len())?;
            }
            Request::Info(_)
            | Request::Alloc(_)
            | Request::Seal(_)
            | Request::Free(_)
            | Request::Check(_)
            | Request::Hits(_)
            | Request::Quiesce(_)
            | Request::ReturnAdd(_)
            | Request::ReturnRemove(_)
            | Request::ReturnStats(_)
            | Request::KeyAdd(_)
            | Request::KeyRemove(_)
            | Request::Watch(_)
            | Request::Modevent(_)
            | Request::Modack(_) => {}
        }
        Ok(())
    }
}

nix::ioctl_readwrite_bad!(ioc_info, TRAPVEC_IOC_INFO, TrapvecInfo);
nix::ioctl_readwrite_bad!(ioc_read, TRAPVEC_IOC_READ, TrapvecRead);
nix::ioctl_readwrite_bad!(ioc_alloc, TRAPVEC_IOC_ALLOC, TrapvecAlloc);
nix::ioctl_readwrite_bad!(ioc_write, TRAPVEC_IOC_WRITE, TrapvecWrite);
nix::ioctl_readwrite_bad!(ioc_seal, TRAPVEC_IOC_SEAL, TrapvecBlock);
nix::ioctl_readwrite_bad!(ioc_free, TRAPVEC_IOC_FREE, TrapvecBlock);
nix::ioctl_readwrite_bad!(ioc_check, TRAPVEC_IOC_CHECK, TrapvecCheck);
nix::ioctl_readwrite_bad!(ioc_check_many, TRAPVEC_IOC_CHECK_MANY, TrapvecCheckMany);
nix::ioctl_readwrite_bad!(ioc_apply, TRAPVEC_IOC_APPLY, TrapvecApply);
nix::ioctl_readwrite_bad!(
    ioc_dispatch_add,
    TRAPVEC_IOC_DISPATCH_ADD,
    TrapvecDispatchAdd
);
nix::ioctl_readwrite_bad!(
    ioc_dispatch_remove,
    TRAPVEC_IOC_DISPATCH_REMOVE,
    TrapvecDispatchRemove
);
nix::ioctl_readwrite_bad!(
    ioc_dispatch_replace,
    TRAPVEC_IOC_DISPATCH_REPLACE,
    TrapvecDispatchReplace
);
nix::ioctl_readwrite_bad!(ioc_hits, TRAPVEC_IOC_HITS, TrapvecHits);
nix::ioctl_readwrite_bad!(ioc_list, TRAPVEC_IOC_LIST, TrapvecList);
nix::ioctl_readwrite_bad!(ioc_list_hit, TRAPVEC_IOC_LIST_HIT, TrapvecList);
nix::ioctl_readwrite_bad!(ioc_quiesce, TRAPVEC_IOC_QUIESCE, TrapvecQuiesce);
nix::ioctl_readwrite_bad!(ioc_state_get, TRAPVEC_IOC_STATE_GET, TrapvecState);
nix::ioctl_readwrite_bad!(ioc_state_put, TRAPVEC_IOC_STATE_PUT, TrapvecState);
nix::ioctl_readwrite_bad!(ioc_return_add, TRAPVEC_IOC_RETURN_ADD, TrapvecReturnAdd);
nix::ioctl_readwrite_bad!(
    ioc_return_remove,
    TRAPVEC_IOC_RETURN_REMOVE,
    TrapvecReturnRemove
);
nix::ioctl_readwrite_bad!(
    ioc_return_stats,
    TRAPVEC_IOC_RETURN_STATS,
    TrapvecReturnStats
);
nix::ioctl_readwrite_bad!(ioc_key_add, TRAPVEC_IOC_KEY_ADD, TrapvecKeyAdd);
nix::ioctl_readwrite_bad!(ioc_key_remove, TRAPVEC_IOC_KEY_REMOVE, TrapvecKeyRemove);
nix::ioctl_readwrite_bad!(ioc_key_stats, TRAPVEC_IOC_KEY_STATS, TrapvecKeyStats);
nix::ioctl_readwrite_bad!(
    ioc_watch,
    crate::abi::TRAPVEC_IOC_WATCH,
    crate::abi::TrapvecWatch
);
nix::ioctl_readwrite_bad!(
    ioc_modevent,
    crate::abi::TRAPVEC_IOC_MODEVENT,
    crate::abi::TrapvecModevent
);
nix::ioctl_readwrite_bad!(
    ioc_modack,
    crate::abi::TRAPVEC_IOC_MODACK,
    crate::abi::TrapvecModack
);

/// Send `req` to the module behind `dev`. Returns the errno of a failed call; output fields of
/// the argument are filled in either way (the module reports failure details with the error).
pub(crate) fn ioctl(dev: BorrowedFd<'_>, mut req: Request<'_>) -> Result<(), Errno> {
    req.bind()?;
    log::trace!("ioctl {}", req.name());
    #[cfg(test)]
    if let Some(result) = fake::intercept(&mut req) {
        return result;
    }
    let fd = dev.as_raw_fd();
    // SAFETY: each call passes a pointer to an argument struct that `req` borrows mutably for
    // the whole call, of the type the request code was built from (abi.rs), so the module
    // reads and writes exactly that struct. The pointer fields inside it were set by `bind()`
    // from slices `req` also borrows (mutably where the module writes: READ's buffer, CHECK_MANY's
    // checks, LIST's output, STATE_GET's buffer, KEY_STATS's output, DISPATCH_REPLACE's counts),
    // with their exact lengths, so every user address the module
    // touches is valid for the call. The module keeps no pointer after returning.
    let res = unsafe {
        match req {
            Request::Info(a) => ioc_info(fd, a),
            Request::Read { arg, .. } => ioc_read(fd, arg),
            Request::Alloc(a) => ioc_alloc(fd, a),
            Request::Write { arg, .. } => ioc_write(fd, arg),
            Request::Seal(a) => ioc_seal(fd, a),
            Request::Free(a) => ioc_free(fd, a),
            Request::Check(a) => ioc_check(fd, a),
            Request::CheckMany { arg, .. } => ioc_check_many(fd, arg),
            Request::Apply { arg, .. } => ioc_apply(fd, arg),
            Request::DispatchAdd { arg, .. } => ioc_dispatch_add(fd, arg),
            Request::DispatchRemove { arg, .. } => ioc_dispatch_remove(fd, arg),
            Request::DispatchReplace { arg, .. } => ioc_dispatch_replace(fd, arg),
            Request::Hits(a) => ioc_hits(fd, a),
            Request::List {
                arg, hit: false, ..
            } => ioc_list(fd, arg),
            Request::List { arg, hit: true, .. } => ioc_list_hit(fd, arg),
            Request::Quiesce(a) => ioc_quiesce(fd, a),
            Request::StateGet { arg, .. } => ioc_state_get(fd, arg),
            Request::StatePut { arg, .. } => ioc_state_put(fd, arg),
            Request::ReturnAdd(a) => ioc_return_add(fd, a),
            Request::ReturnRemove(a) => ioc_return_remove(fd, a),
            Request::ReturnStats(a) => ioc_return_stats(fd, a),
            Request::KeyAdd(a) => ioc_key_add(fd, a),
            Request::KeyRemove(a) => ioc_key_remove(fd, a),
            Request::KeyStats { arg, .. } => ioc_key_stats(fd, arg),
            Request::Watch(a) => ioc_watch(fd, a),
            Request::Modevent(a) => ioc_modevent(fd, a),
            Request::Modack(a) => ioc_modack(fd, a),
        }
    };
    res.map(drop)
}

/// The seam's test side: replace the module for the current thread.
#[cfg(test)]
pub(crate) mod fake {
    use std::cell::RefCell;

    use nix::errno::Errno;

    use super::Request;

    type Handler = Box<dyn for<'a> FnMut(&mut Request<'a>) -> Result<(), Errno>>;

    thread_local! {
        static OVERRIDE: RefCell<Option<Handler>> = const { RefCell::new(None) };
    }

    /// Every ioctl of this thread goes to `f` until the returned guard is dropped.
    pub(crate) fn override_ioctl(
        f: impl for<'a> FnMut(&mut Request<'a>) -> Result<(), Errno> + 'static,
    ) -> Guard {
        OVERRIDE.with(|o| *o.borrow_mut() = Some(Box::new(f)));
        Guard
    }

    /// Restores the real ioctl when dropped.
    pub(crate) struct Guard;

    impl Drop for Guard {
        fn drop(&mut self) {
            OVERRIDE.with(|o| *o.borrow_mut() = None);
        }
    }

    pub(super) fn intercept(req: &mut Request<'_>) -> Option<Result<(), Errno>> {
        OVERRIDE.with(|o| o.borrow_mut().as_mut().map(|f| f(req)))
    }
}
