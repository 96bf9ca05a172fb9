"""Downstream evaluation of trained checkpoints (HellaSwag)."""
