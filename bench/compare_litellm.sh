#!/usr/bin/env bash
# poolgate against LiteLLM, in one run on this machine, all four in front of the same Rust fake
# upstream (`mock-upstream`, no model latency) with the same two upstream accounts:
#
#   direct       the fake upstream itself (the ceiling)
#   standalone   relay-svc --standalone (memory backends)
#   distributed  relay-svc + selector-svc + admission-svc as processes, over Redis and Postgres
#   litellm      the LiteLLM proxy (PyPI `litellm[proxy]`, two workers)
#
# 1. Closed loop at a fixed concurrency, non-streaming and streaming: throughput, p50/p99, the
#    latency each proxy adds to the direct call, and the poolgate/LiteLLM ratios.
# 2. Open loop at rising offered loads: p50/p99 against offered load for all four, written to
#    a CSV and plotted to a PNG (matplotlib in the LiteLLM venv). A target stops rising once it
#    serves less than 80 % of what is offered (saturated).
# 3. Redis round trips per governed request at 1 000 requests/s in distributed mode, from the
#    services' `*_redis_round_trips_total` counters.
# 4. Peak RSS of every process (LiteLLM: all its processes).
#
# Usage: bash bench/compare_litellm.sh [seconds per run] [concurrency]
# Env: LITELLM_VENV (default .venv-litellm), OUT_DIR (default docs), LOADS (offered req/s list),
# BIN (prebuilt binaries instead of building; see bench/lib.sh, which starts the stack).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${1:-10}
CONCURRENCY=${2:-16}
VENV=${LITELLM_VENV:-.venv-litellm}
OUT_DIR=${OUT_DIR:-docs}
LOADS=${LOADS:-"50 100 200 500 1000 2000 4000"}
SWEEP_SECONDS=${SWEEP_SECONDS:-4}

if [ ! -x "$VENV/bin/litellm" ] || ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q 'litellm[proxy]' matplotlib
fi
source bench/lib.sh
bench_requirements
bench_build

start_upstream
start_standalone
start_distributed

# LiteLLM, two workers, the same two accounts.
cat > "$work/litellm.yaml" <<YAML
model_list:
  - model_name: gpt-x
    litellm_params: {model: openai/gpt-x, api_base: "http://127.0.0.1:9190/v1", api_key: sk-up-1}
  - model_name: gpt-x
    litellm_params: {model: openai/gpt-x, api_base: "http://127.0.0.1:9190/v1", api_key: sk-up-2}
YAML
LITELLM_MASTER_KEY=sk-litellm LITELLM_LOCAL_MODEL_COST_MAP=True "$VENV/bin/litellm" --config "$work/litellm.yaml" \
  --host 127.0.0.1 --port 4190 --num_workers 2 >"$work/litellm.log" 2>&1 & litellm_pid=$!; pids+=($litellm_pid)
for _ in $(seq 1 180); do
  curl -sf -o /dev/null http://127.0.0.1:4190/health/liveliness && break
  sleep 1
done
wait_port 8190; wait_port 8191

URL[litellm]=http://127.0.0.1:4190/v1/chat/completions; KEY[litellm]=sk-litellm
TARGETS="direct standalone distributed litellm"
# Every target answers before measuring.
wait_answering $TARGETS

tree_rss_mb() { # peak RSS of a process and its descendants
  local all=("$1") queue=("$1")
  while [ ${#queue[@]} -gt 0 ]; do
    local kids; kids=$(pgrep -P "${queue[0]}" || true); queue=("${queue[@]:1}")
    for kid in $kids; do all+=("$kid"); queue+=("$kid"); done
  done
  for pid in "${all[@]}"; do awk '/VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null; done | awk '{s += $1} END {printf "%.1f", s / 1024}'
}

echo "== 1. closed loop: concurrency $CONCURRENCY, $SECONDS_PER_RUN s per run"
csv_closed="$work/closed.csv"
for mode in "" ',"stream":true'; do
  kind=$([ -z "$mode" ] && echo non-streaming || echo streaming)
  for target in $TARGETS; do
    line=$(load "$target" "$mode" --concurrency "$CONCURRENCY" --seconds "$SECONDS_PER_RUN" --csv)
    echo "$kind,$line" >> "$csv_closed"
  done
done
awk -F, '
  { kind=$1; t=$2; rate[kind,t]=$4; p50[kind,t]=$5; p99[kind,t]=$6; err[kind,t]=$8; kinds[kind]=1; order[++n]=kind SUBSEP t }
  END {
    printf "%-14s %-12s %11s %9s %9s %13s %13s %7s\n", "mode", "target", "req/s", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "errors"
    for (i = 1; i <= n; i++) { split(order[i], k, SUBSEP)
      printf "%-14s %-12s %11.1f %9.3f %9.3f %13.3f %13.3f %7d\n", k[1], k[2], rate[k[1],k[2]], p50[k[1],k[2]], p99[k[1],k[2]],
        p50[k[1],k[2]] - p50[k[1],"direct"], p99[k[1],k[2]] - p99[k[1],"direct"], err[k[1],k[2]] }
    for (kind in kinds) {
      printf "%s: throughput standalone/litellm %.1fx, distributed/litellm %.1fx; standalone %.0f%% and distributed %.0f%% of direct\n",
        kind, rate[kind,"standalone"] / rate[kind,"litellm"], rate[kind,"distributed"] / rate[kind,"litellm"],
        100 * rate[kind,"standalone"] / rate[kind,"direct"], 100 * rate[kind,"distributed"] / rate[kind,"direct"]
      printf "%s: p50 standalone/litellm %.3f, distributed/litellm %.3f\n", kind,
        p50[kind,"standalone"] / p50[kind,"litellm"], p50[kind,"distributed"] / p50[kind,"litellm"]
    }
  }' "$csv_closed"

echo "== 2. open loop: latency against offered load ($SWEEP_SECONDS s per point)"
mkdir -p "$OUT_DIR"
csv_sweep="$OUT_DIR/bench-latency.csv"
echo "mode,target,offered,achieved,p50_ms,p99_ms,ok,errors,p999_ms" > "$csv_sweep"
for mode in "" ',"stream":true'; do
  kind=$([ -z "$mode" ] && echo non-streaming || echo streaming)
  for target in $TARGETS; do
    for rate in $LOADS; do
      line=$(load "$target" "$mode" --rate "$rate" --seconds "$SWEEP_SECONDS" --csv)
      echo "$kind,$line" | tee -a "$csv_sweep"
      achieved=$(echo "$line" | cut -d, -f3)
      awk -v a="$achieved" -v r="$rate" 'BEGIN {exit !(a < 0.8 * r)}' && break
    done
  done
done
"$VENV/bin/python" bench/plot_latency.py "$csv_sweep" "$OUT_DIR/bench-latency.png"

echo "== 3. Redis round trips per governed request at 1000 req/s (distributed)"
trips() { curl -sf "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m {print $2}'; }
a0=$(trips 9561 admission_redis_round_trips_total); s0=$(trips 9562 selector_redis_round_trips_total)
line=$(load distributed "" --rate 1000 --seconds "$SECONDS_PER_RUN" --csv)
a1=$(trips 9561 admission_redis_round_trips_total); s1=$(trips 9562 selector_redis_round_trips_total)
ok=$(echo "$line" | cut -d, -f6)
awk -v a="$((a1 - a0))" -v s="$((s1 - s0))" -v n="$ok" -v line="$line" 'BEGIN {
  printf "%s\n%d requests: admission %.2f + selector %.2f = %.2f round trips per request (goal <= 3)\n", line, n, a / n, s / n, (a + s) / n }'

echo "== 4. peak RSS (MiB)"
echo "poolgate standalone relay $(tree_rss_mb $standalone_pid)"
echo "poolgate distributed: relay $(tree_rss_mb $distributed_pid), selector $(tree_rss_mb $selector_pid), admission $(tree_rss_mb $admission_pid) (Redis and Postgres not counted)"
echo "litellm (all $(($(pgrep -P $litellm_pid | wc -l) + 1)) processes) $(tree_rss_mb $litellm_pid)"
