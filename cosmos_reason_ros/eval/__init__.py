"""Offline evaluation: replay, scenarios, scoring, bag I/O, reports, demo data, tiny models."""
