"""The host runtime: the loaded model's stages, batching, reading ahead, the pipeline, live streams."""
