#!/usr/bin/env bash
# The process demo: splice a running, unmodified program through the LD_PRELOAD agent.
# Usage: components/demo/run.sh  (from anywhere; builds what it needs)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/trapvec-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT

cargo build --release --quiet -p trapvec-agent --manifest-path "$repo/Cargo.toml"
agent=$repo/target/release/libtrapvec_agent.so

cp "$repo"/components/demo/{program.c,policy.c,spec.toml} "$work"/
cc -O2 -o "$work/program" "$work/program.c"
cc -c -O2 -fPIC -I "$repo/components/include" -o "$work/policy.o" "$work/policy.c"

echo "== the program as built"
"$work/program"
echo
echo "== the same binary, spliced while it runs (spec: components/demo/spec.toml)"
sed -n '/^\[\[splice\]\]/,/^$/p' "$work/spec.toml" | grep -E '^(at|action|handler|mechanism)' | paste -sd' ' | sed 's/ at = /\n  at = /g; s/^at = /  at = /'
echo
LD_PRELOAD=$agent TRAPVEC_SPEC=$work/spec.toml TRAPVEC_STATS=$work/stats.json "$work/program"
echo
echo "== hit counts written by the agent at exit (TRAPVEC_STATS)"
cat "$work/stats.json"
