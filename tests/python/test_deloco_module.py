#!/usr/bin/python3
"""The Python module (python/, docs/python.md) with Debian's /usr/bin/python3 and python3-torch, against a real
`deloco syncer` process: errors arrive as Python exceptions with deloco's messages; the join installs the global
parameters into the model's own tensors in place; a learner trains to train.steps and says goodbye; a model of
another shape is refused. Run by ctest as python.module (PYTHONPATH=build/python, DELOCO_BINARY, DELOCO_SOURCE_DIR).
"""
import gc
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import torch

import deloco

SRC = os.environ.get("DELOCO_SOURCE_DIR", ".")
BINARY = os.environ.get("DELOCO_BINARY", "./build/deloco")
sys.path.insert(0, os.path.join(SRC, "examples", "llama"))
from make_model import Llama  # noqa: E402


def tiny_llama(dim=32):
    torch.manual_seed(7)
    return Llama(256, 16, 1, dim, 4)


class ModuleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="deloco_py_")
        d = cls.tmp.name
        cls.model_path = os.path.join(d, "model.pt")
        torch.jit.script(tiny_llama()).save(cls.model_path)
        cls.config = os.path.join(d, "run.toml")
        with open(cls.config, "w") as f:
            f.write(textwrap.dedent(f"""\
                [model]
                kind = "torchscript"
                path = "{cls.model_path}"
                [data]
                path = "{SRC}/data/sotu"
                [train]
                steps = 30
                batch_size = 4
                log_every = 5
                eval_every = 0
                eval_tokens = 1024
                threads = 1
                [sync]
                learners = 1
                quorum = 1
                fragments = 2
                sync_every = 10
                [outer]
                kind = "sgd"
                lr = 1.0
                momentum = 0.0
                [net]
                plaintext = true
                address = "ipc://{d}/syncer.sock"
                join_timeout = 60.0
                [syncer]
                eval_interval = 0.0
                metrics = ""
                """))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_errors_are_python_exceptions_with_deloco_messages(self):
        model = tiny_llama()
        env_config = os.environ.pop("DELOCO_CONFIG", None)
        try:
            with self.assertRaisesRegex(deloco.ConfigError, "DELOCO_CONFIG"):
                deloco.Learner(model, learner_id=0)
        finally:
            if env_config is not None:
                os.environ["DELOCO_CONFIG"] = env_config
        self.assertTrue(issubclass(deloco.ConfigError, ValueError))
        with self.assertRaisesRegex(deloco.ConfigError, r"learner id 3 is not in \[0, sync.learners=1\)"):
            deloco.Learner(model, config=self.config, learner_id=3)
        with self.assertRaisesRegex(deloco.ConfigError, "no_such_key"):
            deloco.Learner(model, config=self.config, learner_id=0, set=["train.no_such_key=1"])
        with self.assertRaisesRegex(deloco.ConfigError, "float32"):
            deloco.Learner(parameters=[("w", torch.zeros(3, dtype=torch.bfloat16))], config=self.config, learner_id=0)
        with self.assertRaisesRegex(ValueError, "not both"):
            deloco.Learner(model, parameters=[], config=self.config)
        cfg = deloco.read_config(self.config, ["train.steps=70"])
        self.assertEqual(cfg["train"]["steps"], 70)
        self.assertEqual(cfg["model"]["path"], self.model_path)

    def test_joins_in_place_trains_and_a_wrong_model_is_refused(self):
        run_dir = os.path.join(self.tmp.name, "run")
        log = open(os.path.join(self.tmp.name, "syncer.log"), "w")
        syncer = subprocess.Popen([BINARY, "syncer", "--config", self.config, "--out", run_dir], stdout=log,
                                  stderr=subprocess.STDOUT)
        try:
            # Another model (width 48): the syncer refuses it, and the constructor raises with the reason.
            with self.assertRaisesRegex(RuntimeError, "fingerprint"):
                deloco.Learner(tiny_llama(48), config=self.config, learner_id=0, out=run_dir)

            model = tiny_llama()  # same shapes; other values than the syncer's Θ (the saved module) after this:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
            saved = torch.jit.load(self.model_path).state_dict()
            before = {n: p.data_ptr() for n, p in model.named_parameters()}
            learner = deloco.Learner(model, config=self.config, learner_id=0, out=run_dir)
            # The join downloaded Θ and wrote it into the model's own tensors.
            for n, p in model.named_parameters():
                self.assertEqual(p.data_ptr(), before[n], n)
                self.assertTrue(torch.equal(p.detach(), saved[n]), n)
            # A forked child (as DataLoader workers are) dropping its copy neither says goodbye for the parent nor
            # touches the parent's comms thread: it exits cleanly, and the parent trains on below.
            pid = os.fork()
            if pid == 0:
                del learner
                gc.collect()
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            self.assertEqual(status, 0)
            with open(os.path.join(run_dir, "learner-0.jsonl")) as f:
                early = f.read()
            self.assertNotIn('"learner_done"', early)  # the child wrote no goodbye record into the parent's file
            self.assertEqual(learner.start_step, 0)
            self.assertEqual(learner.total_steps, 30)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            data = torch.randint(0, 256, (4, 17))
            steps = 0
            while not learner.done:
                loss = torch.nn.functional.cross_entropy(model(data[:, :-1]).reshape(-1, 256), data[:, 1:].reshape(-1))
                opt.zero_grad()
                loss.backward()
                opt.step()
                steps += 1
                learner.step(tokens=4 * 16, loss=loss.item())
            with self.assertRaisesRegex(RuntimeError, "after training ended"):
                learner.step(tokens=1)
            summary = learner.close()
            self.assertEqual(steps, 30)
            self.assertTrue(summary["finished"])
            self.assertGreaterEqual(summary["pushes"], 4)  # 2 fragments, each every 10 steps
            self.assertGreater(summary["broadcasts"], 0)
            self.assertEqual(syncer.wait(timeout=60), 0)
        finally:
            if syncer.poll() is None:
                syncer.kill()
            log.close()
        with open(os.path.join(run_dir, "learner-0.jsonl")) as f:
            kinds = [line.split('"kind":"')[1].split('"')[0] for line in f if '"kind":"' in line]
        self.assertIn("apply", kinds)
        self.assertEqual(kinds[-1], "learner_done")


if __name__ == "__main__":
    unittest.main(verbosity=2)
