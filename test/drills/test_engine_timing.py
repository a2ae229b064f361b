"""Engine-level timings: how soon the HTTP engine stops reading a server that overruns
``max_tokens``. test/engines/test_openai_http.py proves that it stops there (the partial
answer, ``length``, the disconnect); this drill measures how soon after the bound.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

# The fake server and its helpers live with the engine's tests; the drill reuses them as they
# are rather than keeping a second copy in step.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engines"))
from test_openai_http import (  # noqa: E402
    EndlessChat,
    FakeServer,
    collect,
    engine_for,
    fake_cfg,
    image_request,
    run,
)


# Measured 0.5 ms on an idle machine (docs/RELIABILITY.md, the max_tokens overrun row). The
# kinds whose bound is an event count: the fake server stamps the first event past it.
@pytest.mark.parametrize("kind", ["text", "reasoning"])
def test_a_server_overrunning_max_tokens_is_cut_off_at_once(kind: str, record) -> None:
    async def body() -> float:
        endless = EndlessChat(kind)
        async with FakeServer(endless) as fake, engine_for(fake_cfg(fake)) as engine:
            await asyncio.wait_for(collect(engine, image_request(max_tokens=16)), 30)
            ended_at = time.monotonic()
            await asyncio.wait_for(endless.gone.wait(), 5)  # the server saw the disconnect
            assert endless.passed_bound_at is not None, "the server never passed the bound"
            return ended_at - endless.passed_bound_at

    record(f"{kind}: request ended after the server passed max_tokens", run(body()), "s",
           0.1, 1.0)
