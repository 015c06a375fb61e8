"""Adapters given as Hub specs 'owner/name@revision', served by the local Hub test server of tests/hub."""

import pytest

from grpo_hub import compare as C
from tests.hub.conftest import ALICE, TOKENS, point_client_at
from tests.hub.fake_hub import FakeHub

pytestmark = pytest.mark.hub
PROMPT = "Write only digits: 3"


def test_hub_spec_loads_the_pushed_adapter(tiny_model_dir, random_adapter, tmp_path, monkeypatch):
    from grpo_hub.hub import push_adapter

    with FakeHub(TOKENS) as hub:
        point_client_at(monkeypatch, hub.url, tmp_path / "hf_home")
        push_adapter(random_adapter, "alice/space-lora", revision="v1", token=ALICE)
        from_hub = C.compare(
            C.ModelBank(tiny_model_dir, ("alice/space-lora@v1",)), PROMPT, C.Sampling(n=2), []
        )
        with pytest.raises(C.CompareError, match="unknown adapter 'alice/space-lora@v2'"):
            C.resolve_adapter("alice/space-lora@v2")
        with pytest.raises(C.CompareError, match="unknown adapter 'alice/no-such-lora'"):
            C.resolve_adapter("alice/no-such-lora")
    local = C.compare(C.load_bank(tiny_model_dir, (random_adapter,)), PROMPT, C.Sampling(n=2), [])
    assert from_hub[1].label == "alice/space-lora@v1"
    assert [c.completions for c in from_hub] == [c.completions for c in local]
