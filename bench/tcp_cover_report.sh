#!/bin/sh
# Redoes the README's TCP coverage report (docs/kernel.md, "A real report: TCP in the 6.1
# guest"): boots the 6.1 guest (vmtest, QEMU TCG) to run `trapctl cover 'tcp_*' --mode count
# --json` over loopback TCP (tcpmss: 20 connections, then a 3-second checked stream), brings the
# JSON back over the console (gzip, base64), then on the host makes the lines from vmlinux's
# debug file (`trapctl cover --from-json`) and the HTML (genhtml). Run it from the repository's
# top directory. Needs a release build
# (`cargo build --release -p trapctl -p vmtest`), lcov, and the guest kernel's debug file
# (Debian: linux-image-6.1.0-56-cloud-amd64-dbg, /usr/lib/debug/boot/vmlinux-6.1.0-56-cloud-amd64).
# Usage: bench/tcp_cover_report.sh [DEBUG_FILE [OUT_DIR]]; the report is OUT_DIR/html/index.html.
set -eu
release=6.1.0-56-cloud-amd64
dbg=${1:-/usr/lib/debug/boot/vmlinux-$release}
out=${2:-/tmp/tcp-cover}
mkdir -p "$out"
cat > "$out/scenario.sh" <<'SCENARIO'
set -eu
trapctl cover 'tcp_*' --mode count --json -o /tmp/tcp.json -- \
	sh -c 'tcpmss -n 20 > /dev/null && tcpmss --traffic 3 > /dev/null'
dmesg -n 1 # no kernel message on the console inside the base64
echo TCP_JSON_BEGIN
gzip -c /tmp/tcp.json | base64
echo TCP_JSON_END
SCENARIO
./target/release/vmtest run --kernel "/boot/vmlinuz-$release" --scenario "$out/scenario.sh" \
	--timeout 1200 --repo "$PWD" > "$out/console.log"
sed -n '/^TCP_JSON_BEGIN/,/^TCP_JSON_END/p' "$out/console.log" | sed '1d;$d' | tr -d '\r' |
	grep -E '^[A-Za-z0-9+/=]+$' | base64 -d | gunzip > "$out/tcp.json"
./target/release/trapctl cover --from-json "$out/tcp.json" --debuginfo "$dbg" \
	--lcov "$out/tcp.info" > "$out/table.txt"
# --no-source: the kernel's sources are not needed for the figures (with them, drop it and
# give genhtml --prefix DIR to strip the build directory).
genhtml --no-source --branch-coverage -o "$out/html" "$out/tcp.info" > "$out/genhtml.log"
tail -n 4 "$out/genhtml.log"
