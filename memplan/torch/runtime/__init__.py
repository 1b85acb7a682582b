"""Run training under a plan: the planned iteration, transfers, recomputation, selective policies."""
