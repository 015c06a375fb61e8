"""grpo_hub.tasks.chain_machines: which CPU kinds' full builds the record keeps, which short build it matches, and
shipping a build."""

import pytest

from grpo_hub.tasks import chain_machines
from grpo_hub.tasks.build_trace import file_checksum
from grpo_hub.tasks.chain_machines import (
    ACCURACY_TOLERANCE,
    MACHINES_FILE,
    machine_for,
    read_machines,
    record_machine,
    reproduces,
)

STEPS_A, STEPS_B = {"0": "a0", "60": "a60"}, {"0": "b0", "60": "b60"}


@pytest.fixture
def shipped(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"shipped weights")
    return tmp_path


def trace(steps: dict, weights: str, digest: str = "d1") -> dict:
    return {"inputs_digest": digest, "steps": steps, "weights": weights}


def test_the_builder_kind_and_another_kind_within_tolerance_are_recorded(shipped):
    own = file_checksum(shipped / "model.safetensors")
    record_machine(shipped, "d1", trace(STEPS_A, own), 0.30, 0.30)
    entry = record_machine(shipped, "d1", trace(STEPS_B, "other"), 0.30 + ACCURACY_TOLERANCE - 1e-9, 0.30)
    machines = read_machines(shipped)
    assert machines["inputs_digest"] == "d1" and machines["weights"] == own and machines["heldout"] == 0.30
    assert [m["steps"] for m in machines["machines"]] == [STEPS_A, STEPS_B] and entry["weights"] == "other"
    assert machine_for(machines, STEPS_B) == entry and machine_for(machines, {"0": "a0", "60": "b60"}) is None
    assert "torch" in entry["cpu"] and all(reproduces(machines, m) for m in machines["machines"])


def test_a_kind_outside_the_tolerance_is_refused(shipped):
    with pytest.raises(ValueError, match=r"scores 0\.1500 held-out against the shipped 0\.3000"):
        record_machine(shipped, "d1", trace(STEPS_B, "other"), 0.15, 0.30)
    assert not (shipped / MACHINES_FILE).exists()


def test_a_new_digest_or_new_weights_start_a_new_record_and_a_kind_records_once(shipped):
    record_machine(shipped, "d1", trace(STEPS_A, "x"), 0.31, 0.30)
    record_machine(shipped, "d1", trace(STEPS_A, "x"), 0.32, 0.30)  # the same kind again: replaced
    assert [m["heldout"] for m in read_machines(shipped)["machines"]] == [0.32]
    record_machine(shipped, "d2", trace(STEPS_B, "y", "d2"), 0.30, 0.30)
    assert [m["steps"] for m in read_machines(shipped)["machines"]] == [STEPS_B]
    (shipped / "model.safetensors").write_bytes(b"new weights")
    record_machine(shipped, "d2", trace(STEPS_A, "z", "d2"), 0.30, 0.30)
    assert [m["steps"] for m in read_machines(shipped)["machines"]] == [STEPS_A]


def test_a_build_of_other_inputs_is_refused(shipped):
    with pytest.raises(ValueError, match="inputs digest is not today's"):
        record_machine(shipped, "d1", trace(STEPS_A, "x", digest="old"), 0.30, 0.30)


def test_reproduces_is_bits_or_accuracy():
    machines = {"weights": "w", "heldout": 0.30}
    assert reproduces(machines, {"weights": "w", "heldout": 0.0})  # bit for bit: accuracy not needed
    assert reproduces(machines, {"weights": "v", "heldout": 0.30 - ACCURACY_TOLERANCE})
    assert not reproduces(machines, {"weights": "v", "heldout": 0.30 - ACCURACY_TOLERANCE - 1e-6})


def test_shipping_replaces_the_shipped_folder_world_readable_and_records_it(tmp_path, monkeypatch):
    built, shipped_dir = tmp_path / "built", tmp_path / "shipped"
    built.mkdir()
    shipped_dir.mkdir()
    (shipped_dir / "stale.bin").write_bytes(b"old")
    (built / "model.safetensors").write_bytes(b"new weights")
    (built / "model.safetensors").chmod(0o600)  # a staging build's files are private
    recorded = []
    monkeypatch.setattr(chain_machines, "SHIPPED_DIR", shipped_dir)
    monkeypatch.setattr(
        chain_machines, "record_this_machine", lambda folder: recorded.append(folder) or {"cpu": "x"}
    )
    assert chain_machines.ship(built) == {"cpu": "x"} and recorded == [shipped_dir]
    assert sorted(p.name for p in shipped_dir.iterdir()) == ["model.safetensors"]
    assert (shipped_dir / "model.safetensors").stat().st_mode & 0o777 == 0o644
