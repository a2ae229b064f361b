"""Secrets and input bounds: the API key comes only from the environment, goes only into the
Authorization header, and never reaches logs, ~/results or /diagnostics; every size, count and
time a goal or the camera controls has a configured bound.

(The fault drill with a real ``vllm`` server requiring the key greps the same outputs; the
bad-input catalogue checks that no goal field makes the node read a file or fetch a URL.)
"""

from __future__ import annotations

import socket
import threading
import uuid

import pytest
from waiting import DISCOVERY_S, NEVER_S

from cosmos_reason_ros.config import PARAMS_BY_NAME
from cosmos_reason_ros.core import prompts

SECRET = f"sk-secret-{uuid.uuid4().hex}"
KEY_ENV = "COSMOS_SECRETS_TEST_KEY"

# What a goal or the camera controls -> the parameter or constant that bounds it.
BOUNDS = {
    "prompt length": "limits.max_prompt_chars",
    "response_schema size": "limits.max_schema_bytes",
    "output tokens": "limits.max_tokens",
    "goal time": "limits.goal_timeout_s",
    "goals running": "limits.max_concurrent_goals",
    "goals queued": "limits.max_queued_goals",
    "clip length": "limits.max_clip_duration_s",
    "clip frames": "limits.max_clip_frames",
    "feedback rate": "limits.feedback_rate_hz",
    "image size (declared)": "image.max_pixels",
    "model input pixels": "model.max_pixels",
    "frames kept": "image.history_frames",
    "memory of kept frames": "image.history_mb",
    "camera queue": "image.qos_depth",
    "wait for a frame": "image.wait_s",
    "engine start": "engine.start_timeout_s",
    "engine shutdown": "engine.shutdown_timeout_s",
    "server connect": "engine.connect_timeout_s",
    "server silence": "engine.read_timeout_s",
    "context length": "engine.max_model_len",
}
CONSTANT_BOUNDS = {
    "targets": prompts.MAX_TARGETS, "target length": prompts.MAX_TARGET_CHARS,
    "schema depth": prompts.MAX_SCHEMA_DEPTH, "temperature": prompts.MAX_TEMPERATURE,
    "images per request": prompts.MAX_IMAGES,
}


@pytest.mark.parametrize("what", sorted(BOUNDS))
def test_every_size_count_and_time_has_a_checked_parameter(what):
    param = PARAMS_BY_NAME[BOUNDS[what]]
    assert param.check is not None, f"{param.name} is not validated"
    assert param.check(-1) is not None, f"{param.name} accepts -1"
    assert param.check(param.default) is None


def test_constant_bounds_are_finite_and_positive():
    for what, value in CONSTANT_BOUNDS.items():
        assert 0 < value < 10**6, what


def test_no_parameter_holds_a_key():
    # The key is never a parameter value: only the NAME of the variable that holds it.
    # engine.session_key is a routing key sent in a header for session affinity (robot and
    # camera names), public by design: not a credential.
    routing = {"engine.session_key"}
    suspicious = [n for n in PARAMS_BY_NAME if n not in routing
                  and any(w in n for w in ("key", "secret", "password", "credential"))]
    assert suspicious == ["engine.api_key_env"]
    assert "NAME" in PARAMS_BY_NAME["engine.api_key_env"].description
    assert all("routing key" in PARAMS_BY_NAME[n].description for n in routing)


# --- live: the node process with the openai engine (no model to load) ------------------------


class RecordingServer:
    """Records each HTTP request head; /health answers 200, everything else 401 (wrong key)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.heads: list[str] = []
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        body = b'{"error": {"message": "Unauthorized", "type": "invalid_api_key"}}'
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2.0)
                data = b""
                try:
                    while b"\r\n\r\n" not in data and len(data) < 65536:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    head = data.decode("latin-1")
                    self.heads.append(head)
                    status = b"200 OK" if head.startswith("GET /health ") else \
                        b"401 Unauthorized"
                    conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json"
                                 b"\r\nContent-Length: " + str(len(body)).encode()
                                 + b"\r\nConnection: close\r\n\r\n" + body)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


@pytest.mark.slow  # starts processes or waits on real time: the real tier
@pytest.mark.ros
def test_key_given_as_a_parameter_stops_the_node_without_echoing_it():
    from node_process import NodeProcess

    proc = NodeProcess("remote_server", {"engine.api_key_env": SECRET})
    try:
        assert proc.proc.wait(NEVER_S) == 2, proc.output[-2000:]
    finally:
        proc.stop()
    assert "api_key_env must be the NAME of an environment variable" in proc.output
    assert SECRET not in proc.output


@pytest.mark.slow  # starts processes or waits on real time: the real tier
@pytest.mark.ros
def test_key_goes_only_into_the_authorization_header():
    rclpy = pytest.importorskip("rclpy")
    from diagnostic_msgs.msg import DiagnosticArray
    from node_process import NodeProcess, rgb_image_msg, scene
    from rclpy.executors import SingleThreadedExecutor
    from waiting import wait_until

    from cosmos_reason_interfaces.action import Reason
    from cosmos_reason_interfaces.msg import ReasoningResult
    from cosmos_reason_ros.client import ReasonClient
    from cosmos_reason_ros.core.types import ErrorCode

    server = RecordingServer()
    node = NodeProcess("remote_server", {
        "engine.url": f"http://127.0.0.1:{server.port}/v1",
        "engine.api_key_env": KEY_ENV, "engine.model": "tiny", "engine.start_timeout_s": 2.0,
        "diagnostics.period_s": 0.2}, env={KEY_ENV: SECRET})
    context = rclpy.context.Context()
    rclpy.init(context=context)
    seen: list[str] = []
    try:
        node.wait_ready(NEVER_S)
        test_node = rclpy.create_node("secrets_io", context=context)
        test_node.create_subscription(ReasoningResult, "/cosmos_reason/results",
                                      lambda m: seen.append(str(m)), 20)
        test_node.create_subscription(DiagnosticArray, "/diagnostics",
                                      lambda m: seen.append(str(m)), 20)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(test_node)
        threading.Thread(target=executor.spin, daemon=True).start()
        with ReasonClient(context=context) as client:
            assert client.wait_for_server(DISCOVERY_S)
            image = rgb_image_msg(scene(64, 48), 1)
            for _ in range(3):
                result = client.run(client.goal("q", source=Reason.Goal.SOURCE_GOAL_IMAGE,
                                                image=image, max_tokens=2), NEVER_S)
                assert result.error_code is ErrorCode.ENGINE_UNAVAILABLE, result.error_message
                assert "API key rejected" in result.error_message, result.error_message
                assert KEY_ENV in result.error_message  # names the variable, not the key
            # The three goals' results and some diagnostics are in (checked for the key below).
            wait_until(lambda: sum("ReasoningResult(" in m for m in list(seen)) >= 3
                       and sum("DiagnosticArray(" in m for m in list(seen)) >= 3, NEVER_S,
                       "three results and three diagnostics messages")
        executor.shutdown()
        test_node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)
        code = node.stop()
        server.close()
    assert code == 0, node.output[-2000:]
    # The key was used: it went to the server in the Authorization header ...
    assert any(f"authorization: bearer {SECRET}" in h.lower() for h in server.heads), \
        [h.split("\r\n")[0] for h in server.heads]
    # ... and nowhere else: not in the log, the results or the diagnostics.
    assert len(seen) > 5
    assert SECRET not in node.output
    assert not [s for s in seen if SECRET in s]
    for head in server.heads:  # nor in the URL or any other header
        assert SECRET not in head.lower().replace(f"authorization: bearer {SECRET}", "")
