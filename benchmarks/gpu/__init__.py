"""GPU runs: the recipe under every accelerate config, and the scripts that take the GPU figures."""
