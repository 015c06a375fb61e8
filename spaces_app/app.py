"""Hugging Face Space entry point: the comparison UI of `grpo_hub.compare.space` (configuration there)."""

from grpo_hub.compare.space import main

if __name__ == "__main__":
    main()
