"""Settings: GRPOHubConfig and everything that says what a setting may be. One row per feature (its switch, seams,
tags and checks), the conflicts derived from the tags, the two phases (resolve, then validate), the ranges of TRL's
and transformers' fields, the vLLM rules, the supported TRL versions, and the recipe's flag and YAML handling. No
module here imports the trainer."""
