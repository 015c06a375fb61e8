"""What a run leaves behind and prints: the run record, the model card and reward curve every save and push writes,
and the console output. Read by the trainer (on save), the hub wing and the recipe."""
