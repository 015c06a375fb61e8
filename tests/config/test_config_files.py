"""grpo_hub/config/config_files.py: a recipe YAML extends its parent and states only what differs."""

import pytest

from grpo_hub.config.config_files import read_config


def test_a_child_overrides_its_parents_keys_along_the_chain(tmp_path):
    (tmp_path / "a.yaml").write_text("learning_rate: 1.0e-3\nmax_steps: 200\ntask: chain\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yaml").write_text("base: ../a.yaml\nmax_steps: 100\n")
    (tmp_path / "sub" / "c.yaml").write_text("base: b.yaml\ndynamic_sampling: true\n")
    assert read_config(tmp_path / "sub" / "c.yaml") == {
        "learning_rate": 1e-3,
        "max_steps": 100,
        "task": "chain",
        "dynamic_sampling": True,
    }
    assert read_config(tmp_path / "a.yaml") == {"learning_rate": 1e-3, "max_steps": 200, "task": "chain"}


def test_a_missing_parent_a_cycle_and_a_non_mapping_are_named(tmp_path):
    (tmp_path / "x.yaml").write_text("base: nowhere.yaml\n")
    with pytest.raises(ValueError, match="names no file"):
        read_config(tmp_path / "x.yaml")
    (tmp_path / "p.yaml").write_text("base: q.yaml\n")
    (tmp_path / "q.yaml").write_text("base: p.yaml\n")
    with pytest.raises(ValueError, match="cycle"):
        read_config(tmp_path / "p.yaml")
    (tmp_path / "l.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="mapping"):
        read_config(tmp_path / "l.yaml")
