"""Measure what a plan needs: probes, allocator peaks, timing, bandwidth, conditions, tensor-level runs."""
