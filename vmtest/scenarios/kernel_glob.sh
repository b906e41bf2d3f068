#!/bin/sh
# `trapctl splice 'GLOB' --count` over more than a thousand kernel functions (issue 28, item 2):
# all or nothing by default (refused, nothing left), --best-effort splices what validates and
# names each refusal reason with its count and first points (text on stderr, and in --json),
# loopback TCP traffic hits the spliced tcp/ip functions, and `trapctl unsplice 'GLOB'` removes
# exactly the glob's splices (a splice outside the glob stays). A glob takes no +offset (the
# glob syntax names functions: instr-manager/src/glob.rs), so the points are functions' entries.
# Prints KEY=value lines that vmtest/tests/kernel_glob.rs checks.
set -eu
. /lib/scenario.sh

# ip*, tcp*, udp*, icmp*, ... : the network stack's functions, >= 1,000 on 6.1.
glob='[iut][cdp]*'
echo "KALLSYMS=$(awk '$2 ~ /^[tTwW]$/ && $3 ~ /^[iut][cdp]/ { print $1 }' /proc/kallsyms | sort -u | wc -l)"
# Of those, vmlinux's in init memory, which the kernel freed after boot (addresses compared as
# the fixed-width hex strings kallsyms prints).
lo=$(awk '$3 == "__init_begin" && NF == 3 { print $1; exit }' /proc/kallsyms)
hi=$(awk '$3 == "__init_end" && NF == 3 { print $1; exit }' /proc/kallsyms)
echo "INIT_RANGE=$lo $hi"
echo "INIT_FUNCS=$(awk -v lo="$lo" -v hi="$hi" 'NF == 3 && $2 ~ /^[tTwW]$/ && $3 ~ /^[iut][cdp]/ && $1 "" >= lo "" && $1 "" < hi "" { print $1 }' /proc/kallsyms | sort -u | wc -l)"

# A splice outside the glob, which `unsplice GLOB` must leave.
trapctl splice --count __x64_sys_getpid > /dev/null

# All or nothing: refused as a whole, the first refusals named, nothing spliced.
set +e
trapctl splice --count "$glob" > /tmp/strict.out 2> /tmp/strict.err
echo "STRICT_STATUS=$?"
set -e
echo "STRICT_ERR=$(tr '\n' ' ' < /tmp/strict.err | cut -c 1-600)"
echo "STRICT_LEFT=$(($(trapctl list --json | grep -c '"site"' || true) - 1))"

# --best-effort, text.
start=$(date +%s)
set +e
trapctl splice --count --best-effort "$glob" > /tmp/be.out 2> /tmp/be.err
echo "BE_STATUS=$?"
set -e
echo "BE_SECONDS=$(($(date +%s) - start))"
echo "BE_SPLICED_ROWS=$(grep -c '^spliced .* at 0x' /tmp/be.out || true)"
echo "BE_SUMMARY=$(tail -n 1 /tmp/be.out)"
echo "BE_REFUSAL_LINES=$(grep -c '^refused [0-9]*: .* (at ' /tmp/be.err || true)"
echo "BE_REFUSED_SUM=$(awk '/^refused [0-9]+: / { sub(":", "", $2); n += $2 } END { print n + 0 }' /tmp/be.err)"
echo "BE_REFUSAL_FIRST=$(grep '^refused ' /tmp/be.err | head -n 1)"
echo "BE_INIT_FREED=$(sed -n 's/^refused \([0-9]*\): init code, freed after boot (at .*/\1/p' /tmp/be.err)"
echo "BE_INVALID=$(sed -n 's/^refused \([0-9]*\): invalid instruction in the function (at .*/\1/p' /tmp/be.err)"
# Copies of a name several static functions share: each by its address, `name@0xADDRESS`.
echo "BE_COPY_ROWS=$(grep -c '^spliced [^ ]*@0x[0-9a-f]* at 0x' /tmp/be.out || true)"
echo "BE_COPY_ROW=$(grep '^spliced [^ ]*@0x[0-9a-f]* at 0x' /tmp/be.out | head -n 1)"
echo "BE_AMBIGUOUS=$(grep -c '^refused [0-9]*: the name is ambiguous' /tmp/be.err || true)"
echo "KALLSYMS_COPIES=$(awk '$2 ~ /^[tTwW]$/ && $3 ~ /^[iut][cdp]/ { m = (NF == 4) ? $4 : "-"; print $3 "|" m " " $1 }' /proc/kallsyms | sort -u | awk '{ n[$1]++ } END { c = 0; for (k in n) if (n[k] > 1) c += n[k]; print c }')"
echo "BE_ERR_OTHER=$(grep -v '^refused ' /tmp/be.err | grep -v '^trapctl: ' | head -n 1)"
# Each reason, for the log (a few dozen characters of its points cut off).
grep '^refused ' /tmp/be.err | cut -c 1-240 | sed 's/^/REASON: /'
echo "LIVE=$(($(trapctl list --json | grep -c '"site"' || true) - 1))"

# Traffic: loopback connections and a stream run tcp/ip functions of the glob.
tcpmss -n 5 > /dev/null
tcpmss --traffic 1 > /dev/null
trapctl list > /tmp/list.txt
for f in tcp_v4_connect tcp_connect ip_queue_xmit tcp_v4_rcv ip_rcv ip_local_deliver tcp_sendmsg; do
	row=$(awk -v f="$f" '$1 == f' /tmp/list.txt)
	[ -n "$row" ] && echo "HITS_$f=$(echo "$row" | awk '{ print $(NF - 1) }')"
done
echo "BYSTANDER_ROW=$(awk '$1 == "__x64_sys_getpid"' /tmp/list.txt)"

# unsplice GLOB: exactly the glob's splices, in one batch.
trapctl unsplice "$glob" > /tmp/un.out
echo "UN_SUMMARY=$(tail -n 1 /tmp/un.out)"
echo "UN_ROWS=$(grep -c '^unspliced .* at 0x' /tmp/un.out || true)"
echo "AFTER_UNSPLICE=$(($(trapctl list --json | grep -c '"site"' || true) - 1))"
echo "AFTER_BYSTANDER=$(trapctl list | awk '$1 == "__x64_sys_getpid"' | wc -l)"

# --best-effort --json: the same batch, the refusals grouped by reason in the object.
set +e
trapctl splice --count --best-effort --json "$glob" > /tmp/be.json 2> /tmp/bej.err
echo "JSON_STATUS=$?"
set -e
echo "JSON_SCHEMA=$(grep -c '^  "schema": 1,' /tmp/be.json || true)"
echo "JSON_REQUESTED=$(sed -n 's/^  "requested": \([0-9]*\),*$/\1/p' /tmp/be.json)"
echo "JSON_SPLICED=$(grep -c '^      "site": "0x' /tmp/be.json || true)"
echo "JSON_REFUSED=$(awk '/^  "refused": \[$/ { on = 1; next } on && /^  \]/ { on = 0 } on { n++ } END { print n + 0 }' /tmp/be.json)"
echo "JSON_REASONS=$(grep -c '^      "reason": ' /tmp/be.json || true)"
echo "JSON_CAUSES=$(grep -c '^      "cause": "[a-z_]*",$' /tmp/be.json || true)"
echo "JSON_INIT_FREED=$(grep -c '^      "cause": "init_freed",$' /tmp/be.json || true)"
echo "JSON_STDERR_LINES=$(grep -vc '^trapctl: ' /tmp/bej.err || true)"
trapctl unsplice --json "$glob" > /tmp/un.json
echo "UN_JSON_ROWS=$(grep -c '"site": "0x' /tmp/un.json || true)"
echo "FINAL_LEFT=$(($(trapctl list --json | grep -c '"site"' || true) - 1))"
trapctl unsplice __x64_sys_getpid > /dev/null
echo "GLOB_DONE"
