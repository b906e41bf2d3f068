//! Where the guest's vCPUs are when a scenario times out, from QEMU's human monitor.
//!
//! Every boot gets the monitor on a Unix socket (`-monitor unix:PATH,server=on,wait=off`). When
//! the timeout passes, before QEMU is killed, [`sample`] asks `info registers -a` a few times
//! and keeps each vCPU's RIP, privilege level and halt state. A guest that went silent with a
//! vCPU spinning in the kernel shows the same few kernel addresses in every sample; an idle
//! guest shows halted vCPUs; a guest whose vCPUs are in user space shows CPL 3. The runner
//! names the kernel addresses ([`crate::runner`]'s stall report).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// One vCPU in one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VcpuState {
    /// QEMU's CPU index.
    pub cpu: u32,
    /// RIP (EIP before long mode).
    pub rip: u64,
    /// Current privilege level: 0 kernel, 3 user.
    pub cpl: u8,
    /// Halted (`hlt`, an idle CPU).
    pub halted: bool,
}

/// How many samples [`sample`] takes, and how far apart.
pub const SAMPLES: usize = 5;
pub const SAMPLE_GAP: Duration = Duration::from_millis(200);

/// The prompt that ends each answer of the human monitor.
const PROMPT: &[u8] = b"(qemu) ";

/// Reads the vCPUs `samples` times, `gap` apart, from the monitor at `socket`. The whole
/// exchange is bounded (a guest wedged inside QEMU must not wedge the caller): each read waits
/// at most 5 s.
pub fn sample(
    socket: &Path,
    samples: usize,
    gap: Duration,
) -> std::io::Result<Vec<Vec<VcpuState>>> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    read_to_prompt(&mut s)?;
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples {
        if i > 0 {
            std::thread::sleep(gap);
        }
        s.write_all(b"info registers -a\n")?;
        let text = read_to_prompt(&mut s)?;
        let cpus = parse_registers(&text);
        if cpus.is_empty() {
            return Err(std::io::Error::other(format!(
                "`info registers -a` named no CPU: {:?}",
                text.chars().take(200).collect::<String>()
            )));
        }
        out.push(cpus);
    }
    Ok(out)
}

fn read_to_prompt(s: &mut UnixStream) -> std::io::Result<String> {
    let until = Instant::now() + Duration::from_secs(10);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    while !buf.ends_with(PROMPT) {
        if Instant::now() > until {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the QEMU monitor did not answer within 10 s",
            ));
        }
        match s.read(&mut chunk)? {
            0 => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the QEMU monitor closed",
                ))
            }
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The vCPUs in the text of `info registers -a`: a `CPU#N` line opens each CPU's block, whose
/// `RIP=` (or `EIP=`), `CPL=` and `HLT=` fields are kept. A block without an instruction
/// pointer is left out.
pub fn parse_registers(text: &str) -> Vec<VcpuState> {
    let mut out = Vec::new();
    let mut cur: Option<(u32, Option<u64>, u8, bool)> = None;
    let flush = |cur: &mut Option<(u32, Option<u64>, u8, bool)>, out: &mut Vec<VcpuState>| {
        if let Some((cpu, Some(rip), cpl, halted)) = cur.take() {
            out.push(VcpuState {
                cpu,
                rip,
                cpl,
                halted,
            });
        }
    };
    for line in text.lines() {
        let line = line.trim();
        if let Some(n) = line
            .strip_prefix("CPU#")
            .and_then(|n| n.trim().parse().ok())
        {
            flush(&mut cur, &mut out);
            cur = Some((n, None, 0, false));
            continue;
        }
        let Some(c) = cur.as_mut() else { continue };
        for field in line.split_whitespace() {
            let Some((key, value)) = field.split_once('=') else {
                continue;
            };
            match key {
                "RIP" | "EIP" => c.1 = u64::from_str_radix(value, 16).ok(),
                "CPL" => c.2 = value.parse().unwrap_or(0),
                "HLT" => c.3 = value == "1",
                _ => {}
            }
        }
    }
    flush(&mut cur, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG_MODE: &str = "info registers -a\x1b[K\r\n\r\nCPU#0\r\n\
RAX=0000000000000000 RBX=ffffffff82613940 RCX=0000000000000001 RDX=0000000000002b53\r\n\
RIP=ffffffff81b5c0ce RFL=00000246 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=1\r\n\
ES =0000 0000000000000000 00000000 00000000\r\n\r\nCPU#1\r\n\
RAX=00007ffd5a0c1c2c RBX=0000000000000003 RCX=0000000000000000 RDX=0000000000000000\r\n\
RIP=000000000040112a RFL=00000202 [-------] CPL=3 II=0 A20=1 SMM=0 HLT=0\r\n(qemu) ";

    #[test]
    fn long_mode_blocks_give_rip_cpl_and_halt() {
        assert_eq!(
            parse_registers(LONG_MODE),
            [
                VcpuState {
                    cpu: 0,
                    rip: 0xffff_ffff_81b5_c0ce,
                    cpl: 0,
                    halted: true
                },
                VcpuState {
                    cpu: 1,
                    rip: 0x40_112a,
                    cpl: 3,
                    halted: false
                },
            ]
        );
    }

    #[test]
    fn real_mode_eip_is_read_and_a_block_without_one_left_out() {
        let text = "CPU#0\nEAX=00000000\nEIP=0000b7b9 EFL=00000246 CPL=0 HLT=1\nCPU#1\nEAX=1\n";
        assert_eq!(
            parse_registers(text),
            [VcpuState {
                cpu: 0,
                rip: 0xb7b9,
                cpl: 0,
                halted: true
            }]
        );
        assert!(parse_registers("(qemu) unknown command").is_empty());
    }

    /// A real QEMU (no guest kernel: the firmware) answers on the socket.
    #[test]
    fn a_real_qemu_monitor_gives_each_vcpu() {
        let Ok(qemu) = crate::host::find_program("qemu-system-x86_64", "") else {
            eprintln!("skipping: no qemu-system-x86_64");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("monitor.sock");
        let mut child = std::process::Command::new(qemu)
            .args([
                "-accel", "tcg", "-smp", "2", "-m", "64M", "-display", "none", "-serial", "null",
                "-nic", "none",
            ])
            .arg("-monitor")
            .arg(format!("unix:{},server=on,wait=off", sock.display()))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        while !sock.exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        let got = sample(&sock, 2, Duration::from_millis(50));
        child.kill().unwrap();
        child.wait().unwrap();
        let got = got.unwrap();
        assert_eq!(got.len(), 2);
        assert!(
            got.iter()
                .all(|s| s.iter().map(|v| v.cpu).collect::<Vec<_>>() == [0, 1]),
            "{got:?}"
        );
    }
}
