"""The selective rollout benchmark's per-epoch evaluation is off the clock and does not change training."""

import pytest

from benchmarks.accuracy import selective_rollout
from benchmarks.accuracy.rollout_tasks import TASKS

pytestmark = pytest.mark.slow


def test_evaluating_every_epoch_leaves_training_unchanged(monkeypatch):
    task = TASKS["synthetic"](16)
    model_dir = task.build_model()
    every_epoch = selective_rollout.run(model_dir, task, "greso", seed=0, epochs=2)
    assert [p[4] for p in every_epoch["points"]][0] == 0 and len(every_epoch["points"]) == 3

    def evaluate_at_the_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        self._evaluate(model, processing_class, state.global_step)

    monkeypatch.setattr(selective_rollout.Meter, "on_epoch_end", lambda *args, **kwargs: None)
    monkeypatch.setattr(selective_rollout.Meter, "on_train_end", evaluate_at_the_end, raising=False)
    at_the_end = selective_rollout.run(model_dir, task, "greso", seed=0, epochs=2)
    assert len(at_the_end["points"]) == 2
    for key in ("rows", "steps", "accuracy", "selective"):
        assert at_the_end[key] == every_epoch[key], key
