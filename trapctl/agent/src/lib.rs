//! `libtrapvec_agent.so`: splice a running, dynamically linked program without recompiling it.
//!
//! `LD_PRELOAD=libtrapvec_agent.so TRAPVEC_SPEC=spec.toml ./program`: before `main`, the agent
//! loads the spec's components and applies its splices in one batch. A spec that cannot be
//! applied is reported on stderr and the program exits with status 86 before `main`, with nothing
//! applied. At exit the agent writes the JSON file named by `TRAPVEC_STATS`:
//! `{"splices": [{"at": "...", "mechanism": "trap"|"jmp", "hits": N}, ...]}` in spec order.
//! Logging: `TRAPVEC_LOG=debug` (env_logger syntax).

use std::sync::Mutex;

use instr_manager::apply::{apply_spec, Applied};
use instr_manager::session::default_near;
use instr_manager::spec::Spec;
use instr_manager::splicer::Splicer;
use trapvec::process::ProcessTarget;

/// Exit status of a program whose spec could not be applied.
pub const EXIT_SPEC_FAILED: i32 = 86;

struct State {
    splicer: Splicer<ProcessTarget>,
    applied: Applied,
    stats: Option<String>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = trapvec_agent_init;

extern "C" fn trapvec_agent_init() {
    let Some(spec_path) = std::env::var_os("TRAPVEC_SPEC") else { return };
    let _ = env_logger::Builder::from_env(env_logger::Env::new().filter_or("TRAPVEC_LOG", "warn")).try_init();
    let spec_path = std::path::PathBuf::from(spec_path);
    let result = (|| -> Result<State, String> {
        let spec = Spec::from_path(&spec_path).map_err(|e| e.to_string())?;
        let target = ProcessTarget::new().map_err(|e| e.to_string())?;
        let mut splicer = Splicer::new(target);
        let near = default_near(splicer.target());
        let applied = apply_spec(&mut splicer, &spec, near).map_err(|e| error_chain(&e))?;
        Ok(State { splicer, applied, stats: std::env::var("TRAPVEC_STATS").ok() })
    })();
    match result {
        Ok(state) => {
            log::info!("trapvec: applied {} splices from {}", state.applied.splices.len(), spec_path.display());
            *STATE.lock().unwrap_or_else(|e| e.into_inner()) = Some(state);
            // SAFETY: registering a plain extern "C" function with no arguments.
            unsafe { libc::atexit(trapvec_agent_exit) };
        }
        Err(e) => {
            eprintln!("trapvec: cannot apply {}: {e}", spec_path.display());
            // SAFETY: leaving before main, without running the program's destructors.
            unsafe { libc::_exit(EXIT_SPEC_FAILED) };
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

extern "C" fn trapvec_agent_exit() {
    let guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(state) = guard.as_ref() else { return };
    let Some(path) = &state.stats else { return };
    let splices: Vec<serde_json::Value> = state
        .applied
        .splices
        .iter()
        .map(|(at, mech, id)| {
            let hits = state.splicer.hits(*id).map(|h| h.hits).unwrap_or(0);
            serde_json::json!({ "at": at, "mechanism": mech, "hits": hits })
        })
        .collect();
    let doc = serde_json::json!({ "splices": splices });
    if let Err(e) = std::fs::write(path, format!("{doc:#}\n")) {
        eprintln!("trapvec: cannot write stats to {path}: {e}");
    }
}
