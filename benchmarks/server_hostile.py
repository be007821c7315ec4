"""Peak memory of ``uibk-embed serve`` under hostile clients: ~30 MB bodies of valid JSON junk.

The real server (the embedded default encoder, on the CPU, bound to 127.0.0.1 only) runs in a
child process; ``N`` client threads (``--clients 8,64``: one run per figure, each run its own
server) send, for ``--seconds`` seconds at most and ``--max-requests`` requests per client at
most, with a 50 ms pause after each answer, bodies just under the 32 MB default limit that are
valid JSON but not a valid request:

* ``junk_key``: 16 real texts plus an extra key holding a list of ``{}`` objects (the parsed junk
  would stay alive while the texts wait for the encoder);
* ``dict_texts``: ``"texts"`` is a list of ``{}`` objects instead of strings;
* ``nested``: 16 real texts plus an extra key holding lists nested 64 deep, many times.

The server process's resident memory is sampled from outside (``/proc/PID/status``: ``VmRSS``
every 50 ms and the kernel's high-water mark ``VmHWM``); a run whose server passes ``--rss-cap-mb``
is stopped there (the figure is then "at least the cap"). Say the load average with the figure.

Measured on a 2-core machine shared with other jobs (load average at the end of each run
9.3-10.7 with the old server, 5.4-5.6 with this module),
30 MB bodies, 20 s:

============================  =========  ============  =============================================
server                        clients    peak RSS      answers
============================  =========  ============  =============================================
``server.py`` of 52d00e3      8          3,600 MiB     every request timed out (50 s), 1 413
(``json.loads`` of the body)  64         4,878 MiB     every request timed out (65 s): still growing
this module                   8          1,750 MiB     133 x 400
(``parse_request``, budgets)  64         1,480 MiB     24 x 400, 560 x 429 (``--max-queued-mb 256``)
============================  =========  ============  =============================================

The idle server holds 1,077 MiB (the model and torch); results in
``benchmarks/results/server_hostile_{before,after}.json``.

    python benchmarks/server_hostile.py --clients 8,64 --seconds 20 \\
        --out benchmarks/results/server_hostile_after.json
    # today's server against a copy of an older server.py (run as a script):
    python benchmarks/server_hostile.py --server-file /tmp/old_server.py --out ...
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

TEXT = ("laminar to turbulent transition in the boundary layer of a flat plate at high mach number "
        "with heat transfer to the wall and an oblique shock wave interaction downstream ") * 3


def bodies(size: int) -> dict[str, bytes]:
    """The hostile bodies, each about ``size`` bytes and valid JSON."""
    texts = json.dumps([TEXT] * 16)
    head = f'{{"kind": "documents", "texts": {texts}, "junk": ['.encode()
    objs = (size - len(head) - 2) // 3
    junk_key = head + b"{}," * objs + b"{}]}"
    dict_texts = b'{"kind": "documents", "texts": [' + b"{}," * ((size - 40) // 3) + b"{}]}"
    nest = b"[" * 64 + b"]" * 64
    nested = head + b",".join([nest] * ((size - len(head)) // (len(nest) + 1))) + b"]}"
    return {"junk_key": junk_key, "dict_texts": dict_texts, "nested": nested}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB, read from /proc."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


def start_server(server_file: Path | None, extra: list[str], log) -> tuple[subprocess.Popen, int]:
    port = free_port()
    entry = [str(server_file)] if server_file else ["-m", "uibk_embedding.encoder.server"]
    proc = subprocess.Popen([sys.executable, *entry, "--host", "127.0.0.1", "--port", str(port),
                             "--device", "cpu", *extra], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("the server did not answer /health within 300 s")


def client(port: int, body: bytes, deadline: float, max_requests: int, codes: Counter,
           lock: threading.Lock) -> None:
    """One hostile client: the same body again and again, until the deadline (bounded count)."""
    for _ in range(max_requests):
        if time.monotonic() > deadline:
            return
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline - time.monotonic() + 30)
            conn.request("POST", "/encode", body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            code = str(r.status)
            conn.close()
        except OSError as e:
            code = type(e).__name__
        with lock:
            codes[code] += 1
        time.sleep(0.05)  # a pause after each answer, to keep the client side's own load bounded


def run(n: int, args, hostile: dict[str, bytes]) -> dict:
    with tempfile.TemporaryFile("w+") as log:
        proc, port = start_server(args.server_file, args.server_args, log)
        try:
            time.sleep(1.0)
            idle, _ = rss_mb(proc.pid)
            codes: Counter = Counter()
            lock = threading.Lock()
            deadline = time.monotonic() + args.seconds
            kinds = list(hostile)
            threads = [threading.Thread(target=client, daemon=True,
                                        args=(port, hostile[kinds[i % len(kinds)]], deadline,
                                              args.max_requests, codes, lock)) for i in range(n)]
            for t in threads:
                t.start()
            peak, capped, t0 = idle, False, time.monotonic()
            while any(t.is_alive() for t in threads) and time.monotonic() < deadline + 60:
                now, _ = rss_mb(proc.pid)
                peak = max(peak, now)
                if now > args.rss_cap_mb:
                    capped = True
                    break
                time.sleep(0.05)
            elapsed = time.monotonic() - t0
            _, hwm = rss_mb(proc.pid)
        finally:
            proc.kill()
            proc.wait()
        log.seek(0)
        tail = log.read()[-500:]
    return {"clients": n, "idle_rss_mb": round(idle, 1), "peak_rss_mb": round(max(peak, hwm), 1),
            "stopped_at_cap": capped, "seconds": round(elapsed, 1), "answers": dict(codes),
            "loadavg": open("/proc/loadavg").read().split()[:3], "server_log_tail": tail}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="8,64", help="comma-separated numbers of concurrent clients")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the clients send, per run")
    ap.add_argument("--max-requests", type=int, default=50, help="requests per client at most")
    ap.add_argument("--body-mb", type=float, default=30.0)
    ap.add_argument("--rss-cap-mb", type=float, default=6000.0,
                    help="stop a run whose server passes this resident size (protects the machine)")
    ap.add_argument("--server-file", type=Path, default=None,
                    help="run this server.py as a script instead of uibk_embedding.encoder.server")
    ap.add_argument("--server-args", type=shlex.split, default=[],
                    help="more arguments for the server, one string (e.g. '--encoder DIR')")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    hostile = bodies(int(args.body_mb * 2**20))
    result = {"body_mb": args.body_mb, "kinds": {k: len(v) for k, v in hostile.items()},
              "server": str(args.server_file or "uibk_embedding.encoder.server"),
              "loadavg_before": open("/proc/loadavg").read().split()[:3], "cpus": os.cpu_count(),
              "runs": []}
    for n in (int(x) for x in args.clients.split(",")):
        r = run(n, args, hostile)
        print(f"{n:3d} clients: idle {r['idle_rss_mb']:.0f} MiB -> peak {r['peak_rss_mb']:.0f} MiB"
              f"{' (stopped at the cap)' if r['stopped_at_cap'] else ''} in {r['seconds']} s, "
              f"answers {r['answers']}, load {' '.join(r['loadavg'])}", flush=True)
        result["runs"].append(r)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
