"""Run under `accelerate launch`: print the line of `use_machine_cores(1)` and torch's thread count after it."""

import torch

from grpo_hub.config.cpu_threads import use_machine_cores

if __name__ == "__main__":
    print(use_machine_cores(1))
    print(f"threads now {torch.get_num_threads()}")
