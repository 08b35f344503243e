"""deloco for PyTorch: a training loop of your own as a Decoupled DiLoCo learner (docs/python.md).

    import deloco
    learner = deloco.Learner(model, config="run.toml", learner_id=1,
                             connect="tcp://syncer:5555", secret_key="keys/learner-1.key",
                             syncer_key="keys/syncer.pub")
    while not learner.done:
        loss = ...; loss.backward(); optimizer.step(); optimizer.zero_grad()
        learner.step(tokens=batch_tokens, loss=loss.item())
    learner.close()

Under `deloco run --learner-command N=CMD` every argument but the model comes from the environment
(DELOCO_CONFIG, DELOCO_SET, DELOCO_LEARNER_ID, DELOCO_SYNCER, DELOCO_SECRET_KEY, DELOCO_SERVER_KEY, DELOCO_OUT).
The runtime is deloco's C++ one: its comms thread, its learner core, its wire protocol, so Python and C++ learners
mix in one run.
"""
import json as _json
import math as _math

import torch as _torch  # loads libtorch before the extension that links it

from ._deloco import ConfigError, IoError, _Learner, _read_config

__all__ = ["Learner", "read_config", "ConfigError", "IoError"]


def read_config(config=None, set=()):
    """The run's config as a Learner with these arguments would see it, {"section": {"key": value}}, without
    joining: read it first to build the model and the data (model.path, data.path, train.batch_size)."""
    if isinstance(set, str):
        set = [set]
    return _json.loads(_read_config(config or "", [str(s) for s in set]))


class Learner:
    """One learner of a deloco run whose inner steps your loop trains.

    Constructing it joins the run: it waits (up to net.join_timeout) for the syncer's global parameters and writes
    them into the model's parameters in place. Then call step() after each optimizer step. step() may change the
    parameters in place (a merged fragment arrives); never replace them (model.to() after joining, or
    `param.data = ...`), since deloco holds the tensors it was given.

    model: a torch.nn.Module whose named_parameters() are the run's model (the same names, order and float32
    shapes); or parameters=[(name, tensor), ...] instead.
    config: the run's config (TOML, or RUN/config.json); sets: ["section.key=value", ...] overrides.
    Any argument left None comes from the environment, as for `deloco learner`.
    """

    def __init__(self, model=None, *, parameters=None, config=None, set=(), learner_id=None, connect=None,
                 secret_key=None, syncer_key=None, out=None):
        if (model is None) == (parameters is None):
            raise ValueError("give the model, or parameters=[(name, tensor), ...], not both")
        named = list(model.named_parameters()) if model is not None else list(parameters)
        # detach(): the same storage, outside autograd; deloco writes merged values into it.
        params = [(str(n), p.detach()) for n, p in named]
        if isinstance(set, str):
            set = [set]
        self._impl = _Learner(params, config or "", [str(s) for s in set],
                              -1 if learner_id is None else int(learner_id), connect or "", secret_key or "",
                              syncer_key or "", out or "")
        self._summary = None

    def step(self, tokens, loss=None):
        """One inner step was trained on `tokens` tokens (loss: its training loss, for the records).

        Returns whether to train another step: False once train.steps are done or stop() was called."""
        loss = float("nan") if loss is None else float(loss)
        return self._impl.step(int(tokens), loss)

    def stop(self):
        """Ask training to end: the next step() returns False (safe from a signal handler or another thread)."""
        self._impl.stop()

    def close(self):
        """Say goodbye to the syncer ("done" after train.steps, else "stop"); returns the learner's summary."""
        if self._summary is None:
            self._summary = _json.loads(self._impl.close())
        return self._summary

    @property
    def done(self):
        """True once train.steps were trained, stop() was called, or the learner was closed."""
        return self._impl.done

    @property
    def start_step(self):
        """The step to train next after the join: a restarted learner resumes where the syncer says it was."""
        return self._impl.start_step

    @property
    def steps_done(self):
        return self._impl.steps_done

    @property
    def total_steps(self):
        """train.steps of the run's config."""
        return self._impl.total_steps

    @property
    def learner_id(self):
        return self._impl.learner_id

    @property
    def config(self):
        """The run's config as this learner sees it: {"section": {"key": value}}."""
        return _json.loads(self._impl.config_json)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
