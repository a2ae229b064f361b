"""Thin console entry points: query, demo (replay and tiny_model are in eval/, bench in bench/)."""
