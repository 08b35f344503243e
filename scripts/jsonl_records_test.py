#!/usr/bin/env python3
"""Tests of scripts/jsonl_records.py on files written here (ctest: python.jsonl_records)."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jsonl_records  # noqa: E402


class Read(unittest.TestCase):
    def write(self, text):
        fd, path = tempfile.mkstemp(suffix=".jsonl")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        self.addCleanup(os.remove, path)
        return path

    def test_a_missing_file_has_no_records(self):
        self.assertEqual(jsonl_records.read("/nonexistent/deloco/syncer.jsonl"), [])

    def test_skips_what_a_kill_or_a_writer_leaves_and_keeps_the_order(self):
        path = self.write('{"kind":"merge","merges":1}\n\n[1,2]\nnot json\n'
                          '{"kind":"merge","mer{"kind":"started"}\n'   # cut by a kill, then a new process
                          '{"kind":"apply","version":3}\n'
                          '{"kind":"merge","merges":2')                # still being written
        self.assertEqual(jsonl_records.read(path), [{"kind": "merge", "merges": 1}, {"kind": "apply", "version": 3}])

    def test_kinds_filter(self):
        path = self.write('{"kind":"merge"}\n{"kind":"eval","loss":2.5}\n{"no_kind":1}\n')
        self.assertEqual(jsonl_records.read(path, kinds={"eval"}), [{"kind": "eval", "loss": 2.5}])
        self.assertEqual(len(jsonl_records.read(path)), 3)


if __name__ == "__main__":
    unittest.main()
