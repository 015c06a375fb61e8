"""TRL's scoring forward against the training forward + backward of the same generation batch.

With vLLM and `vllm_importance_sampling_correction`, TRL 1.16 runs a no-grad forward over the whole generation batch
to get `old_per_token_logps`, in chunks of `per_device_train_batch_size` rows (`_generate_and_score_completions`),
even on-policy, where they equal the training forward's detached log-probs (huggingface/trl#5412). This benchmark
prices that pass next to the rest of a step, so the share a step saves without it is measured, not reasoned:

    scoring   = TRL's `_get_per_token_logps_and_entropies` under no_grad over the batch, in TRL's chunks
    training  = the same method with entropies (as TRL's loss calls it) + backward, micro-batch by micro-batch
    generate  = HF `generate` of the batch's completions (every row runs to `--completion-length`)

One plain `trl.GRPOTrainer` supplies the method (its autocast, temperature and fused LM head). Timed: median of
`--reps` after a warm-up; CUDA: wall time after `torch.cuda.synchronize`, CPU: process CPU time on one thread. The
optimizer step is left out (a few ms next to these on a GPU).

    python -m benchmarks.step_cost.scoring_forward --device cuda   # bf16, Qwen2.5-0.5B, 64 rows x (32 + 256) tokens
    python -m benchmarks.step_cost.scoring_forward --quick         # CPU smoke run, tiny model (numbers are noise)
"""

import argparse
import statistics
import tempfile
import time

import torch

from benchmarks.common import (
    DEVICES,
    GROUP_SIZE,
    TINY_SHAPE,
    TRL,
    build_trainer,
    group_position_reward,
    grpo_args,
    load_tokenizer,
    print_table,
    random_model,
    use_device,
    zero_signal_dataset,
)
from benchmarks.step_cost.filtering import build_model


def clock(device: str) -> float:
    """CPU: process CPU seconds; CUDA: wall seconds once the queued kernels have run."""
    if device == "cpu":
        return time.process_time()
    torch.cuda.synchronize()
    return time.perf_counter()


def median_seconds(work, reps: int, device: str) -> float:
    """Median seconds of `reps` calls of `work` after one warm-up call."""
    work()
    times = []
    for _ in range(reps):
        start = clock(device)
        work()
        times.append(clock(device) - start)
    return statistics.median(times)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--rows", type=int, default=64, help="rows of the generation batch")
    parser.add_argument("--batch", type=int, default=16, help="per_device_train_batch_size (rows per chunk)")
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--completion-length", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--generate-reps", type=int, default=1, help="0: leave generation out")
    parser.add_argument("--quick", action="store_true", help="CPU, tiny model, 8 rows x (8 + 8) tokens")
    cli = parser.parse_args(argv)
    if cli.quick:
        cli.rows, cli.batch, cli.prompt_length, cli.completion_length, cli.reps = 8, 4, 8, 8, 2
    if cli.rows % cli.batch:
        parser.error(f"--rows {cli.rows} must be a multiple of --batch {cli.batch}")
    return cli


def main(argv=None) -> None:
    cli = parse_args(argv)
    use_device(cli.device)
    if cli.quick:
        tokenizer = load_tokenizer()
        model = random_model(tokenizer, TINY_SHAPE)
        shape = "tiny"
    else:
        model, tokenizer = build_model("qwen2.5-0.5b", cli.device)
        shape = "Qwen2.5-0.5B shape" + (", bf16" if cli.device == "cuda" else ", fp32")
    with tempfile.TemporaryDirectory() as out_dir:
        args = grpo_args(
            TRL,
            out_dir,
            cli.device,
            per_device_train_batch_size=cli.batch,
            gradient_accumulation_steps=cli.rows // cli.batch,
            max_completion_length=cli.completion_length,
            num_generations=GROUP_SIZE,
        )
        dataset = zero_signal_dataset(0.0, cli.rows // GROUP_SIZE, batches=1)
        trainer = build_trainer(
            TRL, args, model=model, reward_funcs=[group_position_reward], train_dataset=dataset,
            processing_class=tokenizer,
        )  # fmt: skip
        seconds = measure(trainer, tokenizer, cli)
    ms = {part: 1000 * s for part, s in seconds.items()}
    print(
        f"{cli.device}, {shape}, {cli.rows} rows x ({cli.prompt_length} prompt + {cli.completion_length} "
        f"completion) tokens, chunks / micro-batches of {cli.batch} rows; median of {cli.reps} (generate: "
        f"{cli.generate_reps}); {'process CPU' if cli.device == 'cpu' else 'wall, cuda synchronized'} ms"
    )
    step = sum(ms.values())
    rows = [
        [part, f"{value:.1f}", f"{value / step:.3f}" if "generate" in ms else "-"]
        for part, value in ms.items()
    ]
    print_table(["part of one generation batch", "ms", "share of the step"], rows)
    print(
        f"\nscoring / (training forward + backward) = {ms['scoring'] / ms['training']:.3f}; scoring / rest of the "
        f"step after generation = {ms['scoring'] / (ms['scoring'] + ms['training']):.3f}"
    )
    if cli.device == "cuda":
        print(f"peak memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")


def measure(trainer, tokenizer, cli) -> dict[str, float]:
    """{"generate"?, "scoring", "training"}: median seconds of each part for one generation batch."""
    model, device = trainer.model, cli.device
    generator = torch.Generator().manual_seed(0)
    length = cli.prompt_length + cli.completion_length
    ids = torch.randint(len(tokenizer), (cli.rows, length), generator=generator).to(model.device)
    mask = torch.ones_like(ids)
    keep = cli.completion_length

    def scoring():
        with torch.no_grad():
            trainer._get_per_token_logps_and_entropies(model, ids, mask, keep, batch_size=cli.batch)

    def training():
        for start in range(0, cli.rows, cli.batch):
            rows = slice(start, start + cli.batch)
            logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
                model, ids[rows], mask[rows], keep, compute_entropy=True
            )
            (-logps.float().mean()).backward()
        model.zero_grad(set_to_none=True)

    def generate():
        prompts = ids[:, : cli.prompt_length]
        with torch.no_grad():
            model.generate(
                input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0,
                max_new_tokens=cli.completion_length, min_new_tokens=cli.completion_length,
                pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip

    model.train()
    seconds = {}
    if cli.generate_reps:
        seconds["generate"] = median_seconds(generate, cli.generate_reps, device)
    seconds["scoring"] = median_seconds(scoring, cli.reps, device)
    seconds["training"] = median_seconds(training, cli.reps, device)
    return seconds


if __name__ == "__main__":
    main()
