"""Generation on vLLM: the colocate runtime, adapter-only sync, the server client and its syncs, the local server
process, and asynchronous rollouts. Below `training`: the trainer wires these in, nothing here knows TRL's trainer."""
