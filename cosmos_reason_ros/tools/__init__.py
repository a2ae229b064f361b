"""Thin console entry points: query, demo, tiny_model (replay is in eval/, bench in bench/)."""
