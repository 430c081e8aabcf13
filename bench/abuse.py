"""Benchmark what an abusive client costs the other tenants: wrong secrets, and an over-rate key's 429s.

One ``quarry serve`` (the embedded default, the first ``--docs`` SciFact documents of
``bench/access.py``'s base, BM25 searches ``top_k`` 10) with two keys: the victim, a read key of
tenant ``default`` (its collection), and the abuser's key of tenant ``acme``. Load from ``wrk``
(a C event loop, ~1 % of a core; its Lua counts answers by status). Each round measures the
victim alone (1 connection, closed loop: "idle") and again while the abuser runs, the two phases'
order alternating round by round; the figures are medians over rounds.

``wrong``: the abuser sends, on 1, 4, 16 and 32 connections, requests whose key is the acme key's
id with a new random secret each time. Each 401 ``wrong secret`` is one secret checked (scrypt),
each 429 one refused unchecked: checks per second = 401s / seconds, to stay <= 5 (the documented
bound per key id), and the victim's p50 within 2x of idle.

Early 429s are held ``QUARRY_AUTH__LIMIT_HOLD_S`` (default 1 s) before they go: an abuser that
ignores ``Retry-After`` is paced to about one request per connection and second. ``--limit-hold-s
0`` turns that off, to measure what each 429 costs.

``flood``: the abuser's key has ``--rate 10/s`` and sends on ``--flood-clients`` connections,
ignoring ``Retry-After``, ``--flood-rps`` requests/s in all (default 1,000; each connection
pauses between requests; 0: a closed loop, as fast as the server answers), nearly all 429. The victim's
p50 ratio flooded/idle (target <= 2), and the server's CPU per request while flooded (``/proc``:
the 429 path's cost: the CPU the abuse added, the victim's searches scaled from its idle phase
taken out, per abuser request).

    python bench/abuse.py wrong [--rounds 3] [--seconds 5]
    python bench/abuse.py flood [--rounds 5] [--seconds 5] [--flood-clients 16]
    python bench/abuse.py all --json /tmp/abuse.json

Options as ``bench/access.py`` (``--work``, ``--scifact``, ``--docs``). Figures: docs/access.md
("Abuse").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.access import COLLECTION, _bodies, _env, _free_port, _quarry, _warm, copy_data, prepare  # noqa: E402

_LUA = """
local bodies = {}
for line in io.lines("%(bodies)s") do bodies[#bodies + 1] = line end
local key = "%(key)s"
local wrong_id = "%(wrong_id)s"
local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
local counter = 0
local pause_ms = %(pause_ms)d  -- each connection waits this long between requests (an offered rate)
if pause_ms > 0 then delay = function() return pause_ms end end
local function secret()
  local t = {}
  for i = 1, 43 do local r = math.random(1, 64); t[i] = alphabet:sub(r, r) end
  return table.concat(t)
end
init = function(args) math.randomseed(math.floor(os.clock() * 1e6) + tonumber(tostring({}):sub(10), 16) %% 100000) end
request = function()
  counter = counter + 1
  local headers = {["Content-Type"] = "application/json"}
  if wrong_id ~= "" then headers["Authorization"] = "Bearer qk_" .. wrong_id .. "_" .. secret()
  elseif key ~= "" then headers["Authorization"] = "Bearer " .. key end
  return wrk.format("POST", nil, headers, bodies[(counter %% #bodies) + 1])
end
local threads = {}
setup = function(thread) table.insert(threads, thread) end
s200 = 0; s401 = 0; s429 = 0; other = 0
response = function(status, hdrs, body)
  if status == 200 then s200 = s200 + 1
  elseif status == 401 then s401 = s401 + 1
  elseif status == 429 then s429 = s429 + 1
  else other = other + 1 end
end
done = function(summary, latency, requests)
  local t = {s200 = 0, s401 = 0, s429 = 0, other = 0}
  for _, thread in ipairs(threads) do
    for name, _ in pairs(t) do t[name] = t[name] + thread:get(name) end
  end
  io.write(string.format("COUNTS s200=%%d s401=%%d s429=%%d other=%%d\\n", t.s200, t.s401, t.s429, t.other))
  io.write(string.format("P50US %%d\\nP99US %%d\\n", latency:percentile(50), latency:percentile(99)))
end
"""


def wrk(  # noqa: PLR0913 - one run's knobs
    url: str, bodies: Path, *, clients: int, seconds: float, key: str = "", wrong_id: str = "", rps: float = 0,
) -> dict[str, Any]:
    """One wrk run against the search route: requests/s, p50/p99 (ms) and answers by status.

    ``rps``: the rate offered (each connection pauses ``clients / rps`` between requests); 0: closed loop.
    """
    pause_ms = round(clients * 1000 / rps) if rps else 0
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_LUA % {"bodies": bodies, "key": key, "wrong_id": wrong_id, "pause_ms": pause_ms})
    try:
        cmd = ["wrk", "-t1", f"-c{clients}", f"-d{round(seconds)}s", "--timeout", "10s", "-s", script.name,
               f"{url}/v1/collections/{COLLECTION}/search"]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-1000:]} {done.stderr[-1000:]}")
        out = done.stdout
    finally:
        os.unlink(script.name)
    counts = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", re.search(r"COUNTS (.*)", out).group(1))}  # type: ignore[union-attr]
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50_ms": int(re.search(r"P50US (\d+)", out).group(1)) / 1000,  # type: ignore[union-attr]
        "p99_ms": int(re.search(r"P99US (\d+)", out).group(1)) / 1000,  # type: ignore[union-attr]
        **counts,
    }


@contextmanager
def serve(env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A ``quarry serve`` on a free loopback port: ``(url, pid)``."""
    port = _free_port()
    log = tempfile.NamedTemporaryFile(prefix="quarry-bench-abuse-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "quarry.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {Path(log.name).read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready in 300 s")
            time.sleep(0.5)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _beside(
    url: str, bodies: Path, victim: str, seconds: float, **abuser: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The victim's 1-connection run while the abuser's wrk runs (started first, lasting 2 s longer)."""
    out: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: out.update(wrk(url, bodies, seconds=seconds + 2, **abuser)), daemon=True
    )
    thread.start()
    time.sleep(0.5)
    victim_run = wrk(url, bodies, clients=1, seconds=seconds, key=victim)
    thread.join()
    return victim_run, out


def bench(what: str, work: Path, base: Path, bodies: Path, rounds: int, seconds: float,  # noqa: PLR0913
          flood_clients: int, flood_rps: float = 0, hold_s: str = "") -> dict[str, Any]:
    settings = {"QUARRY_AUTH__LIMIT_HOLD_S": hold_s} if hold_s else {}
    env = _env(copy_data(base, work / "abuse"), **settings)
    victim = _quarry(env, "keys", "create", "--tenant", "default", "--scopes", "read", "--name", "victim").strip()
    rate = ["--rate", "10/s"] if what == "flood" else []
    abuser = _quarry(env, "keys", "create", "--tenant", "acme", "--scopes", "read", *rate, "--name", "abuser").strip()
    rows = []
    with serve(env) as (url, pid):
        _warm(url, bodies, victim)
        levels = (1, 4, 16, 32) if what == "wrong" else (flood_clients,)
        for r in range(rounds):
            row: dict[str, Any] = {"round": r + 1}
            for clients in levels:
                load = {"clients": clients, "wrong_id": abuser[3:15]} if what == "wrong" else {
                    "clients": clients, "key": abuser, "rps": flood_rps}
                cell: dict[str, Any] = {}
                cpu: dict[str, float] = {}
                for phase in ("idle", "abused") if (r + clients) % 2 == 0 else ("abused", "idle"):
                    before, started = _cpu_s(pid), time.monotonic()
                    if phase == "idle":
                        cell["idle"] = wrk(url, bodies, clients=1, seconds=seconds, key=victim)
                    else:
                        cell["abused"], cell["abuser"] = _beside(url, bodies, victim, seconds, **load)
                    cpu[phase] = (_cpu_s(pid) - before) / (time.monotonic() - started)  # CPU s per s
                    time.sleep(1.0)  # the checks of one phase leave the window before the next
                # the server CPU the abuser's requests added, per abuser request (victim's searches taken out)
                abuser_requests = cell["abuser"]["rps"] * (seconds + 2)
                extra = (cpu["abused"] - cpu["idle"] * cell["abused"]["rps"] / cell["idle"]["rps"]) * (seconds + 2.5)
                cell["cpu_us_per_request"] = extra / max(1.0, abuser_requests) * 1e6
                a = cell["abuser"]
                cell["checks_per_s"] = a["s401"] / (seconds + 2)
                cell["p50_ratio"] = cell["abused"]["p50_ms"] / cell["idle"]["p50_ms"]
                row[str(clients)] = cell
                print(f"round {r + 1}, {clients} abuser connections: victim p50 {cell['idle']['p50_ms']:.2f} -> "
                      f"{cell['abused']['p50_ms']:.2f} ms ({cell['p50_ratio']:.2f}x); abuser {a['rps']:.0f} req/s "
                      f"(200 {a['s200']}, 401 {a['s401']}, 429 {a['s429']}, other {a['other']}); "
                      f"{cell['checks_per_s']:.1f} checks/s; {cell['cpu_us_per_request']:.0f} us CPU/request",
                      flush=True)
            rows.append(row)
    summary = {
        str(c): {
            "median_p50_ratio": statistics.median(row[str(c)]["p50_ratio"] for row in rows),
            "median_checks_per_s": statistics.median(row[str(c)]["checks_per_s"] for row in rows),
            "max_checks_per_s": max(row[str(c)]["checks_per_s"] for row in rows),
            "median_abuser_rps": statistics.median(row[str(c)]["abuser"]["rps"] for row in rows),
            "median_cpu_us_per_request": statistics.median(row[str(c)]["cpu_us_per_request"] for row in rows),
        }
        for c in levels
    }
    for c, s in summary.items():
        print(f"{what}, {c} connections: victim p50 ratio median {s['median_p50_ratio']:.2f}; checks/s median "
              f"{s['median_checks_per_s']:.1f} (max {s['max_checks_per_s']:.1f}); abuser {s['median_abuser_rps']:.0f} "
              f"req/s; {s['median_cpu_us_per_request']:.0f} us CPU/request")
    return {"rounds": rows, "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["wrong", "flood", "all"])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "quarry-bench-access")
    parser.add_argument("--scifact", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--docs", type=int, default=512, help="SciFact documents ingested")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each phase")
    parser.add_argument("--flood-clients", type=int, default=16, help="flood: the abuser's connections")
    parser.add_argument("--flood-rps", type=float, default=1000, help="flood: the rate offered (0: closed loop)")
    parser.add_argument("--limit-hold-s", default="", help="QUARRY_AUTH__LIMIT_HOLD_S of the server (default: its "
                        "own, 1; 0: early 429s answered at once, to measure their path's cost)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install -y wrk)")
    args.work.mkdir(parents=True, exist_ok=True)
    base, queries = prepare(args.work, args.scifact, args.docs)
    bodies = _bodies(args.work, queries, "bm25")
    results = {w: bench(w, args.work, base, bodies, args.rounds, args.seconds, args.flood_clients, args.flood_rps,
                        args.limit_hold_s)
               for w in (("wrong", "flood") if args.what == "all" else (args.what,))}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
