"""Console entry points: node, query, replay, bench, demo, tiny model builder."""
