"""Reading what comes from outside: audio, checkpoints, their configs, the tokenizer."""
