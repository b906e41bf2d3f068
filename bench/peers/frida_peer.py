# SPDX-License-Identifier: GPL-2.0
"""Frida, the user-space peer of trapvec's process backend, for `bench peers` (bench/src/frida.rs).

    python3 frida_peer.py TARGET FIXTURE.so MANY.so N ITERS ROUNDS ATTACH_ROUNDS

Starts TARGET (frida_target.c) on the two shared objects, attaches Frida to it and prints one
JSON object on stdout:

- `plain`, `hooked`: cycles per call of f0 per round, with Frida's agent loaded but nothing
  attached, and with
  Interceptor.attach(f0, cm), cm a CModule whose onEnter only counts (native code, no
  JavaScript on the hot path); `hits` is that counter, `expected_hits` the calls made;
- `bench_target_refused`: Frida's error attaching to bench_target (4 bytes), or null;
- per round of ATTACH_ROUNDS: `attach_ms`: Interceptor.attach of the same CModule on
  f0 .. f{N-1} plus Interceptor.flush() (the writes to the code), timed inside the agent with
  Date.now(); `attach_rpc_ms` the same seen from here (with the RPC round trip); `detach_ms`
  Interceptor.detachAll() + flush; `mass_hits` the counter after one call of each fi (must be N).

Errors go to stderr with a non-zero exit status; `import frida` failing exits 3.
"""
import json
import os
import subprocess
import sys
import time

try:
    import frida
except ImportError as e:  # the caller says how to install it
    print(f"frida_peer: cannot import frida: {e}", file=sys.stderr)
    sys.exit(3)

AGENT = r"""
const counter = Memory.alloc(8);
const cm = new CModule(`
#include <gum/guminterceptor.h>

extern volatile guint64 counter;

void onEnter (GumInvocationContext * ic)
{
  counter++;
}
`, { counter });

rpc.exports = {
  attachOne(addr) {
    Interceptor.attach(ptr(addr), cm);
    Interceptor.flush();
  },
  attachMany(addrs) {
    const t0 = Date.now();
    for (const a of addrs)
      Interceptor.attach(ptr(a), cm);
    Interceptor.flush();
    return Date.now() - t0;
  },
  detachAll() {
    const t0 = Date.now();
    Interceptor.detachAll();
    Interceptor.flush();
    return Date.now() - t0;
  },
  hits() {
    return counter.readU64().toString();
  },
  reset() {
    counter.writeU64(0);
  },
};
"""


def wait_for_agent_to_leave(pid, timeout=30.0):
    """Waits until the target is single-threaded again, i.e. Frida's agent has finished
    unloading after session.detach() returned. Quitting before that races the agent's teardown:
    under load about one run in six hung in exit() inside the agent (seen with gdb: the main
    thread and five agent threads waiting in the agent's code, nothing left to wake them)."""
    deadline = time.monotonic() + timeout
    while True:
        threads = len(os.listdir(f"/proc/{pid}/task"))
        if threads == 1:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"Frida's agent still runs {threads - 1} threads in frida_target "
                               f"(pid {pid}) {timeout:.0f} s after session.detach()")
        time.sleep(0.01)


def main():
    if len(sys.argv) != 8:
        print("usage: frida_peer.py TARGET FIXTURE.so MANY.so N ITERS ROUNDS ATTACH_ROUNDS", file=sys.stderr)
        sys.exit(2)
    target, fixture, many, n, iters, rounds, attach_rounds = sys.argv[1:]
    n, iters, rounds, attach_rounds = int(n), int(iters), int(rounds), int(attach_rounds)
    proc = subprocess.Popen([target, fixture, many, str(n), str(iters), str(rounds)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        bench_target = proc.stdout.readline().split()[1]
        fs = [proc.stdout.readline().split()[1] for _ in range(n)]
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("frida_target did not say ready")

        def command(cmd):
            proc.stdin.write(cmd + "\n")
            proc.stdin.flush()
            out = []
            while True:
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"frida_target ended during `{cmd}`")
                if line.strip() == "done":
                    return out
                out.append(float(line.split()[1]))

        session = frida.attach(proc.pid)
        script = session.create_script(AGENT)
        script.load()
        api = script.exports_sync
        # The baseline with Frida's agent in the process, nothing attached yet.
        plain = command("measure")
        try:
            api.attach_one(bench_target)
            refused = None
        except frida.RPCException as e:
            refused = str(e).splitlines()[0]
        api.detach_all()
        api.attach_one(fs[0])
        hooked = command("measure")
        hits = int(api.hits())
        api.detach_all()
        api.reset()

        attach_ms, attach_rpc_ms, detach_ms, mass_hits = [], [], [], []
        for _ in range(attach_rounds):
            api.reset()
            t0 = time.perf_counter()
            attach_ms.append(api.attach_many(fs))
            attach_rpc_ms.append((time.perf_counter() - t0) * 1e3)
            command("callall")
            mass_hits.append(int(api.hits()))
            detach_ms.append(api.detach_all())
        script.unload()
        session.detach()
        wait_for_agent_to_leave(proc.pid)
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
        print(json.dumps({
            "frida_version": frida.__version__,
            "plain": plain,
            "bench_target_refused": refused,
            "hooked": hooked,
            "hits": hits,
            "expected_hits": rounds * iters + min(iters, 100),
            "functions": n,
            "attach_ms": attach_ms,
            "attach_rpc_ms": attach_rpc_ms,
            "detach_ms": detach_ms,
            "mass_hits": mass_hits,
        }))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
