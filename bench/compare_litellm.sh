#!/usr/bin/env bash
# Side by side, in one run on this machine: the fake upstream directly, poolgate standalone, and
# the LiteLLM proxy (PyPI `litellm[proxy]`, one worker), all in front of the same fake upstream,
# non-streaming and streaming, at the same concurrency. Prints throughput, p50/p99 and peak RSS,
# and the poolgate/LiteLLM ratios.
#
# Usage: bash bench/compare_litellm.sh [seconds] [concurrency]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${1:-10}
CONCURRENCY=${2:-16}
VENV=${LITELLM_VENV:-.venv-litellm}
if [ ! -x "$VENV/bin/litellm" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q 'litellm[proxy]'
fi
cargo build --release -q -p relay-svc --bins -p poolgate-bench --bin http-load
work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

target/release/mock-upstream --listen 127.0.0.1:9190 >/dev/null 2>&1 & pids+=($!)
cat > "$work/relay.yaml" <<YAML
api_keys:
  - {key: sk-bench, group: default, user: bench}
accounts:
  - {name: o1, platform: openai, base_url: "http://127.0.0.1:9190", api_key: sk-up-1, concurrency: 0}
  - {name: o2, platform: openai, base_url: "http://127.0.0.1:9190", api_key: sk-up-2, concurrency: 0}
YAML
target/release/relay-svc --standalone --config "$work/relay.yaml" --listen 127.0.0.1:8190 >/dev/null 2>&1 & relay_pid=$!; pids+=($relay_pid)
cat > "$work/litellm.yaml" <<YAML
model_list:
  - model_name: gpt-x
    litellm_params: {model: openai/gpt-x, api_base: "http://127.0.0.1:9190/v1", api_key: sk-up-1}
  - model_name: gpt-x
    litellm_params: {model: openai/gpt-x, api_base: "http://127.0.0.1:9190/v1", api_key: sk-up-2}
YAML
LITELLM_MASTER_KEY=sk-litellm LITELLM_LOCAL_MODEL_COST_MAP=True "$VENV/bin/litellm" --config "$work/litellm.yaml" \
  --host 127.0.0.1 --port 4190 --num_workers 1 >"$work/litellm.log" 2>&1 & litellm_pid=$!; pids+=($litellm_pid)
for _ in $(seq 1 120); do
  curl -sf -o /dev/null http://127.0.0.1:4190/health/liveliness && break
  sleep 1
done

peak_rss_mb() { awk '/VmHWM/ {printf "%.1f", $2/1024}' "/proc/$1/status" 2>/dev/null || echo "?"; }
body='{"model":"gpt-x","messages":[{"role":"user","content":"hi"}]STREAM}'
run() { # label url auth stream
  local b=${body/STREAM/$4}
  target/release/http-load --label "$1" --url "$2" --header "authorization: Bearer $3" --body "$b" \
    --concurrency "$CONCURRENCY" --seconds "$SECONDS_PER_RUN"
}
echo "concurrency $CONCURRENCY, $SECONDS_PER_RUN s per run, fake upstream without model latency"
for mode in "" ',"stream":true'; do
  kind=$([ -z "$mode" ] && echo non-streaming || echo streaming)
  run "direct to upstream, $kind" http://127.0.0.1:9190/v1/chat/completions sk-up-1 "$mode"
  run "poolgate standalone, $kind" http://127.0.0.1:8190/v1/chat/completions sk-bench "$mode"
  run "litellm proxy (1 worker), $kind" http://127.0.0.1:4190/v1/chat/completions sk-litellm "$mode"
done
echo "peak RSS: poolgate relay $(peak_rss_mb $relay_pid) MiB, litellm $(peak_rss_mb $litellm_pid) MiB (main process)"
