"""The documents memplan reads and writes: YAML and JSON text, parsed within limits."""
