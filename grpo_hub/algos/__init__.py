"""Pure formulas (torch only, no trl / transformers): advantages, policy losses, importance weights, row
selection. Each function cites its source; `tests/algos` checks each against a naive implementation."""
