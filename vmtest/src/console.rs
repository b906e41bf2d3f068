//! Reading the guest's serial console as it streams: the exit marker the guest's init prints
//! after the scenario, and kernel messages that mean the kernel is in trouble (panic, oops,
//! `BUG:`, `WARNING:`), which fail a run whatever the scenario said.
//!
//! Only printk lines count as kernel messages: they carry the `[ seconds.micros]` timestamp
//! (the guest boots with `printk.time=1`), so a scenario that echoes "WARNING:" is not one.

use std::collections::VecDeque;

/// The line the guest's init prints after the scenario: `TRAPVEC-VMTEST-EXIT=<status>`.
pub const EXIT_MARKER: &str = "TRAPVEC-VMTEST-EXIT=";

/// How many of the last console lines are kept for error messages.
const TAIL_LINES: usize = 40;

/// Starts of printk messages that mean the kernel hit a bug.
const PROBLEM_PREFIXES: &[&str] = &[
    "WARNING:",
    "BUG:",
    "Oops:",
    "Kernel panic",
    "kernel BUG at",
    "general protection fault",
    "watchdog: BUG:",
    "UBSAN:",
];

/// Incremental console reader: feed it bytes as they arrive, in chunks of any size.
#[derive(Debug, Default)]
pub struct ConsoleScanner {
    partial: Vec<u8>,
    exit: Option<i32>,
    problems: Vec<String>,
    tail: VecDeque<String>,
}

impl ConsoleScanner {
    /// A scanner that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Consumes console bytes; complete lines are examined now, a trailing partial line when
    /// the rest of it arrives (or at [`ConsoleScanner::finish`]).
    pub fn feed(&mut self, bytes: &[u8]) {
        self.partial.extend_from_slice(bytes);
        while let Some(newline) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=newline).collect();
            self.line(&line[..newline]);
        }
    }

    /// Examines whatever partial line is left (the console ended without a newline).
    pub fn finish(&mut self) {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line);
        }
    }

    /// The scenario's exit status, once the marker has been seen.
    pub fn exit_status(&self) -> Option<i32> {
        self.exit
    }

    /// Kernel problem messages seen so far, in order.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// The last console lines, oldest first.
    pub fn tail(&self) -> impl Iterator<Item = &str> {
        self.tail.iter().map(String::as_str)
    }

    fn line(&mut self, raw: &[u8]) {
        let text = String::from_utf8_lossy(raw);
        let text = text.trim_end_matches('\r');
        if self.exit.is_none() {
            if let Some(status) = exit_status(text) {
                log::debug!("guest reported scenario exit status {status}");
                self.exit = Some(status);
            }
        }
        if let Some(message) = printk_message(text) {
            if PROBLEM_PREFIXES.iter().any(|p| message.starts_with(p)) {
                self.problems.push(message.to_owned());
            }
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(text.to_owned());
    }
}

/// The status in an exit-marker line. The marker may follow other output on the same line
/// (a kernel message that did not end in a newline), but the status must end the line.
pub fn exit_status(line: &str) -> Option<i32> {
    let at = line.rfind(EXIT_MARKER)?;
    let digits = line[at + EXIT_MARKER.len()..].trim_end();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The message of a printk line (`[   12.345678] message`, optionally with a caller id
/// `[    T1]` after the time); `None` for anything else.
pub fn printk_message(line: &str) -> Option<&str> {
    let mut rest = line;
    loop {
        let open = rest.find('[')?;
        let after = &rest[open + 1..];
        let close = after.find(']')?;
        let stamp = after[..close].trim_start();
        let is_time = stamp.split_once('.').is_some_and(|(s, us)| {
            !s.is_empty()
                && s.bytes().all(|b| b.is_ascii_digit())
                && !us.is_empty()
                && us.bytes().all(|b| b.is_ascii_digit())
        });
        if is_time {
            let mut message = after[close + 1..].trim_start();
            // Optional caller id: [    T123] or [    C1].
            if let Some(inner) = message.strip_prefix('[') {
                if let Some(end) = inner.find(']') {
                    let id = inner[..end].trim_start();
                    if id.len() > 1
                        && (id.starts_with('T') || id.starts_with('C'))
                        && id[1..].bytes().all(|b| b.is_ascii_digit())
                    {
                        message = inner[end + 1..].trim_start();
                    }
                }
            }
            return Some(message);
        }
        rest = &after[close..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_split_across_chunks_gives_the_status() {
        let mut scan = ConsoleScanner::new();
        scan.feed(b"hello\r\nTRAPVEC-VMT");
        assert_eq!(scan.exit_status(), None);
        scan.feed(b"EST-EXIT=3\r");
        assert_eq!(scan.exit_status(), None, "line not complete yet");
        scan.feed(b"\n[    4.000000] reboot: Power down\r\n");
        assert_eq!(scan.exit_status(), Some(3));
        assert!(scan.problems().is_empty());
    }

    #[test]
    fn marker_without_number_is_not_a_verdict() {
        assert_eq!(exit_status("echo TRAPVEC-VMTEST-EXIT=$status"), None);
        assert_eq!(exit_status("TRAPVEC-VMTEST-EXIT="), None);
        assert_eq!(exit_status("TRAPVEC-VMTEST-EXIT=12x"), None);
        assert_eq!(exit_status("[    3.1] foo TRAPVEC-VMTEST-EXIT=0"), Some(0));
        assert_eq!(exit_status("TRAPVEC-VMTEST-EXIT=255"), Some(255));
    }

    #[test]
    fn first_marker_wins() {
        let mut scan = ConsoleScanner::new();
        scan.feed(b"TRAPVEC-VMTEST-EXIT=0\nTRAPVEC-VMTEST-EXIT=7\n");
        assert_eq!(scan.exit_status(), Some(0));
    }

    #[test]
    fn kernel_warning_oops_and_panic_are_problems() {
        let mut scan = ConsoleScanner::new();
        scan.feed(
            b"[   10.123456] ------------[ cut here ]------------\r\n\
              [   10.123457] WARNING: CPU: 1 PID: 77 at kernel/foo.c:12 foo+0x1/0x2\r\n\
              [   11.000000] BUG: kernel NULL pointer dereference, address: 0000000000000008\r\n\
              [   11.000001] Oops: 0002 [#1] PREEMPT SMP NOPTI\r\n\
              [   11.5] general protection fault, probably for non-canonical address 0xdead: 0000 [#2] SMP NOPTI\r\n\
              [   12.000000] Kernel panic - not syncing: Fatal exception\r\n",
        );
        assert_eq!(scan.problems().len(), 5, "{:?}", scan.problems());
        assert!(scan.problems()[0].starts_with("WARNING: CPU: 1"));
        assert!(scan.problems()[4].starts_with("Kernel panic"));
    }

    #[test]
    fn caller_id_prefix_is_skipped() {
        assert_eq!(
            printk_message("[    1.000000][    T1] WARNING: x"),
            Some("WARNING: x")
        );
        assert_eq!(
            printk_message("[    1.000000][    C0] BUG: y"),
            Some("BUG: y")
        );
    }

    #[test]
    fn printk_after_scenario_output_on_the_same_line_still_counts() {
        let mut scan = ConsoleScanner::new();
        scan.feed(
            b"partial output[   20.000000] watchdog: BUG: soft lockup - CPU#0 stuck for 22s!\n",
        );
        assert_eq!(
            scan.problems(),
            ["watchdog: BUG: soft lockup - CPU#0 stuck for 22s!"]
        );
    }

    #[test]
    fn scenario_text_and_harmless_kernel_lines_are_not_problems() {
        let mut scan = ConsoleScanner::new();
        scan.feed(
            b"WARNING: this is the scenario talking\n\
              [array] BUG: not a timestamp\n\
              [    0.000000] Linux version 6.1.0-56-cloud-amd64\n\
              [    1.2] clocksource: timekeeping watchdog on CPU1: Marking clocksource 'tsc' as unstable\n",
        );
        scan.finish();
        assert!(scan.problems().is_empty(), "{:?}", scan.problems());
        assert_eq!(scan.tail().count(), 4);
    }

    #[test]
    fn tail_keeps_only_the_last_lines() {
        let mut scan = ConsoleScanner::new();
        for i in 0..100 {
            scan.feed(format!("line {i}\n").as_bytes());
        }
        let tail: Vec<_> = scan.tail().collect();
        assert_eq!(tail.len(), TAIL_LINES);
        assert_eq!(tail[0], "line 60");
        assert_eq!(tail[TAIL_LINES - 1], "line 99");
    }
}
