"""`transcribe serve`: the engine process, its HTTP workers, OpenAI's API shapes, metrics."""
