"""Estimate GPU times from operator counts (a roofline per aten operator)."""
