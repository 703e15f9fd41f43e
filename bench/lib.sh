# Shared by bench/compare_litellm.sh and bench/cpu_profile.sh (source it from the repository
# root, after `set -euo pipefail`): one build command, so both scripts share the release
# artifacts with `cargo build --release --workspace` instead of rebuilding with another feature
# set; the fake upstream, the standalone relay and the distributed stack (relay-svc,
# selector-svc and admission-svc as processes over a private Redis and Postgres); `load`, which
# runs `http-load` against one of them.
#
# Env: BIN — a directory of prebuilt binaries (relay-svc, selector-svc, admission-svc,
# mock-upstream, http-load) to run instead of building the tree (e.g. another commit's build).

BENCH_BUILD=(cargo build --release --workspace --bins --locked)

# Builds the workspace's binaries (nothing to do when they are fresh) unless BIN names prebuilt
# ones; checks that every binary the stack needs is there.
bench_build() {
  if [ -z "${BIN:-}" ]; then
    local started=$SECONDS
    "${BENCH_BUILD[@]}" -q
    echo "build: ${BENCH_BUILD[*]} ($((SECONDS - started)) s)"
    BIN=target/release
  fi
  local name
  for name in relay-svc selector-svc admission-svc mock-upstream http-load; do
    [ -x "$BIN/$name" ] || { echo "$BIN/$name is missing" >&2; return 1; }
  done
}

bench_requirements() {
  command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install -y redis-server" >&2; return 1; }
  PGBIN=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -1)")
  [ -x "$PGBIN/initdb" ] || { echo "Postgres is missing: apt-get install -y postgresql-15" >&2; return 1; }
}

# The scratch directory and every process started, torn down on exit.
work=$(mktemp -d)
chmod 755 "$work"
pids=()
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
bench_cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -f "$work/pg/postmaster.pid" ] && as_pg "$PGBIN/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap bench_cleanup EXIT
# SERVICE_WORKERS=N runs the poolgate services (not the load generator or the upstream) with N
# tokio worker threads (TOKIO_WORKER_THREADS); unset: tokio's default, one per core.
# (`env` execs the service, so `$!` stays the service's pid.)
svc_env=(env ${SERVICE_WORKERS:+TOKIO_WORKER_THREADS=$SERVICE_WORKERS})
wait_port() { for _ in $(seq 1 150); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.2; done; echo "port $1 never opened" >&2; return 1; }

# The fake upstream (no model latency): upstream_pid.
start_upstream() {
  "$BIN/mock-upstream" --listen 127.0.0.1:9190 >/dev/null 2>&1 & upstream_pid=$!; pids+=($upstream_pid)
}

# relay-svc --standalone (memory backends) with two accounts on the fake upstream: standalone_pid.
start_standalone() {
  cat > "$work/relay.yaml" <<YAML
api_keys:
  - {key: sk-bench, group: default, user: bench}
accounts:
  - {name: o1, platform: openai, base_url: "http://127.0.0.1:9190", api_key: sk-up-1, concurrency: 10000}
  - {name: o2, platform: openai, base_url: "http://127.0.0.1:9190", api_key: sk-up-2, concurrency: 10000}
YAML
  "${svc_env[@]}" "$BIN/relay-svc" --standalone --config "$work/relay.yaml" --listen 127.0.0.1:8190 \
    --metrics-listen 127.0.0.1:9590 >/dev/null 2>&1 & standalone_pid=$!; pids+=($standalone_pid)
}

# Redis, Postgres, selector, admission and a relay, the same two accounts governed (limits > 0,
# so every request takes a lease): redis_pid, postgres_pid (the postmaster), selector_pid,
# admission_pid, distributed_pid, dist_key (the client key).
start_distributed() {
  redis-server --port 6390 --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 & redis_pid=$!; pids+=($redis_pid)
  mkdir -p "$work/pg"
  [ "$(id -u)" = 0 ] && chown postgres "$work/pg"
  as_pg "$PGBIN/initdb" -D "$work/pg" -A trust -U postgres >/dev/null
  as_pg "$PGBIN/pg_ctl" -D "$work/pg" -l "$work/pg/log" -w \
    -o "-p 5490 -k $work/pg -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
  postgres_pid=$(head -1 "$work/pg/postmaster.pid")
  export POOLGATE_DATABASE_URL=postgres://postgres@127.0.0.1:5490/postgres
  export POOLGATE_REDIS_URL=redis://127.0.0.1:6390
  POOLGATE_CREDENTIAL_KEYS="k1:$("$BIN/selector-svc" genkey)"; export POOLGATE_CREDENTIAL_KEYS
  export SELECTOR_ADMIN_TOKEN=bench-admin SELECTOR_ENDPOINT=http://127.0.0.1:50162
  export POOLGATE_SERVICE_TOKEN=bench-service-token   # selector and admission require it; relay and CLI send it
  "$BIN/selector-svc" migrate >/dev/null
  "${svc_env[@]}" "$BIN/selector-svc" --listen 127.0.0.1:50162 --metrics-listen 127.0.0.1:9562 >/dev/null 2>&1 & selector_pid=$!; pids+=($selector_pid)
  "${svc_env[@]}" "$BIN/admission-svc" --listen 127.0.0.1:50161 --metrics-listen 127.0.0.1:9561 >/dev/null 2>&1 & admission_pid=$!; pids+=($admission_pid)
  wait_port 50162
  local n
  for n in 1 2; do
    ACCOUNT_CREDENTIAL=sk-up-$n "$BIN/selector-svc" admin upsert-account --name "o$n" --group default \
      --platform openai --base-url http://127.0.0.1:9190 --concurrency 10000 >/dev/null
  done
  dist_key=$("$BIN/selector-svc" admin create-key --user bench --group default | sed -n 's/^api_key=//p')
  KEY[distributed]=$dist_key
  "${svc_env[@]}" "$BIN/relay-svc" --listen 127.0.0.1:8191 --metrics-listen 127.0.0.1:9591 --selector-url http://127.0.0.1:50162 \
    --admission-url http://127.0.0.1:50161 >/dev/null 2>&1 & distributed_pid=$!; pids+=($distributed_pid)
}

# The targets `load` knows; a script adds its own (LiteLLM) to URL and KEY.
declare -A URL KEY
URL[direct]=http://127.0.0.1:9190/v1/chat/completions; KEY[direct]=sk-up-1
URL[standalone]=http://127.0.0.1:8190/v1/chat/completions; KEY[standalone]=sk-bench
URL[distributed]=http://127.0.0.1:8191/v1/chat/completions
body() { echo "{\"model\":\"gpt-x\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]$1}"; }
load() { # target stream-suffix extra-args...
  local target=$1 suffix=$2; shift 2
  "$BIN/http-load" --label "$target" --url "${URL[$target]}" --header "authorization: Bearer ${KEY[$target]}" \
    --body "$(body "$suffix")" "$@"
}
# Waits until every target named answers (a request without error).
wait_answering() {
  local target
  for target in "$@"; do
    for _ in $(seq 1 50); do
      load "$target" "" --rate 5 --seconds 0.2 --csv | awk -F, '$7 == 0 {ok=1} END {exit !ok}' && break
      sleep 0.5
    done
  done
}
