"""Routing values (core/routing.py) and the engine.* parameters that use them.

A bad URL, header name or key must stop the node with a message naming the parameter, the
value and what is allowed; the removed ``engine.endpoints`` must name what replaced it.
"""

from __future__ import annotations

import pytest

from cosmos_reason_ros.config import ConfigError, validate
from cosmos_reason_ros.core import routing

HUB_MODEL = "nvidia/Cosmos-Reason2-2B"


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "https://rack.example:443/v1/",
                                 "http://gpu/llm/cosmos/v1", "http://[::1]:8000/v1"])
def test_usable_base_urls(url: str) -> None:
    assert routing.base_url_problem(url) is None


@pytest.mark.parametrize("url,says", [
    ("", "allowed: http(s)://host"),
    ("127.0.0.1:8000/v1", "allowed: http(s)://host"),
    ("ftp://x/v1", "allowed: http(s)://host"),
    ("http://x:8000", "does not end in /v1"),
    ("http://x:8000/v1?a=1", "has a query or fragment"),
    ("http://x:99999/v1", "not a URL"),
    ("http://bob:secret@x/v1", "holds credentials"),
    ("http://x /v1", "allowed: http(s)://host"),
])
def test_unusable_base_urls_say_why(url: str, says: str) -> None:
    problem = routing.base_url_problem(url)
    assert problem is not None and says in problem
    assert "secret" not in problem


def test_header_names() -> None:
    assert routing.header_name_problem("X-Session-ID") is None
    assert routing.header_name_problem("") is None  # no routing header
    for bad in ("X Session", "X-Session-ID:", "é", "-x", "x" * 65):
        assert "allowed: empty (no routing header) or an HTTP header name" in \
            str(routing.header_name_problem(bad)), bad
    assert "sets X-Request-Id itself" in str(routing.header_name_problem("X-Request-Id"))


def test_session_key_is_prefix_then_camera() -> None:
    assert routing.session_key("/robot7/cosmos_reason", "front") == "/robot7/cosmos_reason/front"
    assert routing.session_key("robot7/", "front") == "robot7/front"
    assert routing.session_key("", "front") == "front"
    assert len(routing.session_key("r" * 300, "front")) == routing.MAX_SESSION_KEY_CHARS
    assert routing.session_key_problem("/robot7/cosmos_reason") is None
    assert routing.session_key_problem("robot 7") is not None
    assert routing.session_key_problem("r" * 201) is not None


@pytest.mark.parametrize("values,message", [
    ({"engine.url": "http://gpu:8000"},
     "engine.url='http://gpu:8000': path '/' does not end in /v1; allowed: http(s)://host"),
    ({"engine.fallback_urls": ["http://onboard:8000/v1", "onboard"]},
     "engine.fallback_urls=['http://onboard:8000/v1', 'onboard']: [1]='onboard': allowed: "
     "http(s)://host"),
    ({"engine.session_header": "X Session"},
     "engine.session_header='X Session': allowed: empty (no routing header) or an HTTP header "
     "name"),
    ({"engine.session_key": "robot 7"},
     "engine.session_key='robot 7': allowed: empty (the node's namespace/name) or up to 200 "
     "visible ASCII characters"),
])
def test_bad_routing_parameters_name_parameter_value_and_rule(values, message) -> None:
    with pytest.raises(ConfigError) as info:
        validate({"engine.model": HUB_MODEL, "engine.kind": "openai", **values})
    assert message in str(info.value)


def test_removed_endpoints_parameter_names_its_replacement() -> None:
    with pytest.raises(ConfigError) as info:
        validate({"engine.kind": "openai", "engine.endpoints": ["http://gpu:8000/v1"]})
    assert str(info.value).startswith(
        "unknown parameter(s): engine.endpoints; engine.endpoints was replaced by engine.url "
        "(the server or router) plus engine.fallback_urls")


# --- the pipeline keys every request about one camera the same ----------------------------


def test_goals_followups_and_prefills_of_a_camera_share_its_key_other_cameras_differ():
    import json
    import time

    import numpy as np
    from fake_engine import FakeEngine, Script

    from cosmos_reason_ros.core import query
    from cosmos_reason_ros.core.frames import FrameHistory
    from cosmos_reason_ros.core.imaging import ImageMessage
    from cosmos_reason_ros.core.models import COSMOS_REASON2
    from cosmos_reason_ros.core.params import NodeParams
    from cosmos_reason_ros.core.pipeline import GoalFields, GoalPipeline, Settings
    from cosmos_reason_ros.engines.runner import EngineRunner

    now = 500 * 10**9

    def history() -> FrameHistory[ImageMessage]:
        frames: FrameHistory[ImageMessage] = FrameHistory(clock=lambda: now)
        pixels = np.zeros((48, 64, 3), np.uint8).tobytes()
        msg = ImageMessage(stamp_ns=now, frame_id="optical", width=64, height=48,
                           encoding="rgb8", step=64 * 3, data=pixels)
        frames.append(msg, now, nbytes=len(msg.data), received_ns=now)
        return frames

    values = {"engine.model": HUB_MODEL, "cameras.names": ["front", "wrist"]}
    params: NodeParams = validate(values)
    settings = Settings.from_params(params, COSMOS_REASON2, "/robot7/cosmos_reason")
    assert settings == Settings.from_params(
        validate({**values, "engine.session_key": "/robot7/cosmos_reason"}),
        COSMOS_REASON2)  # engine.session_key, when set, replaces the node's name
    fake = FakeEngine()
    fake.script = lambda _r: Script(deltas=[json.dumps({"answer": "yes"})])
    with EngineRunner(fake) as runner:
        runner.start(timeout_s=30.0)
        p = GoalPipeline.for_cameras(settings, runner, {"front": history(), "wrist": history()},
                                     read_frame=lambda m: m, clock_ns=lambda: now)
        for cameras in (("front",), (), ("front",), ("wrist",), ("wrist", "front")):
            goal = p.validate(GoalFields(prompt="Is the aisle blocked?", cameras=cameras))
            run = p.run(goal, t_start=time.monotonic(), accepted_ns=now)
            assert run.error is None, run.error
        media = p.prepare_frame(p.history.latest())
        prefill = p.build_prefill_request(media)
        assert prefill.sampling.max_tokens == 1 and prefill.priority == query.PREFILL_PRIORITY
    keys = [r.session_key for r in fake.requests]
    front, wrist = "/robot7/cosmos_reason/front", "/robot7/cosmos_reason/wrist"
    # Goals on the default camera (named or not) and its prefill share one key; a goal that
    # starts with the wrist image is routed with the wrist camera.
    assert keys == [front, front, front, wrist, wrist]
    assert prefill.session_key == front
