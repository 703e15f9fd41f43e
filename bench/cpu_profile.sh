#!/usr/bin/env bash
# CPU per governed request (issue 27), measured one way: utime + stime (+ the reaped children's
# cutime + cstime) from /proc/<pid>/stat of every process, before and after a fixed number of
# requests at a fixed offered rate, divided by the requests served. Three targets in front of the
# same Rust fake upstream (`mock-upstream`) with the same two accounts, non-streaming, load from
# `http-load`:
#
#   direct       the fake upstream itself
#   standalone   relay-svc --standalone (memory backends)
#   distributed  relay-svc + selector-svc + admission-svc as processes over Redis and Postgres
#                (every request governed: one lease each)
#
# 1. CPU µs per request at RATE req/s for COUNT requests: per process (relay, selector,
#    admission, redis-server, postgres — all the cluster's processes: the postmaster, whose
#    cutime/cstime holds the backends that exited, and its live children), the governed total,
#    the load generator (its rusage, from the shell's `times`) and the upstream separately, and
#    the whole machine (all of them). "other processes" is the rest of /proc/stat's busy time in
#    the same interval: anything else running on the machine (a compile), i.e. the noise.
# 2. Closed loop, CONCURRENCY clients, CLOSED_SECONDS each: throughput side by side and the
#    standalone/direct and distributed/direct ratios.
# 3. Open loop at STEPS req/s, STEP_RUNS runs of STEP_SECONDS each: p50/p99/p99.9 from each
#    request's scheduled start and the fraction of the offered requests served, as the median of
#    the runs with their range; the p99 each proxy adds over direct.
# 4. PERF=1: the distributed fixed-rate phase once more under `perf record -F 999 -g` of each
#    service process (perf's default cpu-clock event), then each process's top symbols and its
#    samples aggregated by crate (the symbol's first path segment; C code by its library), in
#    per-cent and in CPU µs per request (the process's µs/request from this phase × the share).
#    Perf perturbs this phase: table 1 is measured without it.
#
# Usage: bash bench/cpu_profile.sh
# Env: BIN (prebuilt binaries, e.g. another commit's; default: build the tree with bench/lib.sh's
# one command), RATE (1000), COUNT (20000), CONCURRENCY (16), CLOSED_SECONDS (10),
# STEPS ("500 1000 1500 2000"), STEP_SECONDS (5), STEP_RUNS (3), PERF (0), PERF_OUT (keep the
# perf.data files there), TOP (symbols shown per process, 12), SERVICE_WORKERS (tokio worker
# threads of the services; default one per core). RELAY_EDGE_SELECTION=false runs the
# distributed relay as 0.1 did (a `Select` per request): the before of selection at the edge,
# side by side with the same binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-1000}
COUNT=${COUNT:-20000}
CONCURRENCY=${CONCURRENCY:-16}
CLOSED_SECONDS=${CLOSED_SECONDS:-10}
STEPS=${STEPS:-"500 1000 1500 2000"}
STEP_SECONDS=${STEP_SECONDS:-5}
STEP_RUNS=${STEP_RUNS:-3}
PERF=${PERF:-0}
TOP=${TOP:-12}
TARGETS="direct standalone distributed"

source bench/lib.sh
bench_requirements
bench_build
if [ "$PERF" = 1 ]; then command -v perf >/dev/null || { echo "PERF=1: perf is missing (apt-get install -y linux-perf)" >&2; exit 1; }; fi
TICK_US=$((1000000 / $(getconf CLK_TCK)))

start_upstream
start_standalone
start_distributed
wait_port 8190; wait_port 8191
wait_answering $TARGETS

echo "cpu_profile: binaries $BIN (relay-svc built $(date -r "$BIN/relay-svc" +%FT%T))$([ "$BIN" = target/release ] && echo ", tree $(git describe --always --dirty 2>/dev/null)")"
echo "machine: $(nproc) cores; load before the run:$(uptime | sed 's/.*load average://')"

# The processes of each role, by name, for the CPU table.
ROLES="relay selector admission redis postgres upstream"
role_pids() { # target role
  case "$2" in
    relay) [ "$1" = standalone ] && echo "$standalone_pid"; [ "$1" = distributed ] && echo "$distributed_pid" ;;
    selector) [ "$1" = distributed ] && echo "$selector_pid" ;;
    admission) [ "$1" = distributed ] && echo "$admission_pid" ;;
    redis) [ "$1" = distributed ] && echo "$redis_pid" ;;
    postgres) [ "$1" = distributed ] && echo "$postgres_pid" $(pgrep -P "$postgres_pid" || true) ;;
    upstream) echo "$upstream_pid" ;;
  esac
  return 0
}
# utime + stime + cutime + cstime in clock ticks, summed over the pids given (fields 14–17 of
# /proc/<pid>/stat, counted after the command name, which may hold spaces).
ticks() {
  local pid
  for pid in "$@"; do cat "/proc/$pid/stat" 2>/dev/null || true; done |
    awk '{ sub(/^.*\) /, ""); s += $12 + $13 + $14 + $15 } END { print s + 0 }'
}
# Every process this script started, postgres' children included.
all_pids() { echo "${pids[@]}" "$postgres_pid" $(pgrep -P "$postgres_pid" || true); }
machine_busy() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }

# Runs http-load once at the fixed rate for the fixed count against a target and writes
# "role µs" lines to $work/cpu.<target>, plus its CSV line to $work/line.<target>.
fixed_rate_cpu() {
  local target=$1 role before_ours before_busy
  load "$target" "" --rate "$RATE" --count "$((RATE > COUNT ? COUNT : RATE))" --csv >/dev/null  # warm-up, 1 s
  declare -A before
  for role in $ROLES; do before[$role]=$(ticks $(role_pids "$target" "$role")); done
  before_ours=$(ticks $(all_pids)); before_busy=$(machine_busy)
  ( load "$target" "" --rate "$RATE" --count "$COUNT" --csv > "$work/line.$target"; times > "$work/times.$target" )
  {
    for role in $ROLES; do
      echo "$role $(( ($(ticks $(role_pids "$target" "$role")) - ${before[$role]}) * TICK_US ))"
    done
    # The shell's `times`: second line, the children's user and system time (http-load's rusage).
    awk 'NR == 2 { n = split($0, t, " "); s = 0; for (i = 1; i <= n; i++) { split(t[i], ms, /[ms]/); s += ms[1] * 60 + ms[2] } printf "loadgen %.0f\n", s * 1e6 }' "$work/times.$target"
    echo "ours $(( ($(ticks $(all_pids)) - before_ours) * TICK_US ))"
    echo "busy $(( ($(machine_busy) - before_busy) * TICK_US ))"
  } > "$work/cpu.$target"
}

echo
echo "== 1. CPU per request: $COUNT requests at $RATE req/s, non-streaming (µs of CPU per request served)"
for target in $TARGETS; do fixed_rate_cpu "$target"; done
for target in $TARGETS; do awk -v t="$target" '{ print t, $0 }' "$work/cpu.$target"; done |
  awk -v lines="$(for t in $TARGETS; do echo -n "$(cat "$work/line.$t");"; done)" -v targets="$TARGETS" '
  { cpu[$1, $2] = $3 }
  END {
    # http-load CSV: label(target),offered,achieved,p50_ms,p99_ms,ok,errors,p999_ms
    nl = split(lines, ls, ";")
    for (i = 1; i <= nl; i++) { if (ls[i] == "") continue; split(ls[i], f, ","); t = f[1]
      rate[t] = f[3]; p50[t] = f[4]; p99[t] = f[5]; ok[t] = f[6]; err[t] = f[7]; p999[t] = f[8] }
    nt = split(targets, ts, " ")
    printf "%-30s", "process"; for (i = 1; i <= nt; i++) printf " %12s", ts[i]; printf "\n"
    split("relay selector admission redis postgres", gov, " ")
    for (g = 1; g <= 5; g++) { printf "%-30s", gov[g]
      for (i = 1; i <= nt; i++) { t = ts[i]; v = cpu[t, gov[g]]
        if (t == "direct" || (t == "standalone" && gov[g] != "relay")) printf " %12s", "-"
        else printf " %12.1f", v / ok[t] } printf "\n" }
    printf "%-30s", "governed total"
    for (i = 1; i <= nt; i++) { t = ts[i]; s = 0; for (g = 1; g <= 5; g++) s += cpu[t, gov[g]]; governed[t] = s; printf " %12.1f", s / ok[t] } printf "\n"
    printf "%-30s", "load generator (http-load)"; for (i = 1; i <= nt; i++) { t = ts[i]; printf " %12.1f", cpu[t, "loadgen"] / ok[t] } printf "\n"
    printf "%-30s", "upstream (mock-upstream)"; for (i = 1; i <= nt; i++) { t = ts[i]; printf " %12.1f", cpu[t, "upstream"] / ok[t] } printf "\n"
    printf "%-30s", "whole machine"
    for (i = 1; i <= nt; i++) { t = ts[i]; whole[t] = governed[t] + cpu[t, "loadgen"] + cpu[t, "upstream"]; printf " %12.1f", whole[t] / ok[t] } printf "\n"
    printf "%-30s", "other processes (noise)"
    for (i = 1; i <= nt; i++) { t = ts[i]; o = cpu[t, "busy"] - cpu[t, "ours"] - cpu[t, "loadgen"]; printf " %12.1f", (o > 0 ? o : 0) / ok[t] } printf "\n"
    printf "%-30s", "served / errors"; for (i = 1; i <= nt; i++) { t = ts[i]; printf " %12s", ok[t] "/" err[t] } printf "\n"
    printf "%-30s", "achieved req/s"; for (i = 1; i <= nt; i++) { t = ts[i]; printf " %12.1f", rate[t] } printf "\n"
    printf "%-30s", "p50 ms"; for (i = 1; i <= nt; i++) { t = ts[i]; printf " %12.3f", p50[t] } printf "\n"
    printf "%-30s", "p99 ms"; for (i = 1; i <= nt; i++) { t = ts[i]; printf " %12.3f", p99[t] } printf "\n"
    printf "%-30s", "p99.9 ms"; for (i = 1; i <= nt; i++) { t = ts[i]; printf " %12.3f", p999[t] } printf "\n"
    printf "whole machine per request: standalone/direct %.2f, distributed/direct %.2f; distributed governed share %.0f %%\n",
      whole["standalone"] / ok["standalone"] / (whole["direct"] / ok["direct"]),
      whole["distributed"] / ok["distributed"] / (whole["direct"] / ok["direct"]),
      100 * governed["distributed"] / whole["distributed"]
  }'

echo
echo "== 2. closed loop: $CONCURRENCY clients, $CLOSED_SECONDS s per target, non-streaming"
for target in $TARGETS; do load "$target" "" --concurrency "$CONCURRENCY" --seconds "$CLOSED_SECONDS" --csv; done |
  awk -F, '
  { rate[$1] = $3; p50[$1] = $4; p99[$1] = $5; err[$1] = $7; order[++n] = $1 }
  END {
    printf "%-12s %11s %9s %9s %7s %10s\n", "target", "req/s", "p50 ms", "p99 ms", "errors", "of direct"
    for (i = 1; i <= n; i++) { t = order[i]
      printf "%-12s %11.1f %9.3f %9.3f %7d %9.0f%%\n", t, rate[t], p50[t], p99[t], err[t], 100 * rate[t] / rate["direct"] }
    printf "distributed/direct %.3f, standalone/direct %.3f, distributed/standalone %.3f\n",
      rate["distributed"] / rate["direct"], rate["standalone"] / rate["direct"], rate["distributed"] / rate["standalone"]
  }'

echo
echo "== 3. open loop: $STEP_RUNS runs of $STEP_SECONDS s per step, median [min-max] from each request's scheduled start"
: > "$work/steps.csv"
for run in $(seq 1 "$STEP_RUNS"); do
  for rate in $STEPS; do
    for target in $TARGETS; do
      echo "$run,$(load "$target" "" --rate "$rate" --seconds "$STEP_SECONDS" --csv)" >> "$work/steps.csv"
    done
  done
done
awk -F, -v runs="$STEP_RUNS" -v steps="$STEPS" -v targets="$TARGETS" '
  function sort(a, n,   i, j, x) { for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x } }
  function median(key,   a, i, n) { n = 0; for (i = 1; i <= runs; i++) if ((key, i) in v) a[++n] = v[key, i]; sort(a, n)
    if (n == 0) return "-"; lo[key] = a[1]; hi[key] = a[n]; return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  function cell(key, fmt,   m) { m = median(key); return m == "-" ? "-" : sprintf(fmt " [" fmt "-" fmt "]", m, lo[key], hi[key]) }
  { t = $2; r = $3; i = $1
    v[t, r, "p50", i] = $5; v[t, r, "p99", i] = $6; v[t, r, "p999", i] = $9
    v[t, r, "served", i] = 100 * $7 / ($7 + $8) }
  END {
    nt = split(targets, ts, " "); ns = split(steps, ss, " ")
    printf "%-12s %7s  %-24s %-24s %-26s %-20s %s\n", "target", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "served %", "added p99 ms (median)"
    for (a = 1; a <= nt; a++) for (b = 1; b <= ns; b++) { t = ts[a]; r = ss[b]
      added = "-"
      if (t != "direct") { m = median(t SUBSEP r SUBSEP "p99"); d = median("direct" SUBSEP r SUBSEP "p99")
        if (m != "-" && d != "-") added = sprintf("%+.3f", m - d) }
      printf "%-12s %7s  %-24s %-24s %-26s %-20s %s\n", t, r, cell(t SUBSEP r SUBSEP "p50", "%.3f"), cell(t SUBSEP r SUBSEP "p99", "%.3f"),
        cell(t SUBSEP r SUBSEP "p999", "%.3f"), cell(t SUBSEP r SUBSEP "served", "%.1f"), added }
  }' "$work/steps.csv"

echo
echo "== edge: the distributed relay's plans by path (docs/DESIGN.md §2; binding_asked / all is the binding miss rate)"
curl -s http://127.0.0.1:9591/metrics | grep -E '^relay_edge_plans_total|^relay_edge_writes_dropped_total' ||
  echo "(none: the relay asks the selector for every plan, RELAY_EDGE_SELECTION=false or an older release)"

[ "$PERF" = 1 ] || exit 0
echo
echo "== 4. profile: distributed, $COUNT requests at $RATE req/s under perf record -F 999 -g"
PERF_OUT=${PERF_OUT:-$work/perf}
mkdir -p "$PERF_OUT"
PERF_ROLES="relay selector admission redis postgres"
declare -A perf_pid before_ticks
for role in $PERF_ROLES; do
  list=$(role_pids distributed "$role" | tr ' ' '\n' | grep . | paste -sd, -)
  perf record -F 999 -g -q -o "$PERF_OUT/$role.data" -p "$list" >/dev/null 2>&1 & perf_pid[$role]=$!
done
sleep 1
for role in $PERF_ROLES; do before_ticks[$role]=$(ticks $(role_pids distributed "$role")); done
load distributed "" --rate "$RATE" --count "$COUNT" --csv > "$work/line.perf"
for role in $PERF_ROLES; do
  echo "$role $(( ($(ticks $(role_pids distributed "$role")) - ${before_ticks[$role]}) * TICK_US ))"
done > "$work/cpu.perf"
for role in $PERF_ROLES; do kill -INT "${perf_pid[$role]}"; done
for role in $PERF_ROLES; do wait "${perf_pid[$role]}" 2>/dev/null || true; done
served=$(cut -d, -f6 "$work/line.perf")
echo "$(cat "$work/line.perf") (served under perf; its CPU per request is higher than table 1's)"
# perf report lines: "  12.34%  relay-svc  [.] tokio::runtime::task::..."; the crate is the symbol's
# first path segment (after a leading `<`, `&`, `mut `, `dyn `; drop glue counts for the type
# dropped), else the library (libc, kernel); the allocators (glibc's malloc, mimalloc) apart.
crate_of='
  function crate(dso, sym,   s) {
    if (kernel) return "kernel"
    if (dso == "redis-check-rdb") dso = "redis-server"   # Debian links redis-server to it
    if (sym ~ /^_?mi_/) return "mimalloc"                 # linked into the binary: no `::` path
    if (dso ~ /^libc/ && sym ~ /malloc|free|unlink_chunk|realloc|calloc|memalign|tcache/) return "libc malloc"
    s = sym; gsub(/^(<|&|mut |dyn |\*const |\*mut |core::ptr::drop_in_place<)+/, "", s)
    if (s ~ /^[A-Za-z_][A-Za-z0-9_]*::/) { sub(/::.*/, "", s); return s }
    if (sym == "[unknown]" || sym ~ /^0x/) return dso " (no symbol)"
    return dso
  }'
# One "pct<TAB>crate<TAB>symbol" line per symbol of a perf report.
symbols() {
  perf report -i "$1" --stdio --no-children --sort dso,sym -g none --percent-limit 0 -q 2>/dev/null |
    awk "$crate_of"'
    /%/ { pct = $1; sub(/%/, "", pct); dso = $2; kernel = ($3 == "[k]")
      match($0, / \[.\] /); sym = substr($0, RSTART + RLENGTH); sub(/ +$/, "", sym)
      printf "%s\t%s\t%s\n", pct, crate(dso, sym), sym }'
}
for role in $PERF_ROLES; do
  per_request=$(awk -v r="$role" -v n="$served" '$1 == r { printf "%.1f", $2 / n }' "$work/cpu.perf")
  symbols "$PERF_OUT/$role.data" > "$work/$role.symbols"
  echo
  echo "-- $role: $per_request µs CPU per request in this phase; by crate (share of its samples, µs per request):"
  awk -F'\t' '{ by[$2] += $1 } END { for (c in by) printf "%.2f\t%s\n", by[c], c }' "$work/$role.symbols" | sort -rn |
    awk -F'\t' -v us="$per_request" -v top="$TOP" '
      NR <= top { printf "%7.2f%% %8.1f µs  %s\n", $1, $1 / 100 * us, $2; next }
      { rest += $1; n++ }
      END { if (n) printf "%7.2f%% %8.1f µs  (%d more crates)\n", rest, rest / 100 * us, n }'
  echo "top symbols:"
  head -n "$TOP" "$work/$role.symbols" | awk -F'\t' '{ printf "%7.2f%%  %-18s %s\n", $1, $2, substr($3, 1, 100) }'
done
echo
echo "-- all five together: µs CPU per distributed request by crate (summed over the processes):"
for role in $PERF_ROLES; do
  per_request=$(awk -v r="$role" -v n="$served" '$1 == r { print $2 / n }' "$work/cpu.perf")
  awk -F'\t' -v us="$per_request" '{ printf "%s\t%.3f\n", $2, $1 / 100 * us }' "$work/$role.symbols"
done | awk -F'\t' '{ by[$1] += $2 } END { for (c in by) printf "%.3f\t%s\n", by[c], c }' | sort -rn |
  awk -F'\t' -v top="$TOP" '
    { total += $1 } NR <= top { printf "%8.1f µs  %s\n", $1, $2; next } { rest += $1; n++ }
    END { if (n) printf "%8.1f µs  (%d more)\n", rest, n; printf "%8.1f µs  total\n", total }'
