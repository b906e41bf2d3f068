#!/bin/sh
# fuzz/run.sh HARNESS SECONDS: fuzz one harness with libFuzzer for SECONDS, under nice -n 19
# (it takes only idle CPU), in fork mode (a crash is saved and fuzzing goes on). New inputs
# go to fuzz/libfuzzer/work/HARNESS (the committed corpus fuzz/corpus/HARNESS is read, not
# written); crashes and timeouts to fuzz/libfuzzer/artifacts/HARNESS/. Builds the targets
# first when they are missing (stable Rust with RUSTC_BOOTSTRAP=1, cargo-fuzz installed).
set -eu
h=$1
secs=$2
dir=$(cd "$(dirname "$0")" && pwd)
bin=$dir/libfuzzer/target/x86_64-unknown-linux-gnu/release/$h
if [ ! -x "$bin" ]; then
	(cd "$dir/libfuzzer" && RUSTC_BOOTSTRAP=1 cargo fuzz build --fuzz-dir . -s none -O -a)
fi
work=$dir/libfuzzer/work/$h
art=$dir/libfuzzer/artifacts/$h/
mkdir -p "$work" "$art"
exec nice -n 19 "$bin" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
	-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$art" \
	-print_final_stats=1 "$work" "$dir/corpus/$h"
