"""What authentication and the request limits cost ``uibk-embed serve``: throughput side by side.

Two servers run the embedded default encoder at once, identical but for the protections:

* ``on``: an API key (``--api-key-file``; every request carries ``Authorization: Bearer``),
  the default concurrency limit (64, then 429), body timeout (30 s) and idle timeout (5 s);
* ``off``: no key, and limits too large to matter (10**6 requests, 3,600 s).

The same client (``RemoteEncoder``: requests of ``--request-texts`` texts, ``--in-flight`` at
once) encodes the same documents against each, alternately, ``--runs`` times; the figure is the
ratio of the median throughputs (on / off). Run it alone on the machine (say the load average).

    python benchmarks/serve_overhead.py --texts 256 --runs 5 --out benchmarks/results/serve_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from uibk_embedding.apps.data import read_corpus
from uibk_embedding.encoder.remote import RemoteEncoder
from uibk_embedding.encoder.server import serve_subprocess

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE.parent.parent / "shared" / "datasets" / "cranfield"


def documents(folder: Path, n: int) -> list[str]:
    corpus = read_corpus(folder)
    texts = [f"{d.title}\n{d.text}".strip() for d in corpus[:n]]
    if len(texts) < n:
        raise SystemExit(f"{folder} has {len(texts)} documents, fewer than --texts {n}")
    return texts


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--request-texts", type=int, default=16)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    texts = documents(args.data, args.texts)
    key = "bench-" + os.urandom(8).hex()
    with ExitStack() as stack:
        key_file = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "key"
        key_file.write_text(key)
        urls = {
            "on": stack.enter_context(serve_subprocess("--device", "cpu", "--api-key-file", str(key_file))),
            "off": stack.enter_context(serve_subprocess(
                "--device", "cpu", "--max-concurrent-requests", "1000000", "--body-timeout-s", "3600",
                "--idle-timeout-s", "3600")),
        }
        clients = {name: RemoteEncoder(url, api_key=key if name == "on" else None, show_progress=False,
                                       request_texts=args.request_texts, in_flight=args.in_flight)
                   for name, url in urls.items()}
        for c in clients.values():  # warm-up: model caches, connections
            c.encode_documents(texts[:32])
        rates: dict[str, list[float]] = {"on": [], "off": []}
        for run in range(args.runs):
            for name in (("on", "off") if run % 2 == 0 else ("off", "on")):
                t0 = time.perf_counter()
                out = clients[name].encode_documents(texts)
                dt = time.perf_counter() - t0
                assert len(out) == len(texts)
                rates[name].append(len(texts) / dt)
    med = {name: statistics.median(r) for name, r in rates.items()}
    result = {
        "texts": len(texts), "runs": args.runs, "request_texts": args.request_texts,
        "in_flight": args.in_flight, "texts_per_s": rates, "median_texts_per_s": med,
        "ratio_on_over_off": med["on"] / med["off"], "load_average_before": load_before,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
