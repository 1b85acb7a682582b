"""Pipelined model parallelism under memory limits (Pipelined Model Parallelism, Euro-Par 2021)."""
