#!/usr/bin/env bash
# Issue 69's GPU figures on one CUDA GPU, one run at a time (the GPU to itself), in this order:
#   1. benchmarks.step_cost.shared_prompts --device cuda: the prompt-heavy shape at the full 0.5B size, bf16,
#      against padding-free and padded (fwd + bwd, peak memory, the kernels' share of the wall time)
#   2. benchmarks.step_cost.rollout_budget --device cuda: the main job's step with and without per-prompt budgets
#   3. benchmarks.accuracy.time_to_accuracy --device cuda: plain TRL and the recommended preset, one process per
#      seed (TTA_SEEDS), TTA_BUDGET seconds each
#   4. benchmarks.step_cost.shared_prompts --device cuda --micro-batches 8: the same shape as 1 with 8 prompts in
#      8 micro-batches of 8 rows, shared prompts on TRL's micro-batches and on whole groups (last: the least needed)
# Each part has its own time limit and writes its log under DIR; DIR is packed into TAR after each part, so a call
# cut short still returns what finished. Report the time-to-accuracy runs with
#   python -m benchmarks.accuracy.time_to_accuracy --merge DIR/tta-*.json
#
#   bash benchmarks/gpu/gpu_round3.sh DIR TAR   # from the repo root; ~9 min on an H100 with the defaults
#   DEVICE=cpu TTA_SEEDS=0 QUICK=--quick bash benchmarks/gpu/gpu_round3.sh DIR TAR   # a CPU smoke run (~1 min)
set -uo pipefail
source "$(dirname "$0")/gpu_parts.sh"  # dir, tar_path, pack, stamp
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}
TTA_SEEDS=${TTA_SEEDS:-0 1}
TTA_BUDGET=${TTA_BUDGET:-90}

{ nvidia-smi || true; python3 -c "import torch, trl, transformers, peft; print(torch.__version__, trl.__version__, \
transformers.__version__, peft.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
  nproc; } >"$dir/env.txt" 2>&1
python3 -c "from grpo_hub.tasks.chain_model import chain_model_path; print(chain_model_path())" >>"$dir/env.txt" 2>&1
stamp "env done"; pack

timeout 150 python3 -m benchmarks.step_cost.shared_prompts --device "$DEVICE" --skip-main-job --reps 10 \
  $QUICK >"$dir/shared_prompts.txt" 2>&1
stamp "shared_prompts exit $?"; pack

timeout 150 python3 -m benchmarks.step_cost.rollout_budget --device "$DEVICE" --reps 5 $QUICK \
  >"$dir/rollout_budget.txt" 2>&1
stamp "rollout_budget exit $?"; pack

for seed in $TTA_SEEDS; do
  timeout $((2 * TTA_BUDGET + 120)) python3 -m benchmarks.accuracy.time_to_accuracy --device "$DEVICE" \
    --configs trl,preset --seed-list "$seed" --budget "$TTA_BUDGET" $QUICK --json "$dir/tta-$seed.json" \
    >"$dir/tta-$seed.txt" 2>&1
  stamp "time_to_accuracy seed $seed exit $?"; pack
done

timeout 150 python3 -m benchmarks.step_cost.shared_prompts --device "$DEVICE" --skip-main-job --reps 5 \
  --prompts 8 --micro-batches 8 $QUICK >"$dir/whole_groups.txt" 2>&1
stamp "whole_groups exit $?"; pack
