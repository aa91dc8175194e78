"""The project's own evidence harness (the workload suite, sweeps, grids): run from a clone, never installed."""
