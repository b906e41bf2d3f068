//! Pending points: splices at `MOD:sym` (`MOD:sym+off`) in a kernel module that is not loaded.
//!
//! trapd accepts such a splice as *pending* and holds it here. When the module comes, the
//! module watch (`trapvec::kernel::modwatch`, [`watch_loop`]) holds its load before its init
//! runs; the daemon refreshes its symbol table, makes every pending splice of that module
//! (deferred patches: they take no reference on the module) and answers, so a splice on a
//! function the module's init calls counts those calls. When the module goes (after its exit
//! has run), the daemon removes those splices, adds their hits to the pending point's total
//! and answers: the point is pending again, counts kept across loads. A pending point that
//! cannot be made when its module comes (no such symbol, a refused window) is reported (the
//! log, the journal, `list`) and the module loads all the same, unless the module was
//! required ([`Pending::require`]): then the load is refused with `EINVAL`.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use instr_manager::glob::FunctionGlob;
use instr_manager::point::PointSpec;
use instr_manager::SpliceRequest;

pub use instr_manager::ops::PendingRow;

/// Where a pending point stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arm {
    /// Its module is not loaded.
    Waiting,
    /// Made in the loaded module.
    Armed,
    /// Its module came, and the point could not be made there (the error).
    Invalid(String),
}

/// One pending point.
#[derive(Clone, Debug)]
pub struct PendingPoint {
    pub request: SpliceRequest,
    /// The module its point names.
    pub module: String,
    pub arm: Arm,
    /// Hits of the loads that went (the live splice's hits come on top while armed).
    pub hits: u64,
    /// Times its module came and it was made there.
    pub loads: u64,
}

/// Every pending point and the modules whose load they may refuse.
#[derive(Debug, Default)]
pub struct Pending {
    points: Vec<PendingPoint>,
    required: BTreeSet<String>,
}

/// The module a request's point names (`MOD:sym`), if it names one.
pub fn module_of(request: &SpliceRequest) -> Option<String> {
    match request.point().ok()? {
        PointSpec::Symbol {
            object: Some(o), ..
        } => Some(o),
        _ => None,
    }
}

/// Whether the module `name` (as kallsyms names it) is the one a point named `module`:
/// the kernel writes `-` in module names as `_`.
pub fn same_module(name: &str, module: &str) -> bool {
    name.replace('-', "_") == module.replace('-', "_")
}

impl Pending {
    pub fn add(&mut self, request: SpliceRequest, module: String) {
        self.points.push(PendingPoint {
            request,
            module,
            arm: Arm::Waiting,
            hits: 0,
            loads: 0,
        });
    }

    /// Remove the pending point written `at`; whether it was armed (its live splice is then
    /// the caller's to remove) and its total hits.
    pub fn remove(&mut self, at: &str) -> Option<PendingPoint> {
        let i = self.points.iter().position(|p| p.request.at == at)?;
        Some(self.points.remove(i))
    }

    /// Remove every pending point whose function (in its module) `glob` matches, in the order
    /// they were added.
    pub fn remove_matching(&mut self, glob: &FunctionGlob) -> Vec<PendingPoint> {
        let (out, keep) =
            std::mem::take(&mut self.points)
                .into_iter()
                .partition(|p| match p.request.point() {
                    Ok(PointSpec::Symbol { name, .. }) => glob.matches(&name, Some(&p.module)),
                    _ => false,
                });
        self.points = keep;
        out
    }

    /// Put back a point [`Pending::remove_matching`] took (a removal that failed), as it was.
    pub fn add_back(&mut self, point: PendingPoint) {
        self.points.push(point);
    }

    /// Refuse the load of `module` when one of its pending points cannot be made.
    pub fn require(&mut self, module: &str) {
        self.required.insert(module.to_string());
    }

    pub fn required(&self, module: &str) -> bool {
        self.required.iter().any(|m| same_module(module, m))
    }

    /// Whether any pending point waits for (or is armed in) `module`.
    pub fn has(&self, module: &str) -> bool {
        self.points.iter().any(|p| same_module(module, &p.module))
    }

    /// The pending points of `module`, to arm or disarm.
    pub fn of_module_mut<'a>(
        &'a mut self,
        module: &'a str,
    ) -> impl Iterator<Item = &'a mut PendingPoint> + 'a {
        self.points
            .iter_mut()
            .filter(move |p| same_module(module, &p.module))
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The rows of `list`; `live_hits` gives an armed point's current hits.
    pub fn rows(&self, live_hits: impl Fn(&str) -> u64) -> Vec<PendingRow> {
        self.points
            .iter()
            .map(|p| PendingRow {
                at: p.request.at.clone(),
                module: p.module.clone(),
                action: p.request.action.name().to_string(),
                state: match &p.arm {
                    Arm::Waiting => format!("pending (module {} not loaded)", p.module),
                    Arm::Armed => "armed".to_string(),
                    Arm::Invalid(e) => format!("invalid: {e}"),
                },
                hits: p.hits
                    + match p.arm {
                        Arm::Armed => live_hits(&p.request.at),
                        _ => 0,
                    },
                loads: p.loads,
            })
            .collect()
    }
}

/// Say `line` in the kernel's log (`/dev/kmsg`), where the module's own lines about the load
/// are: a pending point that its module showed invalid is reported there too. Best effort.
pub fn kmsg(line: &str) {
    use std::io::Write;
    let written = std::fs::OpenOptions::new()
        .append(true)
        .open("/dev/kmsg")
        .and_then(|mut f| f.write_all(format!("trapd: {line}\n").as_bytes()));
    if let Err(e) = written {
        log::debug!("/dev/kmsg: {e}");
    }
}

/// What the daemon does when a module comes or goes (implemented by the daemon).
pub trait ModuleEvents {
    /// `Err(reason)` refuses a coming module's load (only when it is required).
    fn module_coming(&mut self, name: &str) -> Result<(), String>;
    fn module_going(&mut self, name: &str);
}

/// Watch module loads and removals for the daemon until the process ends: each event is
/// handled under the daemon's lock and answered at once. Returns only if the watch cannot be
/// had (another watcher, an old module): pending points then stay pending.
pub fn watch_loop<D: ModuleEvents>(daemon: &Mutex<D>) {
    use trapvec::kernel::modwatch::{ModuleState, ModuleWatch};

    let watch = match ModuleWatch::open() {
        Ok(w) => w,
        Err(e) => {
            log::warn!(
                "no module watch, pending points will not be armed: {}",
                trapvec::error_chain(&e)
            );
            return;
        }
    };
    log::info!("watching module loads for pending points");
    loop {
        let ev = match watch.next(Duration::from_secs(60)) {
            Ok(Some(ev)) => ev,
            Ok(None) => continue,
            Err(e) => {
                log::error!("module watch: {}", trapvec::error_chain(&e));
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        let verdict = {
            let mut d = crate::server::lock(daemon);
            match ev.state {
                ModuleState::Coming => d.module_coming(&ev.name),
                ModuleState::Going => {
                    d.module_going(&ev.name);
                    Ok(())
                }
            }
        };
        let answer = verdict.map_err(|why| {
            log::warn!("refusing the load of module {}: {why}", ev.name);
            nix::errno::Errno::EINVAL
        });
        if let Err(e) = watch.answer(ev.seq, answer) {
            log::warn!("module {}: {}", ev.name, trapvec::error_chain(&e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use instr_manager::{Action, Mechanism};

    #[test]
    fn a_module_qualified_point_names_its_module_and_rows_say_pending() {
        let r = SpliceRequest::new("modcalls:modcalls_work+4", Action::Count, Mechanism::Trap);
        assert_eq!(module_of(&r).as_deref(), Some("modcalls"));
        assert_eq!(
            module_of(&SpliceRequest::new(
                "tcp_sync_mss",
                Action::Count,
                Mechanism::Trap
            )),
            None
        );
        let mut p = Pending::default();
        p.add(r, "modcalls".into());
        assert!(p.has("modcalls") && !p.has("other"));
        for q in p.of_module_mut("modcalls") {
            q.arm = Arm::Armed;
            q.hits = 10;
        }
        let rows = p.rows(|_| 5);
        assert_eq!(rows[0].state, "armed");
        assert_eq!(
            rows[0].hits, 15,
            "the live load's hits on top of the gone ones'"
        );
        for q in p.of_module_mut("modcalls") {
            q.arm = Arm::Waiting;
        }
        assert_eq!(
            p.rows(|_| 5)[0].state,
            "pending (module modcalls not loaded)"
        );
        assert!(same_module("my_mod", "my-mod"));
        p.require("modcalls");
        assert!(p.required("modcalls") && !p.required("x"));
    }
}
