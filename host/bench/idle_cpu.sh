#!/usr/bin/env bash
# What an idle `capstan serve` spends: CPU ticks (utime + stime, 1/100 s each) over 20 s of doing
# nothing, in all and by thread name, after 8 s to start. A fresh SQLite database each time; the
# compiled-component cache is kept per binary under $TMPDIR, so start-up compiles only once.
#   host/bench/idle_cpu.sh target/release/capstan
#   host/bench/idle_cpu.sh target/release/capstan postgres://postgres@127.0.0.1:5432/test?options[search_path]=idle
set -euo pipefail
bin=$1
dir=$(mktemp -d)
db=${2:-sqlite://$dir/capstan.db}
cache="${TMPDIR:-/tmp}/capstan-idle-cache-$(basename "$bin")"
export CAPSTAN_PEPPERS="1:bench-only-pepper-0123456789abcdef"
export CAPSTAN_SECRET_KEYS="1:ZGV2ZWxvcG1lbnQtb25seS1rZXktZG8tbm90LXVzZSE="
"$bin" serve --listen 127.0.0.1:0 --sandbox-listen 127.0.0.1:0 --database "$db" \
    --workflows "$(dirname "$0")/../../target/workflows" --data-dir "$cache" >"$dir/log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
sleep 8
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
threads() {
    for t in /proc/"$pid"/task/*; do echo "$(tr ' ' _ <"$t/comm") $(awk '{print $14 + $15}' "$t/stat")"; done \
        | awk '{s[$1] += $2} END {for (k in s) print k, s[k]}' | sort
}
before=$(threads); t0=$(ticks)
sleep 20
after=$(threads); t1=$(ticks)
echo "ticks in 20 s: $((t1 - t0))"
join <(echo "$before") <(echo "$after") | awk '$3 > $2 {print "  " $1, $3 - $2}'
