"""Add documents to a store folder while it is being served (docs/serving.md).

The writer beside ``examples/serve_store.py``: it opens the same folder for writing, encodes
the documents and upserts them in batches. Each batch is one write: it takes the folder's write
lock for its duration (another writer waits up to ``--write-timeout`` seconds, then gets
StoreInUse) and, once it returns, every serving worker finds it on its next search.

    python examples/index_more.py --store ./my-index more.jsonl          # {"id", "text", ...} lines
    python examples/index_more.py --store ./my-index --id d9 --text "laminar flow on a wing"
    cat more.jsonl | python examples/index_more.py --store ./my-index -

A line's other fields (``"topic": "finance"``) are kept as metadata. The folder is created
when it does not exist (``--backend``, default exact), so this also builds a first store;
``uibk-embed index more.jsonl --path ./my-index`` does the same with the CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator

import uibk_embedding as ue


def read_jsonl(paths: list[str]) -> Iterator[tuple[str, str, dict]]:
    for path in paths:
        lines = sys.stdin if path == "-" else open(path, encoding="utf-8")
        try:
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict) or "id" not in row or "text" not in row:
                    raise SystemExit(f"{path}:{n}: expected a JSON object with 'id' and 'text'")
                meta = {k: v for k, v in row.items() if k not in ("id", "text")}
                yield str(row["id"]), str(row["text"]), meta
        finally:
            if lines is not sys.stdin:
                lines.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="JSONL files of {'id', 'text', ...} lines ('-': stdin)")
    ap.add_argument("--store", default=os.environ.get("UIBK_STORE"),
                    help="the store folder (default: $UIBK_STORE)")
    ap.add_argument("--backend", default=os.environ.get("UIBK_BACKEND") or None,
                    help="the backend (default: read from the folder; exact for a new one)")
    ap.add_argument("--id", help="one document's id (with --text)")
    ap.add_argument("--text", help="one document's text (with --id)")
    ap.add_argument("--metadata", default="{}", help="one document's metadata, a JSON object")
    ap.add_argument("--batch", type=int, default=64, help="documents per write (default 64)")
    ap.add_argument("--write-timeout", type=float, default=None,
                    help="exact, plaid, warp: seconds a write waits for another writer's lock "
                         "(default: the store's, 5)")
    args = ap.parse_args(argv)
    if not args.store:
        ap.error("give --store FOLDER (or set UIBK_STORE)")
    if (args.id is None) != (args.text is None):
        ap.error("--id and --text go together")
    docs = list(read_jsonl(args.files))
    if args.id is not None:
        docs.append((args.id, args.text, json.loads(args.metadata)))
    if not docs:
        ap.error("nothing to add: give JSONL files or --id and --text")

    enc = ue.load_encoder(os.environ.get("UIBK_ENCODER") or None)
    opts = {} if args.write_timeout is None else {"write_timeout": args.write_timeout}
    with ue.open_store(args.backend, path=args.store, format=enc.format, **opts) as store:
        for i in range(0, len(docs), args.batch):
            ids, texts, metas = zip(*docs[i:i + args.batch], strict=True)
            store.upsert(list(ids), enc.encode_documents(list(texts)), list(metas))
        print(f"added {len(docs)} documents to {args.store}; it holds {store.count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
