"""wrk as the load generator of every HTTP figure, and the CPU the server spent on it.

`load(url, ...)` runs `wrk` (Debian package `wrk`: a C client, one thread, so the figures
measure the server and not a Python client) with a Lua script written for the run: each
`{n}` in the body becomes a number unique to the request (unique recipients), and with a
`rate` every request is scheduled on a clock (`delay()`), so the load is paced rather than
flat out. It returns the requests, the rate, non-2xx answers, socket errors and p50/p99
latency. `cpu_seconds(pid)` is the user+system CPU time of a process and all its
descendants (a service with `--workers` is a tree), read from /proc: sampled around a run,
it gives the CPU seconds per request the service spent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

WRK = "wrk"
_TICKS = os.sysconf("SC_CLK_TCK")

# The run's parameters are prepended as globals; `{n}` splits the body into parts that are
# joined with a number unique to the request (start + a counter: one wrk thread).
_SCRIPT = """
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local clock = ffi.new("bench_timespec")
local function now()
  ffi.C.clock_gettime(1, clock)  -- CLOCK_MONOTONIC
  return tonumber(clock.tv_sec) + tonumber(clock.tv_nsec) * 1e-9
end

local counter = START
local next_send = nil

function request()
  counter = counter + 1
  local body = BODY
  if #PARTS > 1 then body = table.concat(PARTS, tostring(counter)) end
  return wrk.format(METHOD, PATH, HEADERS, body)
end

if INTERVAL > 0 then
  -- Called after each answer on any connection: the next request waits for the next slot
  -- of the thread's schedule (a slot already past is sent at once).
  function delay()
    local t = now()
    if next_send == nil then next_send = t end
    next_send = next_send + INTERVAL
    local wait = next_send - t
    if wait < 0 then return 0 end
    return math.floor(wait * 1000)
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "non_2xx": %d, "socket_errors": %d,'
    .. ' "p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d}\\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


def apt_install(package: str, *settings: str) -> str | None:
    """Install a Debian package the benchmarks drive (`wrk`, `postfix`) with apt-get, as root;
    `settings` are debconf lines answering its questions. Why it failed, or None."""
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return f"{package} is missing and apt-get cannot install it here (not Debian, or not root)"
    print(f"installing {package} with apt-get", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if settings:
        subprocess.run(["debconf-set-selections"], input="\n".join(settings), text=True, env=env)
    install = ["apt-get", "install", "-y", "-qq", package]
    if subprocess.run(install, capture_output=True, env=env).returncode:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env)
        done = subprocess.run(install, capture_output=True, text=True, env=env)
        if done.returncode:
            return f"apt-get install {package} failed: {done.stderr.strip()[-300:]}"
    return None


def missing() -> str | None:
    """Why wrk cannot run here, or None when it can (it is installed when it is not there)."""
    if shutil.which(WRK) is None:
        return apt_install("wrk")
    return None


def _lua_string(text: str) -> str:
    out = []
    for byte in text.encode():
        char = chr(byte)
        if char in '"\\' or not 32 <= byte < 127:
            out.append(f"\\{byte:03d}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def script(
    method: str, path: str, headers: dict[str, str], body: str, start: int, interval: float
) -> str:
    """The Lua script for one run (exposed for a look: `python -c ...`)."""
    parts = "{" + ", ".join(_lua_string(p) for p in body.split("{n}")) + "}"
    header_table = (
        "{" + ", ".join(f"[{_lua_string(k)}] = {_lua_string(v)}" for k, v in headers.items()) + "}"
    )
    prelude = (
        f"METHOD = {_lua_string(method)}\nPATH = {_lua_string(path)}\n"
        f"HEADERS = {header_table}\nBODY = {_lua_string(body)}\nPARTS = {parts}\n"
        f"START = {start}\nINTERVAL = {interval!r}\n"
    )
    return prelude + _SCRIPT


def load(
    url: str,
    *,
    path: str = "/",
    method: str = "GET",
    body: str = "",
    key: str = "",
    connections: int = 50,
    seconds: float = 5.0,
    rate: float = 0.0,
    start: int = 0,
) -> dict[str, Any]:
    """One wrk run against `url + path`: `rate` requests/s in all (0: flat out). Returns
    requests, rate, non_2xx, socket_errors, p50_ms, p90_ms, p99_ms, max_ms and seconds."""
    headers = {"Content-Type": "application/json"} if body else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    interval = 1 / rate if rate else 0.0  # one wrk thread: one schedule for all connections
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as file:
        file.write(script(method, path, headers, body, start, interval))
    try:
        done = subprocess.run(
            [
                WRK,
                "--threads",
                "1",
                "--connections",
                str(connections),
                "--duration",
                f"{max(1, round(seconds))}s",
                "--timeout",
                "30s",
                "--script",
                file.name,
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=seconds + 120,
        )
    finally:
        Path(file.name).unlink()
    found = json.loads(done.stdout.strip().splitlines()[-1])
    elapsed = found["duration_us"] / 1e6
    return {
        "requests": found["requests"],
        "rate": found["requests"] / elapsed,
        "non_2xx": found["non_2xx"],
        "socket_errors": found["socket_errors"],
        "p50_ms": found["p50_us"] / 1000,
        "p90_ms": found["p90_us"] / 1000,
        "p99_ms": found["p99_us"] / 1000,
        "max_ms": found["max_us"] / 1000,
        "seconds": elapsed,
    }


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(parent, []).append(int(entry.name))
    return tree


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    tree, found, todo = _children(), [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(tree.get(current, []))
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` and its descendants so far."""
    ticks = 0
    for member in process_tree(pid):
        try:
            stat = Path(f"/proc/{member}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / _TICKS
