"""deloco's JSON-lines records (syncer.jsonl, learner-N.jsonl, metrics.jsonl), read the one way every Python tool of
the project reads them (bench/, scripts/, tests/). Standard library only.

    sys.path.insert(0, os.path.join(ROOT, "scripts")); import jsonl_records
    merges = jsonl_records.read(run / "syncer.jsonl", kinds={"merge"})
"""
import json
import os

__all__ = ["read"]


def read(path, kinds=None):
    """The records (JSON objects) of a JSON-lines file, in order: [] when the file is missing.

    Skipped, never fatal: a last line without its newline (still being written, or cut by a kill; a process that
    starts again appends after it, so such a cut shows as one unreadable line, also skipped), blank lines, lines that
    are not JSON, and values that are not objects. `kinds`: keep only records whose "kind" is one of them."""
    out = []
    try:
        f = open(os.fspath(path), errors="replace")
    except FileNotFoundError:
        return out
    with f:
        for line in f:
            if not line.endswith("\n"):
                break
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and (kinds is None or r.get("kind") in kinds):
                out.append(r)
    return out
