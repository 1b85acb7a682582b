"""Profile a model: orchestrate linearizing, measuring and estimating into a memplan profile."""
