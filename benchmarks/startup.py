"""Start-up of ``uibk-embed search`` on a two-document exact store with the embedded default.

Each run is a fresh process (what a user types): ``uibk-embed search QUERY --path STORE``, wall
time and CPU time (user + system, the children's ``getrusage``) measured around it; the figures
are the medians of ``--runs`` runs after one warm-up run (which fills the OS page cache and the
model digest cache, as any second start finds them). Also measured, once each in a fresh
process: ``--help``; ``import torch`` alone; the import time of everything the search imports
(``python -X importtime``, the sum of the top-level imports); and whether the search imported
transformers at all. The load average is printed before and after: on shared cores the wall
times are not comparable between runs, the CPU times less so.

``--src DIR`` runs another checkout's ``src`` (first on ``PYTHONPATH``) with the same
interpreter, so a before/after pair is measured in one call on the same machine::

    git archive HEAD~3 src | tar -x -C /tmp/before
    python benchmarks/startup.py --runs 7 --src /tmp/before/src --json before.json
    python benchmarks/startup.py --runs 7 --json after.json

Usage::

    python benchmarks/startup.py [--runs 5] [--src DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUERY = "slipstream lift"
DOCS = [{"_id": "a", "text": "the wing lift in a propeller slipstream"},
        {"_id": "b", "text": "boundary layer transition"}]
CLI = "from uibk_embedding.apps.cli import main; raise SystemExit(main())"
# what the search must not import for the embedded default (tests/test_encoder_startup.py)
HEAVY = ("transformers", "transformers.generation", "sklearn", "torch._dynamo", "sentence_transformers")


def _env(src: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of one child process; raises when it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"{cmd} failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def import_report(cmd_args: list[str], env: dict[str, str]) -> dict[str, object]:
    """``-X importtime`` of one search: the top-level imports' total and the heavy modules."""
    probe = (f"import sys; sys.argv = ['uibk-embed', *{cmd_args!r}]\n"
             "from uibk_embedding.apps.cli import main\n"
             "try:\n    main()\nfinally:\n"
             f"    import json; print('HEAVY', json.dumps([m for m in {HEAVY!r} if m in sys.modules]),"
             " file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", probe], env=env,
                          capture_output=True, text=True)
    total, slowest = 0, []
    heavy: list[str] = []
    for line in done.stderr.splitlines():
        if line.startswith("HEAVY "):
            heavy = json.loads(line[6:])
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if cumulative.strip().isdigit() and not name.startswith("  "):  # a top-level import
            us = int(cumulative)
            total += us
            slowest.append((us, name.strip()))
    slowest.sort(reverse=True)
    return {"imports_s": round(total / 1e6, 3), "slowest_imports": [[n, round(us / 1e6, 3)]
                                                                   for us, n in slowest[:5]],
            "heavy_modules_imported": heavy}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--src", help="another checkout's src folder, put first on PYTHONPATH")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    env = _env(args.src)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        corpus.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
        store = str(Path(tmp) / "store")
        cli = [sys.executable, "-c", CLI]
        timed([*cli, "index", str(corpus), "--path", store, "--quiet"], env)
        search = ["search", QUERY, "--path", store]
        timed([*cli, *search], env)  # warm-up: page cache, digest cache
        walls, cpus = [], []
        for _ in range(args.runs):
            wall, cpu, out = timed([*cli, *search], env)
            walls.append(wall)
            cpus.append(cpu)
        assert " a " in out or "  a" in out, out  # the slipstream document ranks first
        help_wall, _, _ = timed([*cli, "--help"], env)
        torch_wall, torch_cpu, _ = timed([sys.executable, "-c", "import torch"], env)
        report = {
            "src": args.src or "this checkout",
            "runs": args.runs,
            "search_wall_median_s": round(statistics.median(walls), 3),
            "search_cpu_median_s": round(statistics.median(cpus), 3),
            "search_wall_s": [round(w, 3) for w in walls],
            "help_wall_s": round(help_wall, 3),
            "import_torch_wall_s": round(torch_wall, 3),
            "import_torch_cpu_s": round(torch_cpu, 3),
            **import_report(search, env),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "cores": os.cpu_count(),
        }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
