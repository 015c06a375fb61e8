"""The surrogate registry: each registered loss and clip metric against a naive per-token version, every loss type the
own path computes has a per-token loss, and a new surrogate is one decorated function."""

import pytest
import torch

from grpo_hub.algos import loss_types, surrogates
from grpo_hub.algos.surrogates import Bounds


def random_tokens(seed: int, shape=(5, 7)):
    g = torch.Generator().manual_seed(seed)
    ratio = torch.exp(torch.randn(shape, generator=g) * 0.6)
    advantages = torch.randn(shape[0], 1, generator=g).expand(shape).clone()
    advantages[0] = 0.0  # a zero-advantage row: nothing is clipped, the loss is 0
    logp = -torch.rand(shape, generator=g) * 3
    return ratio, advantages, logp


def naive_ppo(r, a, low, high, dual):
    unclipped, clipped = r * a, min(max(r, 1 - low), 1 + high) * a
    loss = -min(unclipped, clipped)
    return min(loss, -dual * a) if dual is not None and a < 0 else loss


@pytest.mark.parametrize("dual", [None, 3.0])
@pytest.mark.parametrize("seed", range(3))
def test_ppo_clip_and_its_metrics_match_a_naive_loop(seed, dual):
    ratio, advantages, logp = random_tokens(seed)
    b = Bounds(0.2, 0.28, dual)
    loss = surrogates.SURROGATES["clip"].loss(ratio, advantages, logp, b)
    clipped = surrogates.SURROGATES["clip"].clipped(ratio, advantages, b)
    assert ("clip_ratio/dual_mean" in clipped) == (dual is not None)
    for i, j in torch.cartesian_prod(torch.arange(5), torch.arange(7)).tolist():
        r, a = ratio[i, j].item(), advantages[i, j].item()
        assert loss[i, j].item() == pytest.approx(naive_ppo(r, a, 0.2, 0.28, dual), rel=1e-5, abs=1e-6)
        low, high = r < 0.8 and a < 0, r > 1.28 and a > 0
        assert clipped["clip_ratio/low_mean"][i, j].item() == low
        assert clipped["clip_ratio/high_mean"][i, j].item() == high
        assert clipped["clip_ratio/region_mean"][i, j].item() == (low or high)
        if dual is not None:
            assert clipped["clip_ratio/dual_mean"][i, j].item() == (r > dual and a < 0)


@pytest.mark.parametrize("seed", range(3))
def test_cispo_and_its_metric_match_a_naive_loop(seed):
    ratio, advantages, logp = random_tokens(seed)
    b = Bounds(0.2, 1.5)
    loss = surrogates.SURROGATES["cispo"].loss(ratio, advantages, logp, b)
    capped = surrogates.SURROGATES["cispo"].clipped(ratio, advantages, b)
    for i, j in torch.cartesian_prod(torch.arange(5), torch.arange(7)).tolist():
        r, a, lp = ratio[i, j].item(), advantages[i, j].item(), logp[i, j].item()
        assert loss[i, j].item() == pytest.approx(-min(r, 1.5) * a * lp, rel=1e-5, abs=1e-6)
        assert capped["cispo_clip_ratio"][i, j].item() == (r > 1.5 and a > 0)


def test_every_loss_type_the_own_path_computes_has_a_per_token_loss_and_metrics():
    for name in loss_types.OWN_PATH_NAMES:
        surrogate = loss_types.REGISTRY[name].surrogate
        assert surrogate.loss is not None and surrogate.clipped is not None, name
    assert {s.name for s in surrogates.SURROGATES.values() if s.dual_clip} == {"clip"}
    assert {s.name for s in surrogates.SURROGATES.values() if s.absolute_cap} == {"cispo"}


def test_a_new_surrogate_is_one_decorated_function(monkeypatch):
    monkeypatch.setattr(surrogates, "SURROGATES", dict(surrogates.SURROGATES))

    @surrogates.register_surrogate("plain", clipped=lambda r, a, b: {})
    def plain(ratio, advantages, logp, b):
        return -ratio * advantages

    assert surrogates.SURROGATES["plain"].loss is plain
    with pytest.raises(ValueError, match="registered twice"):
        surrogates.register_surrogate("plain", clipped=lambda r, a, b: {})(plain)


def test_variant_names_and_citations_come_from_the_entries():
    assert loss_types.variant_name("grpo", "sequence") == "gspo"
    assert loss_types.variant_name("grpo", "token") == "grpo"
    assert loss_types.variant_name("dapo", "sequence") == "dapo"  # no sequence-level preset of dapo
    cited = {name for name, entry in loss_types.REGISTRY.items() if entry.citation}
    assert {"grpo", "dapo", "dr_grpo", "gspo", "cispo"} <= cited
