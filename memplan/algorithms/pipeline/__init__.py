"""Pipelined model parallelism under memory limits (papers/001)."""
