"""The console page in a real headless Chromium, against the real node, engine and camera.

Real tier: the node is a process on the cpu_demo preset with the real vLLM engine on the tiny
model, a camera publishes the demo scene (``eval/demo_recording.render_frame``, 640x480, 5 Hz),
the console is its own process (``console --port 0``) and Debian's ``chromium`` is driven
by Selenium through ``chromium-driver`` (its path given explicitly, so Selenium Manager never
downloads anything). What only this module proves: the page works in a browser -- it loads
offline, its live picture updates, a grounding answer from the real engine is drawn on the
canvas at the pixels the node reported, the page's Cancel ends an endless goal CANCELLED, a
bad input shows the node's own message, a result re-opens from the list, and the console
process ends cleanly on SIGTERM. One node, one console and one browser serve the whole module;
the tests run in file order.

Screenshots go to ``$COSMOS_REASON_ARTIFACTS`` (default ``build/<distro>/artifacts``); with
``COSMOS_REASON_WRITE_SCREENSHOT=1`` the grounding answer's screenshot also replaces the
README's ``docs/img/console.png``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from console_process import ConsoleProcess  # noqa: E402
from node_process import (  # noqa: E402
    ENDLESS_LIMITS,
    ENDLESS_SCHEMA,
    ENDLESS_TOKENS,
    REPO_ROOT,
    NodeProcess,
    rgb_image_msg,
)
from sensor_msgs.msg import Image  # noqa: E402
from spun_node import SpunNode  # noqa: E402
from waiting import NEVER_S, wait_until  # noqa: E402

from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: E402
from cosmos_reason_ros.core import prompts  # noqa: E402
from cosmos_reason_ros.core.types import BadRequestError, ErrorCode  # noqa: E402
from cosmos_reason_ros.eval.demo_recording import render_frame  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.engine, pytest.mark.slow, pytest.mark.every_distro]

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
CHROMEDRIVER = shutil.which("chromedriver")
BOX_COLOUR = (0xFF, 0x2B, 0xD6)  # COLOURS[0] in console.js: the first box's colour
SCREENSHOT = REPO_ROOT / "docs" / "img" / "console.png"
# Grounding with at least one box: the task's own schema allows "[]", and random weights
# under constrained decoding give whatever the schema allows.
ONE_BOX_SCHEMA = json.dumps({"type": "array", "minItems": 1, "maxItems": 1, "items": {
    "type": "object", "required": ["bbox_2d", "label"], "additionalProperties": False,
    "properties": {"bbox_2d": {"type": "array", "minItems": 4, "maxItems": 4,
                               "items": {"type": "integer", "minimum": 0, "maximum": 1000}},
                   "label": {"type": "string", "enum": ["red box"]}}}})


def artifacts_dir() -> Path:
    """Where test artifacts go: ``$COSMOS_REASON_ARTIFACTS`` or ``build/<distro>/artifacts``."""
    configured = os.environ.get("COSMOS_REASON_ARTIFACTS")
    distro = os.environ.get("COSMOS_REASON_SETUP") or os.environ.get("COSMOS_REASON_ROS_DISTRO",
                                                                     "local")
    path = Path(configured) if configured else REPO_ROOT / "build" / distro / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def browser_paths() -> tuple[str, str]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("BROWSER TESTS SKIPPED: Debian's chromium and chromium-driver are not "
                    "installed (apt-get install chromium chromium-driver; .ci/run installs "
                    "them where apt-get and root or sudo exist)")
    pytest.importorskip("selenium", reason="needs selenium (requirements/common.in)")
    return CHROMIUM, CHROMEDRIVER


class DemoCamera:
    """Publishes the demo scene on /image at 5 Hz and collects ~/results, from a thread."""

    def __init__(self) -> None:
        self.side = SpunNode("console_test_camera")
        self.publisher = self.side.node.create_publisher(Image, "/image", 10)
        self.results: list[ReasoningResult] = []
        self._cond = threading.Condition()
        self.side.node.create_subscription(ReasoningResult, "/cosmos_reason/results",
                                           self._on_result, 50)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            # The scene loops every 4 s, as the demo recording does.
            rgb = render_frame((time.monotonic() - t0) % 4.0).rgb
            self.publisher.publish(rgb_image_msg(rgb, self.side.now_ns()))
            self._stop.wait(0.2)

    def _on_result(self, msg: ReasoningResult) -> None:
        with self._cond:
            self.results.append(msg)
            self._cond.notify_all()

    def result(self, goal_id: str, timeout_s: float = 30.0) -> ReasoningResult:
        """The ``~/results`` message of goal ``goal_id``."""
        with self._cond:
            assert self._cond.wait_for(
                lambda: any(r.goal_id == goal_id for r in self.results), timeout_s), goal_id
            return next(r for r in self.results if r.goal_id == goal_id)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(NEVER_S)
        self.side.close()


@pytest.fixture(scope="module")
def stack(browser_paths, tiny_qwen3_vl):
    """Node (real engine), demo camera, console process and headless Chromium."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = browser_paths
    # No frame-age limit: these tests are about the page. On a loaded CI machine the demo
    # camera's thread once stalled for 10 s, and a goal on the latest frame then ended
    # IMAGE_TOO_OLD instead of generating (the node's age check has tests of its own).
    node = NodeProcess("cpu_demo", {"engine.model": str(tiny_qwen3_vl), **ENDLESS_LIMITS,
                                    "diagnostics.period_s": 0.5, "image.max_age_s": 0.0})
    camera = console = driver = None
    try:
        node.wait_ready()
        camera = DemoCamera()
        console = ConsoleProcess("--node", "/cosmos_reason")
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1440,960", "--force-device-scale-factor=1"):
            options.add_argument(arg)
        # The driver's path given: Selenium Manager would otherwise try to download one.
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver),
                                  options=options)
        driver.set_script_timeout(30)
        driver.get(console.url)

        class Stack:
            pass

        s = Stack()
        s.node, s.camera, s.console, s.driver = node, camera, console, driver
        yield s
    finally:
        if driver is not None:
            driver.quit()
        if console is not None:
            console.stop()
            console.tree.close()
        if camera is not None:
            camera.close()
        node.stop()


def wait_for(driver: Any, script: str, timeout_s: float = NEVER_S, what: str = "") -> Any:
    """Evaluate ``script`` (a JS expression) in the page until it is truthy; return it."""
    try:
        # Each read runs a script in the browser: a tenth of a second apart.
        return wait_until(lambda: driver.execute_script(f"return {script};"), timeout_s,
                          f"page: {what or script}", poll_s=0.1)
    except AssertionError:
        shot(driver, "timeout")
        raise


def shot(driver: Any, name: str) -> Path:
    """Save a screenshot of the page as a test artifact."""
    path = artifacts_dir() / f"console_{name}.png"
    driver.save_screenshot(str(path))
    return path


def ask(driver: Any, task: str, prompt: str = "", targets: str = "", schema: str = "",
        max_tokens: int = 0) -> None:
    """Fill the form as an operator would (the hidden 'More' fields set directly) and ask."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, "task")).select_by_value(task)
    for element_id, value in (("prompt", prompt), ("targets", targets)):
        element = driver.find_element(By.ID, element_id)
        if element.is_enabled():
            element.clear()
            element.send_keys(value)
    driver.execute_script(
        "document.getElementById('response-schema').value = arguments[0];"
        "document.getElementById('max-tokens').value = arguments[1];", schema, max_tokens)
    driver.find_element(By.ID, "ask-button").click()


def answer_ended(driver: Any, previous_key: str) -> dict[str, Any]:
    """Wait until the page shows a new result; return its status, key and shown data."""
    wait_for(driver, f"document.getElementById('answer').dataset.key !== {json.dumps(previous_key)}"
             " && ['succeeded', 'aborted', 'canceled', 'rejected'].includes("
             "document.getElementById('answer').dataset.status)", what="an answer")
    return driver.execute_script(
        "const a = document.getElementById('answer');"
        "return {status: a.dataset.status, key: a.dataset.key, shown: window.consoleState.shown,"
        "error: document.getElementById('answer-error').textContent};")


def shown_key(driver: Any) -> str:
    return driver.execute_script("return document.getElementById('answer').dataset.key;")


def node_message(task: str, prompt: str = "", targets: tuple[str, ...] = ()) -> str:
    """The node's own BAD_REQUEST wording for these goal fields (the package's validator)."""
    with pytest.raises(BadRequestError) as error:
        prompts.validate_goal_text(task, prompt, targets)
    return error.value.message


def test_page_loads_offline_and_the_live_picture_updates(stack) -> None:
    driver = stack.driver
    wait_for(driver, "document.getElementById('connection').textContent === 'connected'",
             what="the WebSocket")
    # The live pane: one for the default camera, its picture replaced as frames come.
    wait_for(driver, "document.querySelector('figure.pane img')?.dataset.stamp",
             what="a first live picture")
    # Stamp and picture read together: a picture arriving between two reads would pair one
    # picture's stamp with the next one's source.
    first, src = driver.execute_script(
        "const i = document.querySelector('figure.pane img'); return [i.dataset.stamp, i.src];")
    assert src.startswith("blob:")
    later = wait_for(driver, f"(() => {{ const s = document.querySelector('figure.pane img')"
                     f"?.dataset.stamp; return s && BigInt(s) > {first}n ? s : ''; }})()",
                     what="a newer live picture")
    assert driver.execute_script("return document.querySelector('figure.pane img').src;") != src
    assert int(later) > int(first)
    natural = driver.execute_script("const i = document.querySelector('figure.pane img');"
                                    "return [i.naturalWidth, i.naturalHeight];")
    assert natural == [640, 480]
    # The status strip from /diagnostics.
    wait_for(driver, "document.getElementById('engine-state').textContent === 'ready'",
             what="engine state in the status strip")
    wait_for(driver, "document.getElementById('camera-age').textContent.endsWith(' s')",
             what="camera age in the status strip")
    # Offline: every resource the page loaded came from the console itself.
    origins = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin);")
    console_origin = stack.console.url.split("/?")[0].rstrip("/")
    assert all(o == console_origin for o in origins), origins
    shot(driver, "live")


def test_grounding_answer_is_drawn_at_the_reported_pixels(stack) -> None:
    driver = stack.driver
    before = shown_key(driver)
    ask(driver, "ground", targets="red box", schema=ONE_BOX_SCHEMA, max_tokens=64)
    page = answer_ended(driver, before)
    assert page["status"] == "succeeded", page["error"]
    # What the node published for this goal: the page shows the same box...
    msg = stack.camera.result(page["key"])
    assert msg.error_code == ErrorCode.OK
    (box,) = msg.boxes
    shown = page["shown"]["boxes"][0]
    assert [shown[k] for k in ("x_min", "y_min", "x_max", "y_max")] == pytest.approx(
        [box.x_min, box.y_min, box.x_max, box.y_max])
    # ...drawn on the canvas of the answer's own frame, at those pixels.
    (frame,) = msg.camera_frames
    stamp = frame.header.stamp.sec * 1_000_000_000 + frame.header.stamp.nanosec
    assert page["shown"]["camera_frames"][0]["stamp"] == str(stamp)
    wait_for(driver, "document.querySelector('#answer-frames canvas')?.dataset.drawn",
             what="the answer's canvas")
    width, height = driver.execute_script(
        "const c = document.querySelector('#answer-frames canvas'); return [c.width, c.height];")
    assert (width, height) == (frame.image_width, frame.image_height) == (640, 480)
    x_left = min(int(box.x_min), width - 1)
    x_right = min(int(box.x_max), width - 1)
    y_mid = min(int((box.y_min + box.y_max) / 2), height - 1)
    pixels = driver.execute_script(
        "const ctx = document.querySelector('#answer-frames canvas').getContext('2d');"
        "return arguments[0].map(([x, y]) => Array.from(ctx.getImageData(x, y, 1, 1).data));",
        [[x_left, y_mid], [x_right, y_mid]])
    for x, rgba in zip((x_left, x_right), pixels, strict=True):
        assert all(abs(a - b) <= 2 for a, b in zip(rgba[:3], BOX_COLOUR, strict=True)), (
            f"pixel ({x}, {y_mid}) is {rgba}, not the box colour {BOX_COLOUR}")
    path = shot(driver, "grounding")
    if os.environ.get("COSMOS_REASON_WRITE_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, SCREENSHOT)


def test_cancel_on_the_page_ends_an_endless_goal_canceled(stack) -> None:
    from selenium.webdriver.common.by import By

    driver = stack.driver
    before = shown_key(driver)
    ask(driver, "vqa", prompt="Describe everything on the table.", schema=ENDLESS_SCHEMA,
        max_tokens=ENDLESS_TOKENS)
    wait_for(driver, "document.getElementById('stage').textContent.startsWith('generating')",
             what="the goal generating")
    wait_for(driver, "document.getElementById('answer-text').textContent.length > 20",
             what="streamed answer text")
    driver.find_element(By.ID, "cancel-button").click()
    page = answer_ended(driver, before)
    assert page["status"] == "canceled"
    assert stack.camera.result(page["key"]).error_code == ErrorCode.CANCELLED
    # The frame the cancelled goal looked at is shown too (the node publishes it unanswered).
    notes = driver.execute_script(
        "return Array.from(document.querySelectorAll('#answer-frames .frame-note'))"
        ".map(n => n.textContent)")
    assert notes and not any("no longer held" in n for n in notes), notes
    shot(driver, "canceled")


def test_bad_input_shows_the_nodes_message(stack) -> None:
    from selenium.webdriver.common.by import By

    driver = stack.driver
    before = shown_key(driver)
    ask(driver, "vqa", prompt="")
    page = answer_ended(driver, before)
    assert page["status"] == "aborted"
    assert page["error"] == node_message("vqa")
    too_many = tuple(f"thing {i}" for i in range(prompts.MAX_TARGETS + 1))
    ask(driver, "ground", targets=", ".join(too_many))
    page = answer_ended(driver, page["key"])
    assert page["error"] == node_message("ground", "", too_many)
    # A prompt past the console's request bound: refused on the page, naming the sizes; the
    # socket stays open (the server would close it) and the next request clears the error.
    driver.execute_script("document.getElementById('task').value = 'vqa';"
                          "document.getElementById('prompt').value = 'x'.repeat(70000);")
    driver.find_element(By.ID, "ask-button").click()
    wait_for(driver, "document.getElementById('answer-error').textContent"
             ".startsWith('request not sent')", what="the size refusal")
    error = driver.execute_script("return document.getElementById('answer-error').textContent;")
    assert "prompt: 70000 characters" in error
    assert driver.execute_script(
        "return document.getElementById('connection').textContent;") == "connected"
    ask(driver, "vqa", prompt="")
    page = answer_ended(driver, page["key"])
    assert page["error"] == node_message("vqa")
    shot(driver, "bad_input")


def test_a_result_reopens_from_the_list_with_its_frame(stack) -> None:
    from selenium.webdriver.common.by import By

    driver = stack.driver
    grounding = next(r for r in stack.camera.results if r.task == "ground" and r.boxes)
    item = driver.find_element(By.CSS_SELECTOR, f"#results li[data-key='{grounding.goal_id}']")
    item.click()
    wait_for(driver, f"document.getElementById('answer').dataset.key === '{grounding.goal_id}'"
             " && document.querySelector('#answer-frames canvas')?.dataset.drawn",
             what="the re-opened result")
    assert driver.execute_script("return window.consoleState.shown.boxes.length;") == 1


def test_console_stops_cleanly_on_sigterm(stack) -> None:
    console = stack.console
    assert console.stop(signal.SIGTERM) == 0, "\n".join(console.lines[-30:])
    assert not console.tree.survivors_after(5.0)
    assert any("console: stopping" in line for line in console.lines)
