#!/bin/sh
# trapvec beside the kernel's own mechanisms that users would pick instead (issue 13), in one
# guest. Under QEMU TCG every figure is emulated time: only ratios between rows of this run mean
# anything. Needs /files/fentry_count (vmtest/peers/fentry_count.c, static with libbpf) and
# /files/tv_lp_mss.ko (vmtest/peers/livepatch), which the test builds and passes with --file.
#
#  1. Hit cost vs BPF fentry, on __x64_sys_getppid (fentry through its BTF name, trapvec at +5, past the ftrace site, as in
#     bench.sh), timed by `sysbench` (ns per getppid(); fastest of ten runs of 20,000, in rounds over
#     every configuration in turn; the figure is the fastest round): nothing attached; a jmp
#     `call` splice with an empty handler; a jmp splice that only counts; a trap splice with the
#     empty handler; a BPF fentry program that only returns 0; one that counts into an array map.
#     One more run under the counting fentry program checks that it ran once per getppid(), and
#     one under each trapvec splice that its hits (trapctl list) are the getppid() calls made.
#     Then the one-liner `@[comm] = count()` (issue 29): `trapctl trace --mechanism jmp` of it
#     at the same point vs BPF fentry running the same map update (fentry_count --comm: a hash
#     map keyed by comm, as bpftrace compiles it); both maps' sysbench entries are checked against
#     the calls made.
#  2. Mass attach vs ftrace: N functions (unique names that ftrace can trace and trapctl can
#     splice), the function tracer with set_ftrace_filter = those N (write the filter, then
#     `function` > current_tracer; tracing_on 0 so no event is recorded) vs `trapctl apply` of N
#     count splices, trap and jmp (the whole command, and its commit from --timings); the filter
#     is written by index (see below), ftrace's fastest way. N = 1000; PEERS_10K=1 adds N = 5000
#     and 10000 (longer than CI's budget under TCG; a batch larger than trapvec.ko's code arena
#     holds would be refused whole, and printed as PEERS_TRAPVEC_REFUSED).
#  3. Policy hot-swap vs livepatch, tcp_sync_mss clamped to MTU 1000 (a new loopback
#     connection's MSS becomes 948): the livepatch module loaded until its transition is 0, then
#     disabled until the patch is gone and removed; vs `trapctl apply` of the splice
#     `tcp_sync_mss --replace mss_clamp_tcp_sync_mss` (the whole command, and its commit from
#     --timings) and `trapctl unsplice`, trap and jmp. Then the time
#     per loopback connection (`tcpmss -n`) unpatched, livepatched and replaced by trap and jmp.
#  4. Per call of tcp_sync_mss: /files/tv_mss_bench.ko (vmtest/peers/mssbench) calls it in a
#     loop on a connected loopback socket of its own (ns per call, fastest of ten runs of
#     20,000 calls, in rounds over the configurations in turn, the figure the fastest round):
#     unpatched, livepatched, and replaced by trap and by jmp. Each run's last MSS says which
#     tcp_sync_mss it measured (948 clamped); the trap replacement's hits are the calls made.
#
#  5. BPF kprobe_multi (/files/kmulti_count, vmtest/peers/kmulti_count.c), where the kernel has
#     CONFIG_FPROBE (6.12; 6.1 has not: PEERS_KMULTI=unsupported): an empty and a counting
#     program beside the rows of 1 (hit cost on __x64_sys_getppid, and the counting program's
#     hits checked against the calls made) and of 2 (attach and detach of one program on the
#     same N functions as trapvec's batch, the bpf_link_create() and the close() of its link).
#
#  6. Through trapd (/files/trapd, started with its timing logs): the batches of 2 and the
#     swaps of 3 again while trapd runs (trapctl then only forwards the request), and the swap
#     as a profile switch too (`trapctl activate`).
#
#   cargo test --release -p vmtest --test kernel_peers   (builds the peers and runs this)
#
# Output: PEERS_* lines (KEY=value ...). Every step that cannot run says why and fails the
# scenario: the test asserts that each peer actually ran.
set -eu
. /lib/scenario.sh

calls=${BENCH_CALLS:-20000}
runs=${PEERS_RUNS:-10}
rounds=${BENCH_ROUNDS:-5}
mass_rounds=${PEERS_MASS_ROUNDS:-3}
swaps=${PEERS_SWAPS:-3}
conns=${PEERS_CONNECTIONS:-300}
sizes=1000
[ "${PEERS_10K:-0}" = 1 ] && sizes="1000 5000 10000"
# The first instruction past the entry: +5 on 6.1, +9 on 6.12 (endbr64 first).
point=$(past_entry __x64_sys_getppid 0)
# __x64_sys_getppid is an alias of __do_sys_getppid (SYSCALL_DEFINE0 on x86), and the kernel's
# BTF has the function only under that name: fentry attaches to the same code (checked below).
fn=__do_sys_getppid
tracing=/sys/kernel/tracing
fentry=/files/fentry_count
kmulti=/files/kmulti_count
lp_ko=/files/tv_lp_mss.ko
bench_ko=/files/tv_mss_bench.ko

for f in $fentry $kmulti $lp_ko $bench_ko /files/trapd; do
	[ -e "$f" ] || { echo "PEERS: $f is missing (the test passes it with --file)"; exit 1; }
done
[ -e $tracing/available_filter_functions ] || mount -t tracefs nodev $tracing

# `STOPWATCH_NS=` of stopwatch's stderr in file $1, in ns.
stopwatch_ns() {
	sed -n 's/^STOPWATCH_NS=//p' "$1"
}

# After a batch applied by `stopwatch trapctl apply --timings` (its stderr in /tmp/sw): the
# whole command's time (apply_ns) and its plan, build and commit (ms), the splices live after it
# (live), then every splice removed, timed (remove_ns).
batch_figures() {
	apply_ns=$(stopwatch_ns /tmp/sw)
	commit_ms=$(sed -n 's/.*commit \([0-9.]*\) ms.*/\1/p' /tmp/sw)
	plan_ms=$(sed -n 's/.*plan \([0-9.]*\) ms.*/\1/p' /tmp/sw)
	build_ms=$(sed -n 's/.*build \([0-9.]*\) ms.*/\1/p' /tmp/sw)
	live=$(trapctl list --json | grep -o '"mechanism"' | wc -l)
	stopwatch trapctl unsplice --all > /dev/null 2> /tmp/sw
	remove_ns=$(stopwatch_ns /tmp/sw)
}

# The median of the numbers on stdin.
median() {
	sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

# --- 1. hit cost ---------------------------------------------------------------------------------

# The fastest of $runs short runs: emulated time is the host's time, so every moment the host
# takes QEMU off its CPU lands in a run; a short run has a chance to go through undisturbed.
cat > /tmp/best.sh << EOF
for _ in \$(seq $runs); do sysbench -n $calls; done | sort -n | head -n 1
EOF

measure() {
	case $1 in
	base) sh /tmp/best.sh ;;
	jmp_empty | jmp_count | trap_empty)
		case $1 in
		jmp_empty) trapctl splice "$point" --call empty_handler --mechanism jmp > /dev/null ;;
		jmp_count) trapctl splice "$point" --count --mechanism jmp > /dev/null ;;
		trap_empty) trapctl splice "$point" --call empty_handler > /dev/null ;;
		esac
		sh /tmp/best.sh
		trapctl unsplice "$point" > /dev/null
		;;
	fentry_empty) $fentry --empty $fn sh /tmp/best.sh 2> /tmp/fentry.err || { cat /tmp/fentry.err >&2; exit 1; } ;;
	fentry_count) $fentry $fn sh /tmp/best.sh 2> /tmp/fentry.err || { cat /tmp/fentry.err >&2; exit 1; } ;;
	fentry_comm) $fentry --comm $fn sh /tmp/best.sh 2> /tmp/fentry.err || { cat /tmp/fentry.err >&2; exit 1; } ;;
	trace_comm)
		# The trace's own lines (tracing..., the map) go to one file, the timing to another.
		trapctl trace --mechanism jmp -e "$point { @[comm] = count() }" \
			-- sh -c 'sh /tmp/best.sh > /tmp/trace.best' > /tmp/trace.out 2>&1 ||
			{ cat /tmp/trace.out >&2; exit 1; }
		cat /tmp/trace.best
		;;
	kmulti_empty) $kmulti --empty __x64_sys_getppid sh /tmp/best.sh 2> /tmp/kmulti.err || { cat /tmp/kmulti.err >&2; exit 1; } ;;
	kmulti_count) $kmulti __x64_sys_getppid sh /tmp/best.sh 2> /tmp/kmulti.err || { cat /tmp/kmulti.err >&2; exit 1; } ;;
	esac
}

a=$(awk '$3 == "__x64_sys_getppid" { print $1 }' /proc/kallsyms)
b=$(awk -v f=$fn '$3 == f { print $1 }' /proc/kallsyms)
echo "PEERS_FENTRY_TARGET $fn at $b, __x64_sys_getppid at $a"
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "PEERS: $fn is not __x64_sys_getppid"; exit 1; }

trapctl load /components/empty.o > /dev/null
trapctl load /components/mss_clamp.o > /dev/null
echo 0 > $tracing/tracing_on

# kprobe_multi needs CONFIG_FPROBE: 6.12 has it, 6.1 has not (the link is refused).
kconfigs=
if $kmulti --empty __x64_sys_getppid true 2> /tmp/kmulti.err; then
	kconfigs="kmulti_empty kmulti_count"
	echo "PEERS_KMULTI=yes"
else
	echo "PEERS_KMULTI=unsupported: $(grep '^kmulti_count:' /tmp/kmulti.err | head -n 1)"
fi

fastest_rounds PEERS_HIT_ROUND "base jmp_empty jmp_count trap_empty fentry_empty fentry_count trace_comm fentry_comm $kconfigs"
cat /tmp/fentry.err
echo "PEERS_HIT_CONFIG point=$point calls=$calls runs_per_round=$runs rounds=$rounds figure=fastest run of all rounds"
for c in $configs; do
	eval "v=\$min_$c"
	echo "PEERS_NS_$(echo "$c" | tr a-z A-Z)=$v"
done

# The counting program ran exactly once per getppid(): sysbench makes calls + calls/10 + 1
# (warm-up) + 1 (its expected parent) of them.
check=20000
$fentry $fn sysbench -n $check > /dev/null 2> /tmp/fentry.err
cat /tmp/fentry.err
hits=$(sed -n 's/^FENTRY_HITS=//p' /tmp/fentry.err)
echo "PEERS_FENTRY_HITS=$hits expected=$((check + check / 10 + 2))"

# The same check for each of trapvec's timed splices: its hits (trapctl list) for the calls made.
for c in jmp_empty jmp_count trap_empty; do
	case $c in
	jmp_empty) trapctl splice "$point" --call empty_handler --mechanism jmp > /dev/null ;;
	jmp_count) trapctl splice "$point" --count --mechanism jmp > /dev/null ;;
	trap_empty) trapctl splice "$point" --call empty_handler > /dev/null ;;
	esac
	sysbench -n $check > /dev/null
	hits=$(trapctl list --json | sed -n 's/.*"hits": *\([0-9]*\).*/\1/p' | head -n 1)
	trapctl unsplice "$point" > /dev/null
	echo "PEERS_TRAPVEC_HITS config=$c hits=${hits:-none} expected=$((check + check / 10 + 2))"
done

# The one-liner's map and the comm-keyed fentry program's: sysbench's entry is the calls made.
trapctl trace --mechanism jmp -e "$point { @[comm] = count() }" -- sysbench -n $check > /tmp/trace.out 2>&1 ||
	{ cat /tmp/trace.out >&2; exit 1; }
cat /tmp/trace.out
echo "PEERS_TRACE_COMM_HITS=$(sed -n 's/^@\[sysbench\]: //p' /tmp/trace.out) expected=$((check + check / 10 + 2))"
$fentry --comm $fn sysbench -n $check > /dev/null 2> /tmp/fentry.err
cat /tmp/fentry.err
echo "PEERS_FENTRY_COMM_HITS=$(sed -n 's/^FENTRY_COMM sysbench=//p' /tmp/fentry.err) expected=$((check + check / 10 + 2))"

if [ -n "$kconfigs" ]; then
	$kmulti __x64_sys_getppid sysbench -n $check > /dev/null 2> /tmp/kmulti.err
	cat /tmp/kmulti.err
	echo "PEERS_KMULTI_HITS=$(sed -n 's/^KMULTI_HITS=//p' /tmp/kmulti.err) expected=$((check + check / 10 + 2))"
	awk -v b="$min_base" -v ke="$min_kmulti_empty" -v kc="$min_kmulti_count" \
		-v fe="$min_fentry_empty" -v je="$min_jmp_empty" -v jc="$min_jmp_count" '
	function ratio(a, d) { return d == 0 ? "nan" : sprintf("%.2f", a / d) }
	BEGIN {
		printf "PEERS_KMULTI_HIT_NS kmulti_empty=%d kmulti_count=%d\n", ke - b, kc - b
		printf "PEERS_RATIO_JMP_EMPTY_TO_KMULTI_EMPTY=%s\n", ratio(je - b, ke - b)
		printf "PEERS_RATIO_JMP_COUNT_TO_KMULTI_COUNT=%s\n", ratio(jc - b, kc - b)
		printf "PEERS_RATIO_KMULTI_EMPTY_TO_FENTRY_EMPTY=%s\n", ratio(ke - b, fe - b)
	}'
fi

awk -v b="$min_base" -v je="$min_jmp_empty" -v jc="$min_jmp_count" -v te="$min_trap_empty" \
	-v fe="$min_fentry_empty" -v fc="$min_fentry_count" -v tc="$min_trace_comm" -v fm="$min_fentry_comm" '
function ratio(a, d) { return d == 0 ? "nan" : sprintf("%.2f", a / d) }
BEGIN {
	printf "PEERS_HIT_NS jmp_empty=%d jmp_count=%d trap_empty=%d fentry_empty=%d fentry_count=%d\n", \
		je - b, jc - b, te - b, fe - b, fc - b
	printf "PEERS_RATIO_JMP_EMPTY_TO_FENTRY_EMPTY=%s (goal <= 1.0)\n", ratio(je - b, fe - b)
	printf "PEERS_RATIO_JMP_COUNT_TO_FENTRY_COUNT=%s\n", ratio(jc - b, fc - b)
	printf "PEERS_RATIO_TRAP_EMPTY_TO_FENTRY_EMPTY=%s\n", ratio(te - b, fe - b)
	printf "PEERS_COMM_HIT_NS trace_comm=%d fentry_comm=%d\n", tc - b, fm - b
	printf "PEERS_RATIO_TRACE_COMM_JMP_TO_FENTRY_COMM=%s (goal <= 1.0)\n", ratio(tc - b, fm - b)
}'

# --- 2. mass attach vs ftrace ------------------------------------------------------------------

# Unique core-kernel names ftrace can trace (a name shared by several static functions would
# select them all), in kallsyms order.
grep -v '\[' $tracing/available_filter_functions | sort | uniq -u > /tmp/ftrace_names
awk '$2 ~ /^[tT]$/ && NF == 3 { print $3 }' /proc/kallsyms > /tmp/ksyms
awk 'NR == FNR { ok[$1] = 1; next } ok[$1]' /tmp/ftrace_names /tmp/ksyms > /tmp/traceable
echo "PEERS_TRACEABLE=$(wc -l < /tmp/traceable)"

# The spec of count splices on the names in file $1, by mechanism $2.
count_spec() {
	awk -v m="$2" '{ printf "[[splice]]\nat = \"%s\"\naction = \"count\"\nmechanism = \"%s\"\n", $1, m }' "$1"
}

# What every trapctl command pays before it plans anything: /proc/kallsyms as the kernel
# formats it (cat), and a `trapctl list` with nothing live (process start, /dev/trapvec, kallsyms
# read and parsed, the state blob checked).
for r in $(seq 1 $mass_rounds); do
	stopwatch cat /proc/kallsyms > /dev/null 2> /tmp/sw
	stopwatch_ns /tmp/sw >> /tmp/fixed_kallsyms
	stopwatch trapctl list > /dev/null 2> /tmp/sw
	stopwatch_ns /tmp/sw >> /tmp/fixed_list
done
echo "PEERS_TRAPCTL_FIXED kallsyms_ns=$(median < /tmp/fixed_kallsyms) list_ns=$(median < /tmp/fixed_list) symbols=$(wc -l < /proc/kallsyms) (medians of $mass_rounds)"

echo 0 > /proc/sys/kernel/ftrace_enabled 2> /dev/null || true
echo 1 > /proc/sys/kernel/ftrace_enabled 2> /dev/null || true
for n in $sizes; do
	# Candidates spread over the text; the first n that trapctl plans for jmp (a count splice
	# at the entry, past the ftrace site), which trap then takes too.
	want=$((n + n / 2))
	step=$(( $(wc -l < /tmp/traceable) / want ))
	[ "$step" -ge 1 ] || step=1
	awk -v s="$step" 'NR % s == 0' /tmp/traceable > /tmp/cand
	count_spec /tmp/cand jmp > /tmp/cand.toml
	trapctl apply --check /tmp/cand.toml > /tmp/check.out 2> /dev/null || true
	awk '$1 == "ok" { print $2 }' /tmp/check.out | head -n "$n" > /tmp/names_$n
	got=$(wc -l < /tmp/names_$n)
	echo "PEERS_MASS_CANDIDATES n=$n candidates=$(wc -l < /tmp/cand) planned=$(grep -c '^ok ' /tmp/check.out) used=$got"
	[ "$got" -eq "$n" ] || { echo "PEERS: only $got of $n functions can be spliced"; exit 1; }
	# ftrace's filter takes them by index (their line in available_filter_functions): by name,
	# each name is matched against every record (1000 names took 134 s of emulated time).
	awk 'NR == FNR { want[$1] = 1; next } ($1 in want) { print FNR }' /tmp/names_$n \
		$tracing/available_filter_functions > /tmp/index_$n
	sort /tmp/names_$n > /tmp/sorted_$n

	# ftrace, round by round with trapvec's.
	for r in $(seq 1 $mass_rounds); do
		stopwatch cp /tmp/index_$n $tracing/set_ftrace_filter 2> /tmp/sw
		filter_ns=$(stopwatch_ns /tmp/sw)
		filtered=$(wc -l < $tracing/set_ftrace_filter)
		sort $tracing/set_ftrace_filter | cmp -s - /tmp/sorted_$n ||
			{ echo "PEERS: set_ftrace_filter does not hold the $n names written by index"; exit 1; }
		echo function | stopwatch tee $tracing/current_tracer > /dev/null 2> /tmp/sw
		enable_ns=$(stopwatch_ns /tmp/sw)
		enabled=$(grep -c . $tracing/enabled_functions || true)
		echo nop | stopwatch tee $tracing/current_tracer > /dev/null 2> /tmp/sw
		disable_ns=$(stopwatch_ns /tmp/sw)
		echo > $tracing/set_ftrace_filter
		echo "PEERS_FTRACE_ROUND n=$n round=$r filter_ns=$filter_ns enable_ns=$enable_ns disable_ns=$disable_ns filtered=$filtered enabled=$enabled"
		echo "$filter_ns" >> /tmp/ft_filter_$n
		echo "$enable_ns" >> /tmp/ft_enable_$n
		echo "$disable_ns" >> /tmp/ft_disable_$n
		[ "$filtered" -eq "$n" ] || { echo "PEERS: set_ftrace_filter took $filtered of $n names"; exit 1; }
		[ "$enabled" -ge "$n" ] || { echo "PEERS: the function tracer enabled $enabled of $n"; exit 1; }

		for m in trap jmp; do
			count_spec /tmp/names_$n $m > /tmp/mass.toml
			if ! stopwatch trapctl apply --timings /tmp/mass.toml > /dev/null 2> /tmp/sw; then
				# The module's code arena holds 16,384 trampolines (kmod/README.md): past that
				# the batch is refused as a whole (nothing applied), a limit reported, not a failure.
				grep -q 'arena of trapvec.ko is full' /tmp/sw ||
					{ echo "PEERS: trapctl apply of $n $m splices failed:"; cat /tmp/sw; exit 1; }
				echo "PEERS_TRAPVEC_REFUSED n=$n round=$r mechanism=$m: $(grep -o 'no repository memory.*' /tmp/sw)"
				[ "$(trapctl list --json | grep -o '"mechanism"' | wc -l)" -eq 0 ] ||
					{ echo "PEERS: a refused batch left splices behind"; exit 1; }
				continue
			fi
			batch_figures
			echo "PEERS_TRAPVEC_MASS_ROUND n=$n round=$r mechanism=$m apply_ns=$apply_ns plan_ms=$plan_ms build_ms=$build_ms commit_ms=$commit_ms remove_ns=$remove_ns live=$live"
			echo "$apply_ns" >> /tmp/tv_apply_${m}_$n
			echo "$plan_ms" >> /tmp/tv_plan_${m}_$n
			echo "$build_ms" >> /tmp/tv_build_${m}_$n
			echo "$commit_ms" >> /tmp/tv_commit_${m}_$n
			echo "$remove_ns" >> /tmp/tv_remove_${m}_$n
			[ "$live" -eq "$n" ] || { echo "PEERS: trapctl list shows $live of $n splices"; exit 1; }
		done

		# kprobe_multi: one program on the same n functions, attached and detached.
		[ -n "$kconfigs" ] || continue
		for k in empty count; do
			opt=
			[ $k = empty ] && opt=--empty
			$kmulti $opt --syms /tmp/names_$n true 2> /tmp/km.err ||
				{ echo "PEERS: kprobe_multi on $n functions failed:"; cat /tmp/km.err; exit 1; }
			attached=$(sed -n 's/^KMULTI_ATTACHED n=\([0-9]*\) .*/\1/p' /tmp/km.err)
			attach_ns=$(sed -n 's/^KMULTI_ATTACHED .* attach_ns=\([0-9]*\)/\1/p' /tmp/km.err)
			detach_ns=$(sed -n 's/^KMULTI_DETACH_NS=//p' /tmp/km.err)
			echo "PEERS_KMULTI_MASS_ROUND n=$n round=$r program=$k attach_ns=$attach_ns detach_ns=$detach_ns attached=$attached"
			[ "$attached" -eq "$n" ] || { echo "PEERS: kprobe_multi attached $attached of $n"; exit 1; }
			echo "$attach_ns" >> /tmp/km_attach_${k}_$n
			echo "$detach_ns" >> /tmp/km_detach_${k}_$n
		done
	done
	ff=$(median < /tmp/ft_filter_$n)
	fe=$(median < /tmp/ft_enable_$n)
	fd=$(median < /tmp/ft_disable_$n)
	echo "PEERS_FTRACE_$n filter_ns=$ff enable_ns=$fe disable_ns=$fd (medians of $mass_rounds)"
	for k in empty count; do
		[ -s /tmp/km_attach_${k}_$n ] || continue
		echo "PEERS_KMULTI_${n}_$(echo $k | tr a-z A-Z) attach_ns=$(median < /tmp/km_attach_${k}_$n) detach_ns=$(median < /tmp/km_detach_${k}_$n) (medians of $mass_rounds)"
	done
	for m in trap jmp; do
		[ -s /tmp/tv_apply_${m}_$n ] || continue
		ta=$(median < /tmp/tv_apply_${m}_$n)
		tc=$(median < /tmp/tv_commit_${m}_$n)
		tr=$(median < /tmp/tv_remove_${m}_$n)
		tp=$(median < /tmp/tv_plan_${m}_$n)
		tb=$(median < /tmp/tv_build_${m}_$n)
		echo "PEERS_TRAPVEC_${n}_$(echo $m | tr a-z A-Z) apply_ns=$ta plan_ms=$tp build_ms=$tb commit_ms=$tc remove_ns=$tr (medians of $mass_rounds)"
		awk -v ff="$ff" -v fe="$fe" -v ta="$ta" -v tc="$tc" -v n="$n" -v m="$m" 'BEGIN {
			printf "PEERS_RATIO_%s_COMMIT_TO_FTRACE_ENABLE_%d=%.2f (goal <= 1.0 at 10000)\n", toupper(m), n, tc * 1e6 / fe
			printf "PEERS_RATIO_%s_APPLY_TO_FTRACE_FILTER_ENABLE_%d=%.2f (goal <= 2.0 at 10000)\n", toupper(m), n, ta / (ff + fe)
		}'
		if [ -s /tmp/km_attach_count_$n ]; then
			ka=$(median < /tmp/km_attach_count_$n)
			kd=$(median < /tmp/km_detach_count_$n)
			awk -v ka="$ka" -v kd="$kd" -v ta="$ta" -v tc="$tc" -v tr="$tr" -v n="$n" -v m="$m" 'BEGIN {
				printf "PEERS_RATIO_%s_COMMIT_TO_KMULTI_ATTACH_%d=%.2f\n", toupper(m), n, tc * 1e6 / ka
				printf "PEERS_RATIO_%s_APPLY_TO_KMULTI_ATTACH_%d=%.2f\n", toupper(m), n, ta / ka
				printf "PEERS_RATIO_%s_REMOVE_TO_KMULTI_DETACH_%d=%.2f\n", toupper(m), n, tr / kd
			}'
		fi
	done
done
stopwatch true 2> /tmp/sw
echo "PEERS_PROCESS_FLOOR_NS=$(stopwatch_ns /tmp/sw) (stopwatch true: fork + exec + wait)"

# --- 3. hot swap vs livepatch ------------------------------------------------------------------

lp=/sys/kernel/livepatch/tv_lp_mss
mss() {
	tcpmss
}
expect_mss() {
	got=$(mss)
	[ "$got" = "$2" ] || { echo "PEERS: $1: a new connection's MSS is $got, not $2"; exit 1; }
}

expect_mss "unpatched" 32741
for r in $(seq 1 $swaps); do
	livepatch_swap enable $lp_ko tv_lp_mss > /tmp/lp.out
	[ "$(cat $lp/transition)" = 0 ] && [ "$(cat $lp/enabled)" = 1 ] || { echo "PEERS: livepatch not complete"; exit 1; }
	expect_mss "livepatched" 948
	livepatch_swap disable tv_lp_mss >> /tmp/lp.out
	expect_mss "livepatch removed" 32741
	echo "PEERS_LIVEPATCH_ROUND $r: $(tr '\n' ' ' < /tmp/lp.out)"
	sed -n 's/^LP_TRANSITION_NS=//p' /tmp/lp.out >> /tmp/lp_enable
	sed -n 's/^LP_LOAD_NS=//p' /tmp/lp.out >> /tmp/lp_load
	sed -n 's/^LP_DISABLE_NS=//p' /tmp/lp.out >> /tmp/lp_disable
	sed -n 's/^LP_UNLOAD_NS=//p' /tmp/lp.out >> /tmp/lp_unload

	for m in trap jmp; do
		printf '[[splice]]\nat = "tcp_sync_mss"\naction = "replace"\nhandler = "mss_clamp_tcp_sync_mss"\nmechanism = "%s"\n' \
			$m > /tmp/replace.toml
		stopwatch trapctl apply --timings /tmp/replace.toml > /dev/null 2> /tmp/sw
		s=$(stopwatch_ns /tmp/sw)
		c=$(sed -n 's/.*commit \([0-9.]*\) ms.*/\1/p' /tmp/sw)
		expect_mss "replaced by $m" 948
		stopwatch trapctl unsplice tcp_sync_mss > /dev/null 2> /tmp/sw
		u=$(stopwatch_ns /tmp/sw)
		expect_mss "$m replacement removed" 32741
		echo "PEERS_REPLACE_ROUND $r: mechanism=$m splice_ns=$s commit_ms=$c unsplice_ns=$u"
		echo "$s" >> /tmp/rp_splice_$m
		echo "$c" >> /tmp/rp_commit_$m
		echo "$u" >> /tmp/rp_unsplice_$m
	done
done
le=$(median < /tmp/lp_enable)
ll=$(median < /tmp/lp_load)
ld=$(median < /tmp/lp_disable)
lu=$(median < /tmp/lp_unload)
echo "PEERS_LIVEPATCH load_ns=$ll transition_ns=$le disable_ns=$ld unload_ns=$lu (medians of $swaps)"
for m in trap jmp; do
	s=$(median < /tmp/rp_splice_$m)
	u=$(median < /tmp/rp_unsplice_$m)
	c=$(median < /tmp/rp_commit_$m)
	echo "PEERS_REPLACE_$(echo $m | tr a-z A-Z) splice_ns=$s commit_ms=$c unsplice_ns=$u (medians of $swaps)"
	awk -v le="$le" -v ld="$ld" -v s="$s" -v c="$c" -v u="$u" -v m="$m" 'BEGIN {
		printf "PEERS_RATIO_LIVEPATCH_TRANSITION_TO_%s_SPLICE=%.1f (goal >= 20; the whole trapctl command)\n", toupper(m), le / s
		printf "PEERS_RATIO_LIVEPATCH_TRANSITION_TO_%s_COMMIT=%.1f (goal >= 20; the commit, from --timings)\n", toupper(m), le / (c * 1e6)
		printf "PEERS_RATIO_LIVEPATCH_DISABLE_TO_%s_UNSPLICE=%.1f\n", toupper(m), ld / u
	}'
done

# Time per loopback connection (each makes a few tcp_sync_mss() calls; `trapctl list` counts
# them for the trap replacement), rounds over the configurations in turn, fastest round.
conn_ns() {
	stopwatch tcpmss -n "$conns" > /dev/null 2> /tmp/sw
	echo $(( $(stopwatch_ns /tmp/sw) / conns ))
}
for c in none livepatch trap jmp; do eval "cmin_$c=999999999999"; done
for r in $(seq 1 $swaps); do
	line="PEERS_CONN_ROUND $r:"
	for c in none livepatch trap jmp; do
		case $c in
		livepatch) livepatch_swap enable $lp_ko tv_lp_mss > /dev/null ;;
		trap | jmp) trapctl splice tcp_sync_mss --replace mss_clamp_tcp_sync_mss --mechanism $c > /dev/null ;;
		esac
		v=$(conn_ns)
		if [ "$c" = trap ]; then
			calls_per_conn=$(trapctl list --json | sed -n 's/.*"hits": *\([0-9]*\).*/\1/p' | head -n 1)
		fi
		case $c in
		livepatch) livepatch_swap disable tv_lp_mss > /dev/null ;;
		trap | jmp) trapctl unsplice tcp_sync_mss > /dev/null ;;
		esac
		line="$line $c=$v"
		eval "[ \"$v\" -lt \"\$cmin_$c\" ] && cmin_$c=$v" || true
	done
	echo "$line"
done
echo "PEERS_CONN_NS none=$cmin_none livepatch=$cmin_livepatch trap=$cmin_trap jmp=$cmin_jmp (connections=$conns, fastest of $swaps; tcp_sync_mss calls in $conns connections: ${calls_per_conn:-unknown})"
awk -v b="$cmin_none" -v l="$cmin_livepatch" -v j="$cmin_jmp" 'BEGIN {
	if (j - b > 0 && l - b >= 0.05 * b)
		printf "PEERS_RATIO_JMP_TO_LIVEPATCH_PER_CONNECTION=%.2f (goal <= 1.0; overheads over unpatched)\n", (j - b) / (l - b)
	else
		printf "PEERS_RATIO_JMP_TO_LIVEPATCH_PER_CONNECTION=nan (overheads livepatch %d ns, jmp %d ns: within the noise)\n", l - b, j - b
}'

# --- 4. per call of tcp_sync_mss ---------------------------------------------------------------

call_calls=${PEERS_CALLS:-20000}
insmod $bench_ko
run=/sys/module/tv_mss_bench/parameters/run
# The fastest of $runs runs of $call_calls calls: "ns mss" of that run (ns for all the calls).
call_run() {
	for _ in $(seq $runs); do
		echo "$call_calls" > $run
		sed -n 's/^calls=[0-9]* ns=\([0-9]*\) mss=\([0-9]*\)$/\1 \2/p' $run
	done | sort -n | head -n 1
}
for c in none livepatch trap jmp; do eval "pmin_$c=999999999999"; done
for r in $(seq 1 $swaps); do
	line="PEERS_CALL_ROUND $r:"
	for c in none livepatch trap jmp; do
		case $c in
		livepatch) livepatch_swap enable $lp_ko tv_lp_mss > /dev/null ;;
		trap | jmp) trapctl splice tcp_sync_mss --replace mss_clamp_tcp_sync_mss --mechanism $c > /dev/null ;;
		esac
		set -- $(call_run)
		ns=$1 got=$2
		if [ "$c" = trap ]; then
			hits=$(trapctl list --json | sed -n 's/.*"hits": *\([0-9]*\).*/\1/p' | head -n 1)
			[ "${hits:-0}" -ge $((runs * call_calls)) ] ||
				{ echo "PEERS: the trap replacement counted ${hits:-no} hits for $((runs * call_calls)) calls"; exit 1; }
		fi
		case $c in
		livepatch) livepatch_swap disable tv_lp_mss > /dev/null ;;
		trap | jmp) trapctl unsplice tcp_sync_mss > /dev/null ;;
		esac
		if [ "$c" = none ]; then
			[ "$got" != 948 ] || { echo "PEERS: unpatched tcp_sync_mss returned the clamped MSS 948"; exit 1; }
			mss_none=$got
		else
			[ "$got" = 948 ] || { echo "PEERS: tcp_sync_mss under $c returned $got, not 948"; exit 1; }
		fi
		line="$line $c=$ns mss=$got"
		eval "[ \"$ns\" -lt \"\$pmin_$c\" ] && pmin_$c=$ns" || true
	done
	echo "$line"
done
rmmod tv_mss_bench
echo "PEERS_CALL_CONFIG calls=$call_calls runs_per_round=$runs rounds=$swaps figure=fastest run of all rounds, ns for all the calls; trap hits in the last round=$hits"
awk -v n="$call_calls" -v b="$pmin_none" -v l="$pmin_livepatch" -v t="$pmin_trap" -v j="$pmin_jmp" \
	-v mss="$mss_none" '
function ratio(a, d) { return d <= 0 ? "nan" : sprintf("%.2f", a / d) }
BEGIN {
	printf "PEERS_CALL_NS none=%.1f livepatch=%.1f trap=%.1f jmp=%.1f (ns per tcp_sync_mss call; MSS unpatched %s, clamped 948)\n", \
		b / n, l / n, t / n, j / n, mss
	printf "PEERS_CALL_OVERHEAD_NS livepatch=%.1f trap=%.1f jmp=%.1f\n", (l - b) / n, (t - b) / n, (j - b) / n
	printf "PEERS_RATIO_JMP_TO_LIVEPATCH_PER_CALL=%s (goal <= 1.0; overheads over unpatched)\n", ratio(j - b, l - b)
	printf "PEERS_RATIO_TRAP_TO_LIVEPATCH_PER_CALL=%s (overheads over unpatched)\n", ratio(t - b, l - b)
	printf "PEERS_RATIO_JMP_TO_LIVEPATCH_CALL=%s (whole calls)\n", ratio(j, l)
}'

# --- 6. the same changes through trapd ---------------------------------------------------------

# trapctl hands a change to trapd when one listens (issue 26): trapd has read kallsyms and the
# module's state once, so the whole command is trapctl's start, the request, trapd's work and
# the reply. The mass batches of 2 (the same names, the same spec) and the swap of 3, as the
# whole command; the swap also as a profile switch (`trapctl activate`: clean -> mss_<mech>
# -> clean). trapd logs where each request's time went (`timing:` lines, debug level).
cat > /tmp/trapd.toml << 'EOF'
initial_profile = "clean"

[profile.clean]

[profile.mss_trap]
components = ["/components/mss_clamp.o"]
splice = [{ at = "tcp_sync_mss", action = "replace", handler = "mss_clamp_tcp_sync_mss", mechanism = "trap" }]

[profile.mss_jmp]
components = ["/components/mss_clamp.o"]
splice = [{ at = "tcp_sync_mss", action = "replace", handler = "mss_clamp_tcp_sync_mss", mechanism = "jmp" }]
EOF
export RUST_LOG=info,trapd=debug,trapvec_proto=debug
start_trapd -
unset RUST_LOG
trapctl status > /dev/null || { echo "PEERS: trapctl does not reach trapd"; exit 1; }
for n in $sizes; do
	for r in $(seq 1 $mass_rounds); do
		for m in trap jmp; do
			# Only what ran directly in 2 (a batch the arena refused there is not tried here).
			[ -s /tmp/tv_apply_${m}_$n ] || continue
			count_spec /tmp/names_$n $m > /tmp/mass.toml
			stopwatch trapctl apply --timings /tmp/mass.toml > /dev/null 2> /tmp/sw ||
				{ echo "PEERS: trapctl apply of $n $m splices through trapd failed:"; cat /tmp/sw; exit 1; }
			batch_figures
			echo "PEERS_TRAPD_MASS_ROUND n=$n round=$r mechanism=$m apply_ns=$apply_ns plan_ms=$plan_ms build_ms=$build_ms commit_ms=$commit_ms remove_ns=$remove_ns live=$live"
			echo "$apply_ns" >> /tmp/td_apply_${m}_$n
			echo "$commit_ms" >> /tmp/td_commit_${m}_$n
			echo "$remove_ns" >> /tmp/td_remove_${m}_$n
			[ "$live" -eq "$n" ] || { echo "PEERS: trapctl list through trapd shows $live of $n splices"; exit 1; }
		done
	done
	ff=$(median < /tmp/ft_filter_$n)
	fe=$(median < /tmp/ft_enable_$n)
	for m in trap jmp; do
		[ -s /tmp/td_apply_${m}_$n ] || continue
		ta=$(median < /tmp/td_apply_${m}_$n)
		tc=$(median < /tmp/td_commit_${m}_$n)
		tr=$(median < /tmp/td_remove_${m}_$n)
		echo "PEERS_TRAPD_${n}_$(echo $m | tr a-z A-Z) apply_ns=$ta commit_ms=$tc remove_ns=$tr (medians of $mass_rounds)"
		awk -v ff="$ff" -v fe="$fe" -v ta="$ta" -v n="$n" -v m="$m" 'BEGIN {
			printf "PEERS_RATIO_%s_TRAPD_APPLY_TO_FTRACE_FILTER_ENABLE_%d=%.2f (goal <= 1.0 at 10000)\n", toupper(m), n, ta / (ff + fe)
		}'
	done
done

for r in $(seq 1 $swaps); do
	for m in trap jmp; do
		printf '[[splice]]\nat = "tcp_sync_mss"\naction = "replace"\nhandler = "mss_clamp_tcp_sync_mss"\nmechanism = "%s"\n' \
			$m > /tmp/replace.toml
		stopwatch trapctl apply --timings /tmp/replace.toml > /dev/null 2> /tmp/sw ||
			{ echo "PEERS: trapctl apply of the $m replacement through trapd failed:"; cat /tmp/sw; exit 1; }
		s=$(stopwatch_ns /tmp/sw)
		c=$(sed -n 's/.*commit \([0-9.]*\) ms.*/\1/p' /tmp/sw)
		expect_mss "replaced by $m through trapd" 948
		stopwatch trapctl unsplice tcp_sync_mss > /dev/null 2> /tmp/sw
		u=$(stopwatch_ns /tmp/sw)
		expect_mss "$m replacement removed through trapd" 32741
		stopwatch trapctl activate mss_$m > /tmp/act.out 2> /tmp/sw ||
			{ echo "PEERS: trapctl activate mss_$m failed:"; cat /tmp/act.out /tmp/sw; exit 1; }
		a=$(stopwatch_ns /tmp/sw)
		expect_mss "profile mss_$m" 948
		stopwatch trapctl activate clean > /tmp/act.out 2> /tmp/sw ||
			{ echo "PEERS: trapctl activate clean failed:"; cat /tmp/act.out /tmp/sw; exit 1; }
		b=$(stopwatch_ns /tmp/sw)
		expect_mss "profile clean after mss_$m" 32741
		echo "PEERS_TRAPD_SWAP_ROUND $r: mechanism=$m splice_ns=$s commit_ms=$c unsplice_ns=$u activate_ns=$a deactivate_ns=$b"
		echo "$s" >> /tmp/tds_splice_$m
		echo "$c" >> /tmp/tds_commit_$m
		echo "$u" >> /tmp/tds_unsplice_$m
		echo "$a" >> /tmp/tds_activate_$m
		echo "$b" >> /tmp/tds_deactivate_$m
	done
done
for m in trap jmp; do
	s=$(median < /tmp/tds_splice_$m)
	c=$(median < /tmp/tds_commit_$m)
	u=$(median < /tmp/tds_unsplice_$m)
	a=$(median < /tmp/tds_activate_$m)
	b=$(median < /tmp/tds_deactivate_$m)
	echo "PEERS_TRAPD_SWAP_$(echo $m | tr a-z A-Z) splice_ns=$s commit_ms=$c unsplice_ns=$u activate_ns=$a deactivate_ns=$b (medians of $swaps)"
	awk -v le="$le" -v s="$s" -v a="$a" -v m="$m" 'BEGIN {
		printf "PEERS_RATIO_LIVEPATCH_TRANSITION_TO_%s_TRAPD_SPLICE=%.1f (goal >= 20; trapctl apply through trapd)\n", toupper(m), le / s
		printf "PEERS_RATIO_LIVEPATCH_TRANSITION_TO_%s_TRAPD_ACTIVATE=%.1f (goal >= 20; trapctl activate, a profile switch)\n", toupper(m), le / a
	}'
done
# Where trapd's time went, per change request (its `timing:` lines).
grep 'timing:' /tmp/trapd.log | grep -v -e 'timing: list ' -e 'timing: status ' | sed 's/^/PEERS_TRAPD_LOG /'
kill $tdp
wait $tdp 2> /dev/null || true

echo 1 > $tracing/tracing_on
echo "PEERS_DONE"
