"""Which model a name means: the model registry, example inputs, Hugging Face building, join networks."""
