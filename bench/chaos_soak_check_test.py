#!/usr/bin/env python3
"""The soak checker's push accounting (chaos_soak_check.account_pushes) on hand-made records: each case a learner
and syncer history as the soak writes them, the expected verdict written from the rule, not from the code."""
import importlib.util, os, sys, unittest

spec = importlib.util.spec_from_file_location("chaos_soak_check",
                                              os.path.join(os.path.dirname(os.path.abspath(__file__)), "chaos_soak_check.py"))
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def push(t, fragment, base):
    return {"kind": "push", "t": t, "fragment": fragment, "base_version": base, "shard": 0}


def merge(t, fragment, version, learners):
    return {"kind": "merge", "t": t, "fragment": fragment, "version": version, "learners": learners,
            "staleness": [0] * len(learners)}


class AccountPushes(unittest.TestCase):
    def account(self, learner, merges):
        n, ok, reasons, unexplained, extra = check.account_pushes({0: merges}, {"learner-1": learner})
        return n, ok, dict(reasons), unexplained, extra

    def test_every_push_merged(self):
        n, ok, reasons, unexplained, extra = self.account(
            [push(1.0, 2, 10), push(2.0, 2, 11)], [merge(1.5, 2, 11, [1]), merge(2.5, 2, 12, [1])])
        self.assertEqual((n, ok, reasons, unexplained, extra), (2, 2, {}, [], 0))

    def test_a_push_lost_without_a_reason_is_unexplained(self):  # the check can fail
        _, ok, _, unexplained, _ = self.account([push(1.0, 2, 10), push(2.0, 2, 11)], [merge(2.5, 2, 12, [1])])
        self.assertEqual(ok, 1)
        self.assertEqual(len(unexplained), 1)

    def test_a_failover_before_the_next_push_explains_it(self):
        learner = [push(1.0, 2, 10), {"kind": "syncer_failover", "t": 1.5, "shard": 0}, push(2.0, 2, 10)]
        _, ok, reasons, unexplained, _ = self.account(learner, [merge(2.5, 2, 11, [1])])
        self.assertEqual((ok, reasons, unexplained), (1, {"syncer_failover": 1}, []))

    def test_a_repush_from_the_same_base_supersedes_the_unanswered_push(self):
        # No answer to the first push (its syncer was stopped), so the learner pushed the progress since base 201
        # again; then the syncer failed over and the join settled the second push as refused.
        learner = [push(1.0, 2, 201), push(2.0, 2, 201), {"kind": "syncer_failover", "t": 2.1, "shard": 0},
                   {"kind": "pushes_settled", "t": 2.2, "shard": 0, "fragments": [2]}, push(3.0, 2, 201)]
        _, ok, reasons, unexplained, extra = self.account(learner, [merge(3.5, 2, 202, [1])])
        self.assertEqual((ok, unexplained, extra), (1, [], 0))
        self.assertEqual(reasons, {"superseded": 1, "syncer_failover": 1})

    def test_the_last_push_of_a_same_base_run_still_needs_a_fate(self):
        _, ok, reasons, unexplained, _ = self.account([push(1.0, 2, 201), push(2.0, 2, 201)], [])
        self.assertEqual((ok, reasons), (0, {"superseded": 1}))
        self.assertEqual(len(unexplained), 1)

    def test_a_new_base_does_not_supersede(self):
        _, _, reasons, unexplained, _ = self.account([push(1.0, 2, 201), push(2.0, 2, 202)], [merge(2.5, 2, 203, [1])])
        self.assertEqual(reasons, {})
        self.assertEqual(len(unexplained), 1)


if __name__ == "__main__":
    unittest.main()
