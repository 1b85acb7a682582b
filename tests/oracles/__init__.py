"""Independent oracles the tests compare the solvers against (written from docs/model.md only)."""
