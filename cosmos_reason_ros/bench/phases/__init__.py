"""The bench's phases, one module each; each has ``run(bench, results)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cosmos_reason_ros.bench.phases import (
    cameras,
    concurrency,
    fleet,
    ingest,
    latency,
    lifting,
    memory,
    planning,
    prefill,
    second,
)

if TYPE_CHECKING:
    from cosmos_reason_ros.bench.results import Results
    from cosmos_reason_ros.bench.runner import Bench

# In run order (Bench.run keeps this order and plans the time budget over it).
PHASES: dict[str, Callable[[Bench, Results], None]] = {
    "latency": latency.run,
    "concurrency": concurrency.run,
    "second": second.run,
    "cameras": cameras.run,
    "ingest": ingest.run,
    "memory": memory.run,
    "prefill": prefill.run,
    "lifting": lifting.run,
    "planning": planning.run,
    "fleet": fleet.run,
}
