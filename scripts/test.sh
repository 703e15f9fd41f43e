#!/usr/bin/env bash
# Runs poolgate's whole test suite on a fresh machine: installs what is missing (Redis, Postgres,
# the Rust lint components), checks formatting and lints, then runs every test. Tests start their
# own private Redis / Postgres processes on free loopback ports and stop them afterwards.
#
# Usage: bash scripts/test.sh            (what CI's .ci/run calls)
#        SKIP_LINT=1 bash scripts/test.sh  (tests only)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; return 1; fi
}

apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then
    as_root apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

log "system packages"
if ! command -v openssl >/dev/null; then
  apt_install openssl
fi
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  apt_install redis-server redis-tools
fi
# The status page's browser test drives Debian's Chromium through its ChromeDriver; the alert
# rules' unit tests run under promtool (Debian's prometheus package).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  apt_install chromium chromium-driver
fi
if ! command -v promtool >/dev/null; then
  apt_install prometheus
fi
pg_bin=""
for dir in /usr/lib/postgresql/*/bin; do
  [ -x "$dir/initdb" ] && pg_bin="$dir"
done
if [ -z "$pg_bin" ]; then
  apt_install postgresql-15
  pg_bin=$(dirname "$(dpkg -L postgresql-15 | grep -E 'bin/initdb$' | head -n1)")
fi
export POOLGATE_PG_BIN="$pg_bin"
# Debian's postgresql package may start a cluster through its own scripts on install; the tests
# never use it, they run private servers.
redis-server --version | head -n1
"$pg_bin/postgres" --version

log "python tools in .venv: the official anthropic, openai and cohere SDKs, helm-python-sdk, kubernetes-validate, selenium"
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import anthropic, openai, cohere, helm_python, kubernetes_validate, selenium" 2>/dev/null; then
  command -v python3 >/dev/null || apt_install python3 python3-venv
  python3 -m venv .venv 2>/dev/null || { apt_install python3-venv && python3 -m venv --clear .venv; }
  .venv/bin/pip install -q --disable-pip-version-check anthropic openai cohere helm-python-sdk kubernetes-validate selenium
fi
export POOLGATE_SDK_PYTHON="$PWD/.venv/bin/python"
"$POOLGATE_SDK_PYTHON" -c "import anthropic, openai, cohere; print('anthropic', anthropic.__version__, '/ openai', openai.__version__, '/ cohere', cohere.__version__)"

log "the previous release's services (the rolling-upgrade test): built once into a cache outside the clone"
POOLGATE_PREVIOUS_BIN="$(bash scripts/previous_release.sh)"
export POOLGATE_PREVIOUS_BIN
"$POOLGATE_PREVIOUS_BIN/relay-svc" --version

log "the official CLIs under test (Claude Code, Codex): npm ci into a cache outside the clone, once per lockfile"
command -v npm >/dev/null || apt_install nodejs npm
POOLGATE_CLIENTS_BIN="$(bash scripts/clients.sh)"
export POOLGATE_CLIENTS_BIN

if [ "${SKIP_LINT:-0}" != 1 ]; then
  log "format and lints"
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
  cargo fmt --all -- --check
  cargo clippy --workspace --all-targets --locked -- -D warnings
fi

log "helm chart: render, lint and validate offline"
.venv/bin/python scripts/validate_helm.py | tail -n 3

log "bench smoke (a short run: the bench still builds and runs; figures are not checked)"
cargo run --locked -q -p poolgate-bench --bin admission-bench -- --seconds 0.3 --rate 300 --concurrency 4
# The relay bench builds its distributed stack with `relay_svc::stack`, as the tests do.
cargo run --locked -q -p poolgate-bench --bin relay-bench -- --seconds 0.3 --rate 100 --concurrency 2

log "tests"
if cargo nextest --version >/dev/null 2>&1; then
  # No crate has doctests; nextest's summary is the last thing printed.
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi
