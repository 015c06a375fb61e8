"""`python -m spaces_app [--host H] [--port P]`: the same as `grpo-hub compare` (serves on 127.0.0.1)."""

import sys

from grpo_hub.cli import main

sys.exit(main(["compare", *sys.argv[1:]]))
