"""Hydra launcher that runs a multirun's jobs concurrently on one Ray cluster (``hydra/launcher=contamray``)."""
