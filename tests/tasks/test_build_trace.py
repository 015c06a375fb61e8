"""grpo_hub.tasks.build_trace: state checksums equal exactly when the states are bit-equal; the inputs digest moves
with each input it covers."""

import hashlib
import importlib.util
import random

import pytest
import torch

from grpo_hub.tasks.build_trace import (
    StepRecorder,
    file_checksum,
    inputs_digest,
    read_trace,
    state_checksum,
    write_trace,
)

INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def naive_equal(a: dict, b: dict) -> bool:
    """Bit equality of two states, tensor by tensor, through same-width integer views (NaN payloads and -0.0
    included)."""

    def bits(t):
        return t.view(INT_VIEW[t.element_size()])

    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(bits(a[k]), bits(b[k]))
        for k in a
    )


def random_state(rng: random.Random) -> dict:
    dtypes = [torch.float32, torch.bfloat16, torch.int64, torch.float16]
    shapes = [(), (1,), (3,), (2, 3), (4, 1, 2)]
    return {
        f"w{i}": (torch.randn(rng.choice(shapes)) * 3).to(rng.choice(dtypes))
        for i in range(rng.randint(1, 4))
    }


def perturbed(state: dict, rng: random.Random) -> dict:
    """`state` with one change: a flipped bit, a renamed tensor, another dtype or another shape."""
    out = {k: v.clone() for k, v in state.items()}
    name = rng.choice(sorted(out))
    kind = rng.choice(["bit", "name", "dtype", "shape"])
    tensor = out[name]
    if kind == "bit" and tensor.numel():
        raw = tensor.reshape(-1).view(torch.uint8)
        raw[rng.randrange(raw.numel())] ^= 1 << rng.randrange(8)
    elif kind == "name":
        out[name + "_"] = out.pop(name)
    elif kind == "dtype":
        out[name] = tensor.to(torch.float64)
    else:
        out[name] = tensor.reshape(-1, 1) if tensor.dim() != 2 else tensor.reshape(-1)
    return out


def test_checksums_are_equal_exactly_when_the_states_are_bit_equal():
    rng = random.Random(0)
    torch.manual_seed(0)
    for _ in range(300):
        state = random_state(rng)
        shuffled = dict(reversed(list(state.items())))  # insertion order does not matter
        assert (
            state_checksum(state)
            == state_checksum(shuffled)
            == state_checksum({k: v.clone() for k, v in state.items()})
        )
        other = perturbed(state, rng)
        assert (state_checksum(other) == state_checksum(state)) == naive_equal(other, state)
    zero, negative_zero = {"w": torch.tensor([0.0])}, {"w": torch.tensor([-0.0])}
    assert state_checksum(zero) != state_checksum(negative_zero)  # equal values, other bits
    assert state_checksum({}) == hashlib.sha256().hexdigest()


def test_the_recorder_keeps_the_steps_asked_for():
    model = torch.nn.Linear(2, 2)
    recorder = StepRecorder([0, 2])
    snapshots = {}
    for step in range(4):
        with torch.no_grad():
            model.weight.add_(1.0)
        recorder(step, model)
        snapshots[step] = {k: v.clone() for k, v in model.state_dict().items()}
    assert recorder.checksums == {str(s): state_checksum(snapshots[s]) for s in (0, 2)}
    assert state_checksum(snapshots[1]) != recorder.checksums["0"]


def test_a_written_trace_reads_back(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"weights")
    write_trace(tmp_path, "abc", {"0": "x"}, "w.bin")
    assert read_trace(tmp_path) == {
        "inputs_digest": "abc",
        "steps": {"0": "x"},
        "weights": hashlib.sha256(b"weights").hexdigest(),
    }
    assert file_checksum(tmp_path / "w.bin") == hashlib.sha256(b"weights").hexdigest()
    with pytest.raises(FileNotFoundError):
        read_trace(tmp_path / "none")


def _module(path, source: str):
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("trace_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_inputs_digest_moves_with_each_input(tmp_path, monkeypatch):
    module = _module(tmp_path / "a.py", "X = 1\n")
    base = inputs_digest({"steps": 3}, [module], "{}")
    assert inputs_digest({"steps": 3}, [module], "{}") == base
    assert inputs_digest({"steps": 4}, [module], "{}") != base  # the recipe
    assert (
        inputs_digest({"steps": 3}, [_module(tmp_path / "b.py", "X = 1  # edited\n")], "{}") != base
    )  # code
    assert inputs_digest({"steps": 3}, [module], '{"v": 1}') != base  # the tokenizer
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert inputs_digest({"steps": 3}, [module], "{}") != base  # torch's version
