"""Plans exported to other tools' formats (no heavy imports here)."""
