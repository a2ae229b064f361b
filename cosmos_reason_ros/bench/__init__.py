"""Benchmarks: the ``bench`` command, its phases and statistics, the baseline node, ``soak``.

- ``runner``: the ``bench`` command line and the run (starts, phases in order, results);
  ``python -m cosmos_reason_ros.bench`` runs it.
- ``phases/``: one module per phase (latency, concurrency, second, cameras, ingest, memory,
  prefill, lifting, planning, fleet),
  each a ``run(bench, results)`` function.
- ``workload``: what is sent (modes, sizes, lengths, pictures, per-device engine settings);
  ``engine_side``, ``ros_side``, ``processes``: the three measured paths and their processes.
- ``results``, ``stats``, ``plots``: recording, the figures of ``docs/PERFORMANCE.md``, PNGs.
- ``baseline``: the HTTP-client baseline node; ``floor``: the transport floor (a bare rclpy
  action server laid out like the node's); ``soak``: the long-run leak and loss check.
"""
