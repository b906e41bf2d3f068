//! The library API for a process modifying itself, with RAII handles: dropping a
//! [`SpliceHandle`] removes the splice, dropping the last [`ComponentHandle`] (splices keep their
//! component alive) unloads the component. A front end over [`crate::ops`]: loading applies the
//! splices a component declares (they live as long as the component), components are placed by
//! [`ops::near`], unloading removes the declared splices first.
//!
//! ```no_run
//! use instr_manager::session::Session;
//! use instr_manager::Mechanism;
//! let session = Session::open()?;
//! let comp = session.load("handler.o")?;
//! let splice = session.splice_call("compute+0", &comp, "count_compute", Mechanism::Trap)?;
//! // ... run compute() ...
//! println!("{} hits", splice.hits()?);
//! drop(splice); // the original bytes are back
//! # Ok::<(), instr_manager::session::SessionError>(())
//! ```

// A session's errors carry the splicer's whole (callers match on `SessionError::Splice`).
#![allow(clippy::result_large_err)]

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use component_manager::{ComponentId, LoadOptions};
use trapvec::process::ProcessTarget;

use crate::ops;
use crate::plan::Mechanism;
use crate::splice::{SpliceOptions, When};
use crate::splicer::{Action, Hits, SpliceError, SpliceId, SpliceRequest, Splicer};
use trapvec::keyed::{KeyBy, KeyCounts};
use trapvec::returns::{Clock, ReturnStats};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Op(Box<ops::OpError>),
    #[error(transparent)]
    Splice(#[from] SpliceError),
    #[error(transparent)]
    Target(#[from] trapvec::TargetError),
}

/// A splicer's refusal stays a [`SessionError::Splice`] whichever operation met it.
impl From<ops::OpError> for SessionError {
    fn from(e: ops::OpError) -> Self {
        match e {
            ops::OpError::Splice(s) => SessionError::Splice(s),
            other => SessionError::Op(Box::new(other)),
        }
    }
}

type Shared = Arc<Mutex<Splicer<ProcessTarget>>>;

fn lock(s: &Shared) -> MutexGuard<'_, Splicer<ProcessTarget>> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// The running process, ready to be spliced.
#[derive(Clone)]
pub struct Session {
    inner: Shared,
}

struct ComponentInner {
    session: Shared,
    id: ComponentId,
    name: String,
}

impl Drop for ComponentInner {
    fn drop(&mut self) {
        if let Err(e) = ops::unload_id(&mut lock(&self.session), self.id) {
            log::error!(
                "unloading component {}: {}",
                self.name,
                trapvec::error_chain(&e)
            );
        }
    }
}

/// A loaded component; unloaded when the last handle and the last splice using it are gone.
#[derive(Clone)]
pub struct ComponentHandle {
    inner: Arc<ComponentInner>,
}

impl ComponentHandle {
    pub fn id(&self) -> ComponentId {
        self.inner.id
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Address of one of the component's symbols.
    pub fn symbol(&self, name: &str) -> Option<u64> {
        let s = lock(&self.inner.session);
        let c = s.components().get(self.inner.id)?;
        c.symbols
            .iter()
            .find(|sym| sym.name == name)
            .map(|sym| sym.addr)
    }
}

/// A live splice; removed (original bytes restored) when dropped.
pub struct SpliceHandle {
    session: Shared,
    id: SpliceId,
    removed: bool,
    /// Keeps the component loaded while the splice lives.
    _component: Option<ComponentHandle>,
}

impl SpliceHandle {
    pub fn id(&self) -> SpliceId {
        self.id
    }

    /// Hits so far.
    pub fn hits(&self) -> Result<u64, SessionError> {
        Ok(lock(&self.session).hits(self.id)?.hits)
    }

    /// A return point's or timer's figures so far (`None` for other splices).
    pub fn return_stats(&self) -> Result<Option<ReturnStats>, SessionError> {
        Ok(lock(&self.session).return_stats(self.id)?)
    }

    /// A keyed count's table so far (`None` for other splices).
    pub fn key_counts(&self) -> Result<Option<KeyCounts>, SessionError> {
        Ok(lock(&self.session).key_counts(self.id)?)
    }

    /// Remove now, returning the final counters (dropping removes too, logging any error).
    pub fn remove(mut self) -> Result<Hits, SessionError> {
        self.removed = true;
        Ok(lock(&self.session)
            .remove(&[self.id])?
            .pop()
            .unwrap_or_default())
    }
}

impl Drop for SpliceHandle {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        if let Err(e) = lock(&self.session).remove(&[self.id]) {
            log::error!(
                "removing splice {}: {}",
                self.id.0,
                trapvec::error_chain(&e)
            );
        }
    }
}

impl Session {
    /// Open the process backend (installs the trap handlers once per process).
    pub fn open() -> Result<Session, SessionError> {
        Ok(Session {
            inner: Arc::new(Mutex::new(Splicer::new(ProcessTarget::new()?))),
        })
    }

    /// Run `f` with the splicer (for what the handles do not cover).
    pub fn with<R>(&self, f: impl FnOnce(&mut Splicer<ProcessTarget>) -> R) -> R {
        f(&mut lock(&self.inner))
    }

    /// Re-read the process's symbols (after `dlopen`).
    pub fn refresh_symbols(&self) -> Result<(), SessionError> {
        Ok(lock(&self.inner).target_mut().refresh_symbols()?)
    }

    /// Load a component from an ELF relocatable file, with the splices it declares.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<ComponentHandle, SessionError> {
        self.load_with(path, &LoadOptions::default())
    }

    /// Load with options (expected CRC32, placement: 0 for [`ops::near`]).
    pub fn load_with(
        &self,
        path: impl AsRef<Path>,
        opts: &LoadOptions,
    ) -> Result<ComponentHandle, SessionError> {
        let (loaded, made) = ops::load(&mut lock(&self.inner), path.as_ref(), opts)?;
        let id = made.components[0];
        Ok(ComponentHandle {
            inner: Arc::new(ComponentInner {
                session: self.inner.clone(),
                id,
                name: loaded.component.name,
            }),
        })
    }

    /// Make any splice `req` (its handler a symbol of `component`, which the handle keeps
    /// loaded): the general form of the methods below, for options they do not take (a task
    /// predicate, [`crate::splice::SpliceOptions::only`]).
    pub fn splice_request(
        &self,
        req: SpliceRequest,
        component: Option<&ComponentHandle>,
    ) -> Result<SpliceHandle, SessionError> {
        self.splice(req, component)
    }

    fn splice(
        &self,
        req: SpliceRequest,
        component: Option<&ComponentHandle>,
    ) -> Result<SpliceHandle, SessionError> {
        let (_, made) = ops::splice(&mut lock(&self.inner), &req)?;
        Ok(SpliceHandle {
            session: self.inner.clone(),
            id: made.splices[0],
            removed: false,
            _component: component.cloned(),
        })
    }

    /// Run `handler` (a symbol of `component`) at `at`, then the original code.
    pub fn splice_call(
        &self,
        at: &str,
        component: &ComponentHandle,
        handler: &str,
        mechanism: Mechanism,
    ) -> Result<SpliceHandle, SessionError> {
        self.splice_call_cookie(at, component, handler, 0, mechanism)
    }

    /// As [`Session::splice_call`], passing `cookie` to the handler.
    pub fn splice_call_cookie(
        &self,
        at: &str,
        component: &ComponentHandle,
        handler: &str,
        cookie: u64,
        mechanism: Mechanism,
    ) -> Result<SpliceHandle, SessionError> {
        let req = SpliceRequest {
            at: at.to_string(),
            action: Action::Call {
                handler: handler.to_string(),
                cookie,
            },
            mechanism,
            options: Default::default(),
        };
        self.splice(req, Some(component))
    }

    /// Run `handler` (a `trapvec_return_handler_t` of `component`) each time the function at
    /// `at` returns, with at most `maxactive` calls in progress at once (`None`: the default).
    pub fn splice_return(
        &self,
        at: &str,
        component: &ComponentHandle,
        handler: &str,
        cookie: u64,
        maxactive: Option<u32>,
        mechanism: Mechanism,
    ) -> Result<SpliceHandle, SessionError> {
        let mut req = SpliceRequest::new(
            at,
            Action::Call {
                handler: handler.to_string(),
                cookie,
            },
            mechanism,
        );
        req.options = SpliceOptions {
            when: When::Return,
            maxactive,
            ..SpliceOptions::default()
        };
        self.splice(req, Some(component))
    }

    /// Count the returns of the function at `at` (a return point with no handler).
    pub fn count_returns(
        &self,
        at: &str,
        maxactive: Option<u32>,
        mechanism: Mechanism,
    ) -> Result<SpliceHandle, SessionError> {
        let mut req = SpliceRequest::new(at, Action::Count, mechanism);
        req.options = SpliceOptions {
            when: When::Return,
            maxactive,
            ..SpliceOptions::default()
        };
        self.splice(req, None)
    }

    /// Count the hits at `at` by `by` ([`SpliceHandle::key_counts`]).
    pub fn count_by(
        &self,
        at: &str,
        by: KeyBy,
        mechanism: Mechanism,
    ) -> Result<SpliceHandle, SessionError> {
        let mut req = SpliceRequest::new(at, Action::Count, mechanism);
        req.options.by = Some(by);
        self.splice(req, None)
    }

    /// Time each call of the function at `at` with `clock` ([`SpliceHandle::return_stats`]).
    pub fn time(
        &self,
        at: &str,
        clock: Clock,
        mechanism: Mechanism,
    ) -> Result<SpliceHandle, SessionError> {
        self.splice(
            SpliceRequest::new(at, Action::Time { clock }, mechanism),
            None,
        )
    }

    /// Send calls of the function at `at` to `with` (a symbol of `component`).
    pub fn splice_replace(
        &self,
        at: &str,
        component: &ComponentHandle,
        with: &str,
        mechanism: Mechanism,
    ) -> Result<SpliceHandle, SessionError> {
        let req = SpliceRequest {
            at: at.to_string(),
            action: Action::Replace {
                with: with.to_string(),
            },
            mechanism,
            options: Default::default(),
        };
        self.splice(req, Some(component))
    }
}
