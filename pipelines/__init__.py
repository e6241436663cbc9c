"""Runnable Beam pipelines: ``python -m pipelines.convert``."""
