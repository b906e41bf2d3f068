//! The tracer's side of a running program that needs it ([`Compiled::polls`]): the data
//! block is read every [`POLL`] (or sooner, when an interval is due), the probes' printf lines
//! are drained from its ring and printed in order, `exit()` is seen, and the interval probes
//! run against the snapshot (`print(@m)`, `clear(@m)` by subtracting what the map held, a
//! printf of constants, `exit()`). The same for the kernel and for a process: only how the
//! block is read differs.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::Result;
use trapvec_script::{Action, Compiled, Drain, Layout};

/// How often the data block is read.
pub const POLL: Duration = Duration::from_millis(50);

/// The drain, the intervals' schedule, what was printed (kept for `--json`).
pub struct Poller<'a> {
    compiled: &'a Compiled,
    json: bool,
    drain: Drain,
    /// Per map: the snapshot taken when an interval last cleared it.
    bases: Vec<Option<Vec<u8>>>,
    /// When each interval is next due.
    due: Vec<Instant>,
    /// The lines printed by probes and intervals, in order.
    pub printed: Vec<String>,
}

impl<'a> Poller<'a> {
    pub fn new(compiled: &'a Compiled, json: bool, start: Instant) -> Poller<'a> {
        Poller {
            compiled,
            json,
            drain: Drain::default(),
            bases: vec![None; compiled.layout.maps.len()],
            due: compiled
                .intervals
                .iter()
                .map(|i| start + Duration::from_millis(i.ms))
                .collect(),
            printed: Vec::new(),
        }
    }

    /// The probes are live from `start` on: the intervals count from there.
    pub fn start_at(&mut self, start: Instant) {
        for (due, i) in self.due.iter_mut().zip(&self.compiled.intervals) {
            *due = start + Duration::from_millis(i.ms);
        }
    }

    /// How long to wait before the next look.
    pub fn timeout(&self, now: Instant) -> Duration {
        self.due
            .iter()
            .map(|d| d.saturating_duration_since(now))
            .fold(POLL, Duration::min)
    }

    /// Print (or keep, with `--json`) lines as they come.
    fn out(&mut self, text: String) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        if !self.json {
            crate::print(&text)?;
            let _ = std::io::stdout().flush();
        }
        self.printed.push(text);
        Ok(())
    }

    /// One look at `data`, a snapshot of the data block (`head_after`: the ring's head read
    /// after it): print the new lines, run the intervals that are due. Whether the trace is
    /// to end (`exit()` in a probe or an interval).
    pub fn step(&mut self, data: &[u8], head_after: u64, now: Instant) -> Result<bool> {
        let c = self.compiled;
        for line in self
            .drain
            .take(&c.layout, data, head_after, &c.formats, &c.strings)
        {
            self.out(line)?;
        }
        let mut exit = c.layout.exited(data);
        for (i, interval) in c.intervals.iter().enumerate() {
            if now < self.due[i] || exit {
                continue;
            }
            // Due again one period after it was due, not after it ran: no drift.
            while self.due[i] <= now {
                self.due[i] += Duration::from_millis(interval.ms);
            }
            for action in &interval.actions {
                match action {
                    Action::Printf(p) => self.out(trapvec_script::format_printf(p))?,
                    Action::Print(name) => {
                        let results = c.layout.decode_since(data, &c.strings, &self.bases)?;
                        if let Some(m) = results.maps.iter().find(|m| m.name == *name) {
                            self.out(trapvec_script::render_map(m))?;
                        }
                    }
                    Action::Clear(name) => {
                        if let Some(k) = c.layout.maps.iter().position(|m| m.info.name == *name) {
                            self.bases[k] = Some(data.to_vec());
                        }
                    }
                    Action::Exit => exit = true,
                }
            }
        }
        Ok(exit)
    }

    /// The last look, once the probes are gone: the lines left, and the maps as the end
    /// prints them (counted since an interval's last clear).
    pub fn finish(&mut self, data: &[u8]) -> Result<trapvec_script::Results> {
        let c = self.compiled;
        let head = Layout::head(data);
        for line in self
            .drain
            .take(&c.layout, data, head, &c.formats, &c.strings)
        {
            self.out(line)?;
        }
        Ok(c.layout.decode_since(data, &c.strings, &self.bases)?)
    }

    /// Records overwritten before they were read.
    pub fn lost(&self) -> u64 {
        self.drain.lost
    }
}
