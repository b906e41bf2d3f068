#!/usr/bin/env python3
"""Frida's attach to the process trapctl attaches to in tests/attach_soak.rs, for the
"Attaching" figures of bench/README.md: `python3 bench/src/attach_frida.py PID [N]`.

Per cycle: frida.attach(PID) (inject frida-agent, open its session), a script that counts
`work` calls with Interceptor loaded, then session.detach(). Prints p50/p99 in microseconds of
each step. Needs the `frida` Python module (pip install frida)."""
import sys
import time

import frida

SOURCE = """
let hits = 0;
Interceptor.attach(DebugSymbol.fromName('work').address, { onEnter() { hits++; } });
"""


def pct(v, p):
    v = sorted(v)
    return v[(len(v) - 1) * p // 100]


def main():
    pid = int(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    att, load, det = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        s = frida.attach(pid)
        t1 = time.perf_counter()
        sc = s.create_script(SOURCE)
        sc.load()
        t2 = time.perf_counter()
        s.detach()
        t3 = time.perf_counter()
        att.append((t1 - t0) * 1e6)
        load.append((t2 - t1) * 1e6)
        det.append((t3 - t2) * 1e6)
    print(f"frida {frida.__version__}: {n} cycles; first attach {att[0]:.0f} us; "
          f"attach p50 {pct(att, 50):.0f} us p99 {pct(att, 99):.0f} us; "
          f"script (Interceptor on work) p50 {pct(load, 50):.0f} us; "
          f"detach p50 {pct(det, 50):.0f} us p99 {pct(det, 99):.0f} us")


if __name__ == "__main__":
    main()
