//! Issue 2's batch figure: the time to apply and to remove N splices in one all-or-nothing batch
//! (N small functions of a shared object built at run time, one `call` splice each with an empty
//! handler), on the process backend.

use std::time::{Duration, Instant};

use instr_manager::session::{Session, SessionError};
use instr_manager::splicer::{Action, SpliceError, SpliceRequest};
use instr_manager::Mechanism;
use thiserror::Error;

use crate::fixtures::{self, Fixture, FixtureError};

/// Timing a batch failed.
#[derive(Debug, Error)]
pub enum BatchError {
    #[error(transparent)]
    Fixture(#[from] FixtureError),
    #[error(transparent)]
    Session(Box<SessionError>),
    #[error("{what} the batch of {n} splices")]
    Splice {
        what: &'static str,
        n: usize,
        #[source]
        source: Box<SpliceError>,
    },
    #[error("f0 through its splice returned {got}, not 42")]
    WrongResult { got: i32 },
}

impl From<SessionError> for BatchError {
    fn from(e: SessionError) -> Self {
        BatchError::Session(Box::new(e))
    }
}

/// Apply and remove times of one batch.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BatchTiming {
    pub splices: usize,
    pub mechanism: String,
    pub apply_ms: f64,
    pub remove_ms: f64,
}

impl BatchTiming {
    pub fn render(&self) -> String {
        format!(
            "{} {} splices in one batch: apply {:.1} ms, remove {:.1} ms (issue 2 target <= 100 ms each)",
            self.splices, self.mechanism, self.apply_ms, self.remove_ms
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Apply `n` splices of `mech` in one batch, call one, remove them all in one batch.
pub fn measure(n: usize, mech: Mechanism) -> Result<BatchTiming, BatchError> {
    let fx = Fixture::build()?;
    let (_so, handle) = fixtures::many_functions(n)?;
    let session = Session::open()?;
    session.refresh_symbols()?;
    let comp = session.load(&fx.handler)?;
    let requests: Vec<SpliceRequest> = (0..n)
        .map(|i| SpliceRequest {
            at: format!("f{i}"),
            action: Action::Call {
                handler: "empty_handler".into(),
                cookie: 0,
            },
            mechanism: mech,
            options: Default::default(),
        })
        .collect();
    let t0 = Instant::now();
    let ids = session
        .with(|s| s.apply(&requests))
        .map_err(|e| BatchError::Splice {
            what: "applying",
            n,
            source: Box::new(e),
        })?;
    let apply = t0.elapsed();
    let f0 = handle.sym("f0")?;
    // SAFETY: `f0` has the C signature `int f0(int)` (fixtures::many_functions).
    let f: extern "C" fn(i32) -> i32 = unsafe { std::mem::transmute(f0) };
    let got = f(41);
    if got != 42 {
        return Err(BatchError::WrongResult { got });
    }
    let t1 = Instant::now();
    session
        .with(|s| s.remove(&ids))
        .map_err(|e| BatchError::Splice {
            what: "removing",
            n,
            source: Box::new(e),
        })?;
    let remove = t1.elapsed();
    drop(comp);
    Ok(BatchTiming {
        splices: n,
        mechanism: mech.to_string(),
        apply_ms: ms(apply),
        remove_ms: ms(remove),
    })
}
