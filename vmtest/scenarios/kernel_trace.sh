#!/bin/sh
# `trapctl trace` in the kernel (issue 29): one-liners compiled for the kernel,
# each with a result the scenario knows in advance, printed as KEY=<the --json report on one
# line> for vmtest/tests/kernel_trace.rs:
#  COUNT    @[comm] = count() at __x64_sys_getppid while `getppid_a -n 3000` runs (COMMAND end)
#  SUM      sum of lseek's offset, read from the syscall's pt_regs (*(u64 *)(arg0 + 104))
#  HIST     hist() of those offsets: 3 x 1, 4 x 5, 2 x 100
#  RET      __x64_sys_lseek:return, @[retval] = count()
#  STR      str() of the file `cat` opens (do_filp_open's struct filename, kernel memory)
#  USTR     the same from cat's memory (do_sys_openat2's user pointer)
#  UFAULT   a user string on a page not faulted in: failed reads counted as a kprobe faults
#  CPU      @[cpu] of calls pinned to CPU 0, then to CPU 1 (see CPU below)
#  GLOB     __x64_sys_getp*id, @[func] = count()
#  BEGINEND BEGIN and END's printf lines (text form)
#  FAILED   a read of address 8, counted as failed at every hit
#  SECONDS  --seconds 1 ends by itself, status 0
#  PID      /pid == N/ of two loops, ended by SIGTERM: the maps are printed, then trapctl dies
#           by SIGTERM (143)
#  CHANGE   retval = 5 at lseek's return: lseeks sees 5 (wrong answers), then right again
#  ENTRYRET ksys_lseek and ksys_lseek:return in one program: 10 calls at offset 100 each
#  RETPRED  return 5 at ksys_lseek under /comm == "lseeks"/: lseeks gets 5 without the function
#           running, lseekb (not selected) runs it through the original trampoline
#  IF       if/else at ksys_lseek's entry: lseeks 100 4 then lseeks 7 3 give big 4, small 3
#  PRINTF   printf at ksys_lseek's return: one line per call, in order
#  EXIT     exit() at the first call: one count, lseeks killed, status 0
#  INTERVAL interval:ms:100 { printf; exit() } ends a --seconds 60 trace at once
# Two are checked against a kprobe event in the guest (ORACLE_COUNT, ORACLE_SUM), and at the end
# nothing is left: no splice, no component, __x64_sys_getppid's bytes as before.
set -u

grep -q '^trapvec ' /proc/modules || insmod /trapvec.ko || exit 10
cp /bin/ppidloop /bin/getppid_a && cp /bin/ppidloop /bin/getppid_b || exit 11
trapctl read __x64_sys_getppid > /tmp/before.hex || exit 12
T=/sys/kernel/tracing

json() {
	tr -d '\n' < "$1"
}

# `tracing OUT`: wait until the trace writing OUT has its probes live.
tracing() {
	until grep -q '^tracing' "$1" 2> /dev/null; do usleep 50000; done
}

# `kprobe_lines NAME`: the events of kprobe NAME in the trace buffer.
kprobe_lines() {
	grep -c " $1:" $T/trace
}

# --- COUNT, and its oracle: a kprobe event on the same function, filtered on the same comm.
trapctl trace --json -e '__x64_sys_getppid { @[comm] = count() }' -- /bin/getppid_a -n 3000 > /tmp/count 2> /tmp/count.err
echo "COUNT_RC=$?"
cat /tmp/count.err
echo "COUNT=$(json /tmp/count)"
echo 'p:tvgetppid __x64_sys_getppid' > $T/kprobe_events || exit 13
echo 'comm == "getppid_a"' > $T/events/kprobes/tvgetppid/filter
echo > $T/trace
echo 1 > $T/events/kprobes/tvgetppid/enable
/bin/getppid_a -n 3000 > /tmp/oracle_a
echo 0 > $T/events/kprobes/tvgetppid/enable
echo "ORACLE_COUNT=$(kprobe_lines tvgetppid) $(cat /tmp/oracle_a)"

# --- SUM and HIST: lseek's offset from the pt_regs the wrapper gets (regs->si at 104).
seeks='/bin/lseeks 1 3; /bin/lseeks 5 4; /bin/lseeks 100 2'
trapctl trace --json -e '__x64_sys_lseek /comm == "lseeks"/ { @s = sum(*(u64 *)(arg0 + 104)); @h = hist(*(u64 *)(arg0 + 104)) }' -- /bin/sh -c "$seeks" > /tmp/sum
echo "SUM_RC=$?"
echo "SUM=$(json /tmp/sum)"
echo 'p:tvlseek __x64_sys_lseek off=+104(%di):u64' >> $T/kprobe_events || exit 14
echo 'comm == "lseeks"' > $T/events/kprobes/tvlseek/filter
echo > $T/trace
echo 1 > $T/events/kprobes/tvlseek/enable
/bin/sh -c "$seeks" > /dev/null
echo 0 > $T/events/kprobes/tvlseek/enable
echo "ORACLE_SUM=$(grep ' tvlseek:' $T/trace | sed 's/.*off=//' | awk '{ s += $1; n++ } END { print n, s }')"
echo > $T/kprobe_events

# --- RET: the return value at __x64_sys_lseek's return (a tail call: it ends with jmp ksys_lseek).
trapctl trace --json -e '__x64_sys_lseek:return /comm == "lseeks"/ { @r[retval] = count() }' -- /bin/lseeks 100 10 > /tmp/ret
echo "RET_RC=$?"
echo "RET=$(json /tmp/ret)"

# --- STR: the file name cat opens, as do_filp_open gets it (struct filename's name, kernel
# memory). USTR: the same name read from cat's own memory (do_sys_openat2's user pointer, on
# cat's stack since execve wrote its argv there).
echo hello > /tmp/tv_trace_file
trapctl trace --json -e 'do_filp_open /comm == "cat"/ { @[str(*(u64 *)arg1, 32)] = count() }' -- /bin/cat /tmp/tv_trace_file > /tmp/str
echo "STR_RC=$?"
echo "STR=$(json /tmp/str)"
trapctl trace --json -e 'do_sys_openat2 /comm == "cat"/ { @[str(arg1, 32)] = count() }' -- /bin/cat /tmp/tv_trace_file > /tmp/ustr
echo "USTR_RC=$?"
echo "USTR=$(json /tmp/ustr)"

# --- UFAULT: a user string in a page cat has not touched yet cannot be read with page faults
# off (the *_nofault reads): getname_flags (not on the open path on 6.1, whose getname calls
# getname_flags.part.0) is reached by busybox's fstat(AT_EMPTY_PATH) of "" in its rodata. A
# kprobe event reading the same string (ustring) at the same time says which reads the kernel
# itself could do: the failed reads counted must be its (fault)s.
echo 'p:tvgetname getname_flags s=+0(%di):ustring' > $T/kprobe_events || exit 15
echo 'comm == "cat"' > $T/events/kprobes/tvgetname/filter
echo > $T/trace
echo 1 > $T/events/kprobes/tvgetname/enable
trapctl trace --json -e 'getname_flags /comm == "cat"/ { @[str(arg0, 32)] = count() }' -- /bin/cat /tmp/tv_trace_file > /tmp/ufault
echo "UFAULT_RC=$?"
echo 0 > $T/events/kprobes/tvgetname/enable
echo "UFAULT=$(json /tmp/ufault)"
echo "ORACLE_UFAULT=$(grep -c ' tvgetname:.*s=(fault)' $T/trace) $(grep ' tvgetname:' $T/trace | grep -vc 's=(fault)')"
echo > $T/kprobe_events

# --- CPU: cpu is the CPU a call ran on. ppidloop pins its counting thread to CPU 0 itself
# (thread i on CPU i), so of the second run only its first call (before the threads start)
# runs where taskset put it: CPU 0 has 301 + 200 calls, CPU 1 the one.
trapctl trace --json -e '__x64_sys_getppid /comm == "getppid_a"/ { @[cpu] = count() }' -- /bin/sh -c 'taskset -c 0 /bin/getppid_a -n 300; taskset -c 1 /bin/getppid_a -n 200' > /tmp/cpu
echo "CPU_RC=$?"
echo "CPU=$(json /tmp/cpu)"

# --- GLOB: every __x64_sys_getp*id, by func.
trapctl trace --json -e '__x64_sys_getp*id /comm == "getppid_a"/ { @[func] = count() }' -- /bin/getppid_a -n 500 > /tmp/glob 2> /tmp/glob.err
echo "GLOB_RC=$?"
cat /tmp/glob.err
echo "GLOB=$(json /tmp/glob)"

# --- BEGINEND: the text form.
trapctl trace -e 'BEGIN { printf("hello %d\n", 42) } __x64_sys_getppid /comm == "getppid_a"/ { @calls = count() } END { printf("bye %s\n", "now") }' -- /bin/getppid_a -n 200 > /tmp/be
echo "BEGINEND_RC=$?"
cat /tmp/be
echo "BEGINEND=$(tr '\n' '|' < /tmp/be)"

# --- FAILED: a read at address 8 fails at every hit, and is counted.
trapctl trace --json -e '__x64_sys_getppid /comm == "getppid_a"/ { @bad = sum(*(u64 *)8) }' -- /bin/getppid_a -n 100 > /tmp/failed
echo "FAILED_RC=$?"
echo "FAILED=$(json /tmp/failed)"

# --- SECONDS: ends by itself.
trapctl trace --json -e '__x64_sys_getppid { @c = count() }' --seconds 1 > /tmp/seconds 2> /tmp/seconds.err
echo "SECONDS_RC=$?"
echo "SECONDS_LIVE=$(cat /tmp/seconds.err)"
echo "SECONDS=$(json /tmp/seconds)"

# --- PID and SIGTERM: two loops, one counted by its pid; SIGTERM ends the trace.
rm -f /tmp/go /tmp/stop
mkfifo /tmp/go
(read x < /tmp/go; exec /bin/getppid_a -n 700 > /tmp/pid_a) &
pa=$!
trapctl trace --json -e "__x64_sys_getppid /pid == $pa/ { @[comm, pid] = count() }" > /tmp/pid 2> /tmp/pid.err &
tp=$!
tracing /tmp/pid.err
echo go > /tmp/go
/bin/getppid_b -n 400 > /tmp/pid_b
wait $pa
kill -TERM $tp
wait $tp
echo "PID_RC=$?"
echo "PID_PA=$pa"
echo "PID_A=$(cat /tmp/pid_a)"
echo "PID=$(json /tmp/pid)"

# --- CHANGE: lseek answers 5 while the probe lives, right again after.
trapctl trace --allow-changes --json -e '__x64_sys_lseek:return /comm == "lseeks"/ { retval = 5; @n = count() }' -- /bin/lseeks 100 10 > /tmp/change
echo "CHANGE_RC=$?"
echo "CHANGE=$(json /tmp/change)"
echo "CHANGE_AFTER=$(/bin/lseeks 100 10)"

# --- ENTRYRET: an entry and a :return probe of one function (ksys_lseek, which
# __x64_sys_lseek tail-calls): the entry probe goes past the return point's site, and both see
# each of lseeks' calls, the entry its offset, the return its result.
trapctl trace --json -e 'ksys_lseek /comm == "lseeks"/ { @e[arg1] = count() } ksys_lseek:return /comm == "lseeks"/ { @r[retval] = count() }' -- /bin/lseeks 100 10 > /tmp/entryret 2> /tmp/entryret.err
echo "ENTRYRET_RC=$?"
cat /tmp/entryret.err
echo "ENTRYRET=$(json /tmp/entryret)"

# --- RETPRED: return under a predicate: the calls it selects return 5 and skip ksys_lseek,
# the others (lseekb's, the same program under another name) go on through the original.
cp /bin/lseeks /bin/lseekb || exit 13
trapctl trace --allow-changes --json -e 'ksys_lseek /comm == "lseeks"/ { @n = count(); return 5 }' -- sh -c '/bin/lseeks 100 10 > /tmp/rp_a; /bin/lseekb 100 10 > /tmp/rp_b; exit 0' > /tmp/retpred 2> /tmp/retpred.err
echo "RETPRED_RC=$?"
cat /tmp/retpred.err
echo "RETPRED=$(json /tmp/retpred)"
echo "RETPRED_A=$(cat /tmp/rp_a)"
echo "RETPRED_B=$(cat /tmp/rp_b)"
echo "RETPRED_AFTER=$(/bin/lseeks 100 10)"

# --- IF: one branch per call, chosen by the offset.
trapctl trace --json -e 'ksys_lseek /comm == "lseeks"/ { if (arg1 >= 100) { @big = count() } else if (arg1 == 0) { @zero = count() } else { @small = count() } }' -- sh -c '/bin/lseeks 100 4 && /bin/lseeks 7 3 > /dev/null' > /tmp/if
echo "IF_RC=$?"
echo "IF=$(json /tmp/if)"

# --- PRINTF: a probe's printf lines, one per call, in order (text form).
trapctl trace -e 'ksys_lseek:return /comm == "lseeks"/ { printf("lseek %d -> %d\n", arg1, retval) }' -- /bin/lseeks 7 3 > /tmp/printf
echo "PRINTF_RC=$?"
echo "PRINTF=$(tr '\n' '|' < /tmp/printf)"

# --- EXIT: exit() at the first call ends the trace: the maps printed, lseeks killed long
# before its million calls, status 0; nothing is counted after it.
trapctl trace --json -e 'ksys_lseek /comm == "lseeks"/ { @n = count(); exit() }' -- /bin/lseeks 100 1000000 > /tmp/exit
echo "EXIT_RC=$?"
echo "EXIT=$(json /tmp/exit)"

# --- INTERVAL: an interval probe runs in trapctl and its exit() ends a trace that would
# otherwise last 60 s.
t0=$(date +%s)
trapctl trace --json -e 'ksys_lseek /comm == "lseeks"/ { @n = count() } interval:ms:100 { printf("tick\n"); exit() }' --seconds 60 > /tmp/interval 2> /dev/null
echo "INTERVAL_RC=$?"
echo "INTERVAL_SECS=$(( $(date +%s) - t0 ))"
echo "INTERVAL=$(json /tmp/interval)"

# --- Nothing left.
echo "LEFT=$(trapctl list --json | tr -d '\n ')"
trapctl read __x64_sys_getppid > /tmp/after.hex
cmp -s /tmp/before.hex /tmp/after.hex && echo "BYTES=same" || echo "BYTES=changed"
echo "TRACE=done"
