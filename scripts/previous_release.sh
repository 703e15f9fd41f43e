#!/usr/bin/env bash
# The previous release's service binaries (selector-svc, admission-svc, relay-svc), for the
# rolling-upgrade test (relay-svc/tests/rolling_upgrade.rs): built once from the revision
# scripts/previous-release.txt records, into a cache outside the clone, and reused by every later
# run. Prints the directory that holds them; everything else goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
read -r version revision < scripts/previous-release.txt
cache="${POOLGATE_CACHE:-/var/cache/poolgate}/release-${version}-${revision:0:12}"
bin="$cache/bin"
if [ -x "$bin/selector-svc" ] && [ -x "$bin/admission-svc" ] && [ -x "$bin/relay-svc" ]; then
  echo "$bin"
  exit 0
fi
echo "building release $version ($revision) into $cache (once; later runs reuse it)" >&2
rm -rf "$cache"
mkdir -p "$cache/src" "$bin"
# The release's commit: in this clone's history, or fetched (a shallow clone lacks it).
if ! git cat-file -e "${revision}^{commit}" 2>/dev/null; then
  git fetch --quiet origin "$revision" >&2 || git fetch --quiet --unshallow origin >&2
fi
# The release's tree as committed (no worktree: the cache outlives this clone).
git archive "$revision" | tar -x -C "$cache/src"
(
  cd "$cache/src"
  CARGO_TARGET_DIR="$cache/target" CARGO_INCREMENTAL=0 \
    cargo build --locked -p selector-svc -p admission-svc -p relay-svc --bins >&2
)
for name in selector-svc admission-svc relay-svc; do
  cp "$cache/target/debug/$name" "$bin/$name"
done
# Only the binaries are kept: the build tree is gigabytes.
rm -rf "$cache/target" "$cache/src"
echo "$bin"
