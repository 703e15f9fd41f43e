#!/usr/bin/env bash
# Installs the official CLIs the relay is tested with (tests/clients/package-lock.json: Claude
# Code and Codex, with their native binaries) into a cache outside the clone, keyed by the
# lockfile's hash, so CI on the same machine downloads them once. Prints the directory that holds
# `claude` and `codex`.
#
# Usage: bash scripts/clients.sh        (POOLGATE_CLIENTS_CACHE overrides the cache root)
set -euo pipefail
cd "$(dirname "$0")/.."

root="${POOLGATE_CLIENTS_CACHE:-/var/cache/poolgate/clients}"
hash=$(sha256sum tests/clients/package-lock.json | cut -c1-16)
dir="$root/$hash"
bin="$dir/node_modules/.bin"

if [ -x "$bin/claude" ] && [ -x "$bin/codex" ] && [ -f "$dir/.complete" ]; then
  echo "$bin"
  exit 0
fi
command -v npm >/dev/null || { echo "npm is needed to install the CLIs under test" >&2; exit 1; }
mkdir -p "$dir"
cp tests/clients/package.json tests/clients/package-lock.json "$dir/"
rm -f "$dir/.complete"
# Claude Code's postinstall picks its native binary; it must run.
(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error --allow-scripts=true >&2 2>/dev/null \
  || npm ci --no-audit --no-fund --loglevel=error >&2)
"$bin/claude" --version >&2
"$bin/codex" --version >&2
touch "$dir/.complete"
echo "$bin"
