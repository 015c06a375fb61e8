#!/usr/bin/env bash
# Every GPU figure of docs/benchmarks.md in one call on one CUDA GPU (~9 min on an H100), in this order:
#   1. benchmarks.step_cost.scoring_forward: TRL's no-grad scoring forward against training forward + backward
#      and generate
#   2. benchmarks.step_cost.filtering at f = 0.5 (3 repetitions): filtering + packing against plain TRL,
#      Qwen2.5-0.5B shape
#   3. at the same time (their wall clocks share the machine alike): benchmarks.accuracy.time_to_accuracy on the
#      GPU, one process per (configuration, seed), each on its own CPU core; and benchmarks.gpu.gpu_check, 4 runs
#      at a time
#   4. benchmarks.step_cost.filtering at f = 0.75 (2 repetitions)
# Each part has its own time limit and writes its log under DIR; DIR is packed into TAR after each part, so a call
# cut short still returns what finished. Report the time-to-accuracy runs with
#   python -m benchmarks.accuracy.time_to_accuracy --merge DIR/tta-*.json
#
#   bash benchmarks/gpu/gpu_figures.sh DIR TAR   # from the repo root; wheels of ../shared/gpu/prepare.sh in .whl
set -uo pipefail
source "$(dirname "$0")/gpu_parts.sh"  # dir, tar_path, pack, stamp
TTA_CONFIGS=${TTA_CONFIGS:-trl preset dynamic}
TTA_SEEDS=${TTA_SEEDS:-0 1}
TTA_BUDGET=${TTA_BUDGET:-120}

{ nvidia-smi; python3 -c "import torch, trl, transformers, peft, deepspeed, accelerate; \
print(torch.__version__, trl.__version__, transformers.__version__, peft.__version__, deepspeed.__version__, \
accelerate.__version__, torch.cuda.get_device_name())"; nproc; } >"$dir/env.txt" 2>&1
# the offline models once, before any parallel run reads them
python3 -c "from grpo_hub.tasks import build_tiny_model; from grpo_hub.tasks.chain_model import chain_model_path; \
print(build_tiny_model(), chain_model_path())" >>"$dir/env.txt" 2>&1
stamp "env done"; pack

timeout 120 python3 -m benchmarks.step_cost.scoring_forward --device cuda >"$dir/scoring_forward.txt" 2>&1
stamp "scoring_forward exit $?"; pack

timeout 200 python3 -m benchmarks.step_cost.filtering --device cuda --reps 3 --steps 1 --zero-fraction 0.5 \
  >"$dir/filtering-f0.5.txt" 2>&1
stamp "filtering f=0.5 exit $?"; pack

core=2
pids=()
for seed in $TTA_SEEDS; do
  for config in $TTA_CONFIGS; do
    timeout 300 python3 -m benchmarks.accuracy.time_to_accuracy --device cuda --configs "$config" \
      --seed-list "$seed" --budget "$TTA_BUDGET" --core "$core" --json "$dir/tta-$config-$seed.json" \
      >"$dir/tta-$config-$seed.txt" 2>&1 &
    pids+=($!)
    core=$((core + 1))
  done
done
timeout 280 python3 -m benchmarks.gpu.gpu_check --jobs 4 --timeout 200 >"$dir/gpu_check.txt" 2>&1
stamp "gpu_check exit $?"
for pid in "${pids[@]}"; do wait "$pid"; stamp "time_to_accuracy pid $pid exit $?"; done
pack

timeout 170 python3 -m benchmarks.step_cost.filtering --device cuda --reps 2 --steps 1 --zero-fraction 0.75 \
  >"$dir/filtering-f0.75.txt" 2>&1
stamp "filtering f=0.75 exit $?"; pack
