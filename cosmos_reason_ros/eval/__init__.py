"""Offline evaluation: replay of recordings, scenarios, scoring, bag I/O, reports, demo data."""
