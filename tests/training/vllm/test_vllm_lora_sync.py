"""`vllm_adapter_sync`'s pure parts: the refusals, the rank bound, the adapter tensor names, the engine's LoRA module
names, and the refusals a trainer makes before any engine starts. No vLLM needed (the engine runs: test_vllm_colocate)."""

import contextlib

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from grpo_hub import GRPOHubTrainer
from grpo_hub.generation import adapter_sync as sync
from grpo_hub.tasks import SMOKE_TASK, get_reward_funcs, load_task_dataset
from tests.helpers import tiny_config

FIELD = "`vllm_adapter_sync`"


def plain_lora(**overrides) -> LoraConfig:
    return LoraConfig(**{"r": 16, "lora_alpha": 32, "target_modules": "all-linear", **overrides})


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"use_dora": True}, "use_dora"),
        ({"bias": "lora_only"}, "bias"),
        ({"bias": "all"}, "bias"),
        ({"lora_bias": True}, "lora_bias"),
        ({"target_parameters": ["mlp.experts.gate_up_proj"]}, "target_parameters"),
        ({"layer_replication": [(0, 1)]}, "layer_replication"),
        ({"init_lora_weights": "pissa"}, "init_lora_weights"),
        ({"init_lora_weights": "olora"}, "init_lora_weights"),
    ],
)
def test_what_vllm_cannot_serve_is_refused_naming_the_field_and_the_fix(overrides, named):
    with pytest.raises(ValueError, match=FIELD) as error:
        sync.check_servable(plain_lora(**overrides), [])
    assert named in str(error.value) and "Fix:" in str(error.value)


@pytest.mark.parametrize("init", [True, False, "gaussian", "eva", "orthogonal"])
def test_plain_lora_is_servable(init):
    sync.check_servable(plain_lora(init_lora_weights=init), [])  # raises nothing


def test_a_non_lora_peft_type_is_refused():
    from peft import IA3Config

    with pytest.raises(ValueError, match=f"{FIELD}: vLLM serves LoRA adapters only, got PEFT type IA3"):
        sync.check_servable(IA3Config(target_modules=["q_proj"]), [])


def test_head_or_embedding_targets_are_refused(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft = get_peft_model(model, plain_lora(target_modules=["q_proj", "embed_tokens"]))
    targets = sync.head_targets(peft)
    assert [name.rsplit(".", 1)[-1] for name in targets] == ["embed_tokens"]
    with pytest.raises(ValueError, match=f"{FIELD}.*embeddings or the LM head"):
        sync.check_servable(peft.peft_config["default"], targets)
    plain = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), plain_lora())
    assert sync.head_targets(plain) == []  # all-linear leaves the (tied) head alone


def naive_served_rank(largest: int) -> int:
    return min(bound for bound in (1, 8, 16, 32, 64, 128, 256, 320, 512) if bound >= largest)


@pytest.mark.parametrize(
    ("rank", "pattern"),
    [
        (1, None),
        (2, None),
        (4, {}),
        (8, None),
        (9, None),
        (16, None),
        (4, {"q_proj": 32}),
        (300, None),
        (512, None),
    ],
)
def test_served_rank_is_the_smallest_vllm_bound_above_every_rank(rank, pattern):
    assert sync.served_rank(rank, pattern) == naive_served_rank(max([rank, *(pattern or {}).values()]))


def test_a_rank_above_vllms_largest_bound_is_refused():
    with pytest.raises(ValueError, match=f"{FIELD}.*513"):
        sync.served_rank(8, {"down_proj": 513})


def test_adapter_tensors_carry_peft_saved_names_of_the_trained_adapter_only(tiny_model_dir):
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), plain_lora())
    peft.add_adapter("ref", plain_lora(r=4))
    params = sync.adapter_parameters(peft.named_parameters(), "default")
    saved = get_peft_model_state_dict(peft, adapter_name="default")  # PEFT's own saved-adapter names
    assert set(params) == set(saved) and len(params) > 0
    assert all(params[name].shape == saved[name].shape for name in saved)
    assert (
        sync.adapter_tensor_name("base_model.model.model.layers.0.mlp.up_proj.base_layer.weight", "default")
        is None
    )
    assert sync.adapter_tensor_name("x.q_proj.lora_A.ref.weight", "default") is None


def test_engine_lora_modules_expand_packed_layers():
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    modules = [
        "model.layers.0.self_attn.qkv_proj",
        "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate_up_proj",
    ]
    assert sync.engine_lora_modules(modules, packed) == {
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.v_proj",
        "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate_proj",
        "model.layers.0.mlp.up_proj",
    }


def test_engine_lora_kwargs_bound_the_rank():
    assert sync.engine_lora_kwargs(plain_lora(r=4)) == {
        "enable_lora": True,
        "max_lora_rank": 8,
        "max_loras": 1,
    }


def trainer_with(tmp_path, model, peft_config):
    return GRPOHubTrainer(
        model=model,
        peft_config=peft_config,
        reward_funcs=get_reward_funcs(SMOKE_TASK),
        args=tiny_config(tmp_path, use_vllm=True, vllm_adapter_sync=True),
        train_dataset=load_task_dataset(SMOKE_TASK, n=8, seed=0),
    )


def test_a_model_without_peft_is_refused_before_the_engine_starts(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match=f"{FIELD}: syncs a PEFT adapter.*Fix: pass peft_config"):
        trainer_with(tmp_path, tiny_model_dir, None)


def test_an_unservable_adapter_is_refused_before_the_engine_starts(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match=f"{FIELD}: use_dora=True"):
        trainer_with(tmp_path, tiny_model_dir, plain_lora(use_dora=True))
    wrapped = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), plain_lora(bias="all"))
    with pytest.raises(ValueError, match=f"{FIELD}: bias='all'"):
        trainer_with(tmp_path, wrapped, None)


@pytest.mark.parametrize(
    ("overrides", "other"),
    [
        ({"vllm_mode": "server", "vllm_server_sync": "merged"}, "vllm_server_sync"),
        ({"vllm_enable_sleep_mode": True}, "vllm_enable_sleep_mode"),
    ],
)
def test_a_merged_server_sync_and_sleep_mode_are_refused_at_config_time(tmp_path, overrides, other):
    with pytest.raises(ValueError, match=f"{FIELD} with `{other}`.*Fix:"):
        tiny_config(tmp_path, use_vllm=True, vllm_adapter_sync=True, **overrides)


def test_in_server_mode_it_means_the_adapter_server_sync(tmp_path):
    config = tiny_config(tmp_path, use_vllm=True, vllm_adapter_sync=True, vllm_mode="server")
    assert config.vllm_server_sync == "adapter"


def test_without_vllm_the_field_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=f"{FIELD}: is set to True but has no effect without use_vllm=True"):
        tiny_config(tmp_path, vllm_adapter_sync=True)


def test_gathered_adapter_gathers_the_trained_adapter_only_and_copies_it(tiny_model_dir):
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), plain_lora())
    peft.add_adapter("ref", plain_lora(r=4))
    gathered = []

    @contextlib.contextmanager
    def recording_gather(params):
        gathered.append(params)
        yield

    tensors = sync.gathered_adapter(peft, "default", recording_gather)
    expected = sync.adapter_parameters(peft.named_parameters(), "default")
    assert len(gathered) == 1 and {id(p) for p in gathered[0]} == {id(p) for p in expected.values()}
    assert set(tensors) == set(expected)
    name, param = next(iter(expected.items()))
    with torch.no_grad():
        param.add_(1.0)
    assert not torch.equal(tensors[name], param)  # a copy: the engine's adapter does not move with training
