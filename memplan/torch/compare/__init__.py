"""memplan's plans against the ways users already train in less memory, on real steps."""
