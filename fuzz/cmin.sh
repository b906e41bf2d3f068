#!/bin/sh
# fuzz/cmin.sh HARNESS: minimise the corpus of HARNESS into fuzz/corpus/HARNESS: the seeds
# (seed-*) are kept, then libFuzzer's merge adds, from the committed corpus and the campaign's
# work folder (fuzz/libfuzzer/work/HARNESS), only the inputs that reach an edge not reached yet
# (-use_counters=0: edges, not hit counts, so the corpus stays a few hundred files).
set -eu
h=$1
dir=$(cd "$(dirname "$0")" && pwd)
bin=$dir/libfuzzer/target/x86_64-unknown-linux-gnu/release/$h
new=$(mktemp -d)
old=$(mktemp -d)
cp "$dir/corpus/$h"/seed-* "$new/"
cp "$dir/corpus/$h"/* "$old/"
work=$dir/libfuzzer/work/$h
mkdir -p "$work"
nice -n 19 "$bin" -merge=1 -use_counters=0 -timeout=10 -rss_limit_mb=2048 "$new" "$old" "$work" 2>&1 | grep -a "MERGE-OUTER" | tail -n 2
rm -rf "$dir/corpus/$h" "$old"
mv "$new" "$dir/corpus/$h"
chmod 755 "$dir/corpus/$h"
echo "$h: $(ls "$dir/corpus/$h" | wc -l) files, $(du -sk "$dir/corpus/$h" | cut -f1) KiB"
