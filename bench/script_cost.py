#!/usr/bin/env python3
"""What one acquire + release pair of admission's Lua scripts costs Redis, in instructions.

Runs redis-server under `valgrind --tool=callgrind` (instruction counts do not depend on what
else the machine is doing, unlike a rate measured on two shared cores), sends N acquire +
release pairs of the bare scripts over 100 accounts (no limits that refuse, no client key, no
user RPM: the common path), and prints the instructions per pair: the run's total minus the
same server's total with no pairs. Compares the scripts of this tree with those of a git
revision (default `9025eef`, before the release fence), composed as `lease/src/redis_backend/
scripts.rs` composes them.

    python3 bench/script_cost.py [N (default 3000)] [revision (default 9025eef)] [revision ...]

Needs redis-server and valgrind (Debian: apt-get install -y redis-server valgrind). No Python
package: the RESP client is the dozen lines below.
"""

import os
import re
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "lease/src/redis_backend/scripts")
ACCOUNTS = 100
TIME_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class Redis:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def reply(self):
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind in (b"+", b":"):
            return rest
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.sock.recv(65536)
            data, self.buf = self.buf[:n], self.buf[n + 2 :]
            return data
        if kind == b"*":
            return [self.reply() for _ in range(max(int(rest), 0))]
        raise RuntimeError("unexpected reply %r" % line)

    def call(self, *args):
        self.sock.sendall(resp(*args))
        return self.reply()

    def pipeline(self, commands):
        self.sock.sendall(b"".join(resp(*c) for c in commands))
        return [self.reply() for _ in commands]


def current_scripts(revision=None):
    """The scripts of this tree, or of `revision` when it has the same layout."""
    if revision is None:
        read = lambda name: open(os.path.join(SCRIPTS, name)).read()
    else:
        read = lambda name: subprocess.check_output(
            ["git", "-C", ROOT, "show", "%s:lease/src/redis_backend/scripts/%s" % (revision, name)],
            text=True,
        )
    keyed = lambda body: "\n".join(
        [TIME_PRELUDE, read("prelude.lua"), read("lease_prelude.lua"), read("key_prelude.lua"), body]
    )
    acquire = keyed(read("acquire.lua"))
    release_body = read("release.lua")
    release = keyed(release_body)
    # Since the wake across replicas the release also reads the account's waiters and takes the
    # publisher's tag (publishing only when someone waits: never in this run).
    wakes = "PUBLISH" in release_body
    # Since the recount after a wipe the acquire also keeps the account's `kept` marker (KEYS[6])
    # and takes the recount (ARGV[11]; 0 here: the first acquire of each account sets the marker,
    # and with it present the recount sent changes nothing).
    kept = "KEYS[6]" in read("acquire.lua") and "kept" in read("acquire.lua")

    def commands(i, sha_acquire, sha_release):
        a = i % ACCOUNTS
        lease = "%d.bench.%d" % (a, i)
        k = lambda name: "pg:{a:%d}:%s" % (a, name)
        # KEYS and ARGV as lease/src/redis_backend/scripts.rs documents them.
        if kept:
            acq = ["EVALSHA", sha_acquire, 6, k("leases"), k("rpm"), k("cooldown"), k("window"), k("rpm"),
                   k("kept"), lease, 30000, 1000, 0, 0, 60000, 18000000, 0, 0, 0, 0]
        else:
            acq = ["EVALSHA", sha_acquire, 5, k("leases"), k("rpm"), k("cooldown"), k("window"), k("rpm"),
                   lease, 30000, 1000, 0, 0, 60000, 18000000, 0, 0, 0]
        if wakes:
            rel = ["EVALSHA", sha_release, 5, k("leases"), k("window"), k("holders"), k("released"),
                   k("waiters"), lease, 0, 18000000, 60000, "0123456789abcdef"]
        else:
            rel = ["EVALSHA", sha_release, 4, k("leases"), k("window"), k("holders"), k("released"),
                   lease, 0, 18000000, 60000]
        return acq, rel

    return acquire, release, commands


def old_scripts(revision):
    """The scripts of a revision from before they moved to `lease/` (9025eef's layout)."""
    if subprocess.run(["git", "-C", ROOT, "cat-file", "-e", revision + ":lease/src/redis_backend/scripts/release.lua"],
                      stderr=subprocess.DEVNULL).returncode == 0:
        return current_scripts(revision)
    source = subprocess.check_output(
        ["git", "-C", ROOT, "show", revision + ":admission-svc/src/redis_backend.rs"], text=True
    )
    const = lambda name: re.search(r"const " + name + r': &str = r#"(.*?)"#;', source, re.S).group(1)
    acquire = const("PRELUDE") + const("ACQUIRE")
    release = const("PRELUDE") + const("RELEASE")

    def commands(i, sha_acquire, sha_release):
        a = i % ACCOUNTS
        lease = "%d.bench.%d" % (a, i)
        k = lambda name: "pg:{a:%d}:%s" % (a, name)
        acq = ["EVALSHA", sha_acquire, 4, k("leases"), k("rpm"), k("cooldown"), k("window"),
               lease, 30000, 1000, 0, 0, 60000, 18000000, 0]
        rel = ["EVALSHA", sha_release, 3, k("leases"), k("window"), k("holders"), lease, 0, 18000000]
        return acq, rel

    return acquire, release, commands


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def instructions(scripts, pairs):
    acquire, release, commands = scripts
    port = free_port()
    out = tempfile.mktemp(prefix="callgrind.")
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out,
         "redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            try:
                redis = Redis(port)
                redis.call("PING")
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("redis-server under valgrind did not start")
        sha_acquire = redis.call("SCRIPT", "LOAD", acquire).decode()
        sha_release = redis.call("SCRIPT", "LOAD", release).decode()
        for base in range(0, pairs, 500):
            batch = [commands(i, sha_acquire, sha_release) for i in range(base, min(pairs, base + 500))]
            replies = redis.pipeline([c[0] for c in batch] + [c[1] for c in batch])
            granted = sum(1 for r in replies[: len(batch)] if r and r[0] == b"granted")
            if granted != len(batch):
                raise RuntimeError("only %d of %d acquires granted" % (granted, len(batch)))
        try:
            redis.call("SHUTDOWN", "NOSAVE")
        except (ConnectionError, OSError):
            pass
        server.wait(timeout=60)
        text = open(out).read()
        return int(re.search(r"(?:summary|totals):\s*(\d+)", text).group(1))
    finally:
        if server.poll() is None:
            server.kill()
        if os.path.exists(out):
            os.remove(out)


def per_pair(scripts, pairs):
    return (instructions(scripts, pairs) - instructions(scripts, 0)) / pairs


def main():
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    revisions = sys.argv[2:] or ["9025eef"]
    base = None
    print("instructions per acquire + release pair in redis-server (%d pairs, callgrind)" % pairs)
    for name, scripts in [(r, old_scripts(r)) for r in revisions] + [("this tree", current_scripts())]:
        cost = per_pair(scripts, pairs)
        base = base or cost
        print("  %-12s %9.0f  (%+.1f %% against %s)" % (name, cost, 100.0 * (cost - base) / base, revisions[0]))


if __name__ == "__main__":
    main()
