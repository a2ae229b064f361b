"""Config presets, the launch file, setup.py's install rules and the generated docs agree.

None of this needs rclpy or launch: presets are checked with the node's own parameter table
(``load_yaml_params`` + ``validate``), the launch file is read as a syntax tree and run against
small stand-ins for launch/launch_ros, and the docs are regenerated in memory.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml
from repo_scripts import load_script

from cosmos_reason_ros.config import (
    PARAMS,
    PARAMS_BY_NAME,
    PRESET_KEY,
    RUNTIME_PARAMS,
    ConfigError,
    load_yaml_params,
    validate,
)
from cosmos_reason_ros.core.models import detect_profile
from cosmos_reason_ros.core.params import NodeParams

REPO = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO / "config"
LAUNCH_FILE = REPO / "launch" / "cosmos_reason.launch.py"
PRESETS = sorted(CONFIG_DIR.glob("*.yaml"))
EXPECTED_PRESETS = {"cpu_demo", "x86_gpu", "jetson_orin_nano", "jetson_orin_nx",
                    "jetson_agx_orin", "jetson_thor", "remote_server"}
LAUNCH_ARGUMENTS = {"config", "model", "engine", "endpoint", "image_topic", "compressed_topic",
                    "depth", "depth_topic", "camera_info_topic", "cameras", "namespace",
                    "use_sim_time", "log_level", "autostart", "console"}
# Chat template, system prompt, reasoning instruction and a short question, in tokens: what a
# single-image goal needs besides the image and the answer (measured ~60-120 for Reason2).
TEXT_MARGIN_TOKENS = 150


def validated(path: Path) -> NodeParams:
    """A preset's values as the node would hold them (empty vllm model -> a hub id)."""
    values = load_yaml_params(str(path))
    if values.get("engine.kind", "vllm") == "vllm" and not values.get("engine.model"):
        values["engine.model"] = "nvidia/Cosmos-Reason2-2B"
    return validate(values)


# --- presets -------------------------------------------------------------------------------

def test_all_documented_presets_exist() -> None:
    assert {p.stem for p in PRESETS} >= EXPECTED_PRESETS


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_loads_and_validates(path: Path) -> None:
    values = load_yaml_params(str(path))
    unknown = sorted(set(values) - set(PARAMS_BY_NAME))
    assert not unknown, f"{path.name}: unknown parameter names {unknown}"
    validated(path)


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_applies_under_any_namespace_and_node_name(path: Path) -> None:
    # '/**' is the one key every rclpy applies to any node (Humble's: '/**' or the exact
    # name). A 'cosmos_reason:' key was dropped for a node in a namespace.
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert list(doc) == [PRESET_KEY]
    plain = load_yaml_params(str(path))
    for fqn in ("/robot1/cosmos_reason", "/fleet/robot2/reasoner"):
        assert load_yaml_params(str(path), fqn) == plain


def test_misspelled_parameter_is_rejected_by_name(tmp_path: Path) -> None:
    text = (CONFIG_DIR / "x86_gpu.yaml").read_text(encoding="utf-8")
    assert "max_model_len:" in text
    bad = tmp_path / "typo.yaml"
    bad.write_text(text.replace("max_model_len:", "max_model_length:"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\): engine\.max_model_length"):
        validate(load_yaml_params(str(bad)))


def test_jetson_presets_use_the_published_vllm_settings() -> None:
    for board in ("jetson_agx_orin", "jetson_thor"):
        v = validated(CONFIG_DIR / f"{board}.yaml")
        assert v.engine.max_model_len == 8192, board
        assert v.engine.gpu_memory_utilization == pytest.approx(0.8), board
        assert v.engine.enable_prefix_caching is True, board
    nano = validated(CONFIG_DIR / "jetson_orin_nano.yaml")
    assert nano.engine.enforce_eager is True
    assert nano.engine.max_model_len == 768
    assert nano.engine.max_num_batched_tokens == 768
    assert nano.engine.gpu_memory_utilization == pytest.approx(0.52)
    assert nano.engine.max_num_seqs == 1
    assert json.loads(nano.engine.limit_mm_per_prompt) == {"image": 1}
    assert nano.limits.max_concurrent_goals <= 2
    x86 = validated(CONFIG_DIR / "x86_gpu.yaml")
    assert x86.engine.max_model_len == 16384
    assert x86.engine.gpu_memory_utilization == pytest.approx(0.9)
    assert x86.limits.max_concurrent_goals == 16


def test_gpu_presets_are_ordered_by_board_size() -> None:
    order = ["jetson_orin_nano", "jetson_orin_nx", "jetson_agx_orin"]
    values = [validated(CONFIG_DIR / f"{name}.yaml") for name in order]
    columns = {"engine.max_model_len": [v.engine.max_model_len for v in values],
               "engine.gpu_memory_utilization": [v.engine.gpu_memory_utilization for v in values],
               "limits.max_concurrent_goals": [v.limits.max_concurrent_goals for v in values]}
    for key, column in columns.items():
        assert column == sorted(column) and len(set(column)) == 3, (key, column)


@pytest.mark.parametrize("name", ["x86_gpu", "jetson_orin_nano", "jetson_orin_nx",
                                  "jetson_agx_orin", "jetson_thor"])
def test_image_and_answer_fit_the_context(name: str) -> None:
    v = validated(CONFIG_DIR / f"{name}.yaml")
    profile = detect_profile(v.engine.model, None if v.model.family == "auto"
                             else v.model.family)
    image_tokens = profile.max_visual_tokens(v.model.max_pixels or None)
    needed = image_tokens + v.limits.max_tokens + TEXT_MARGIN_TOKENS
    assert needed <= v.engine.max_model_len, (
        f"{name}: {image_tokens} image + {v.limits.max_tokens} answer + "
        f"{TEXT_MARGIN_TOKENS} text tokens > max_model_len {v.engine.max_model_len}")
    if "video" not in json.loads(v.engine.limit_mm_per_prompt or "{}"):
        return  # no clips on this preset
    frames = v.limits.max_clip_frames
    # Worst case: a large camera frame, so every frame gets the per-frame maximum.
    width, height = profile.video_frame_size(1920, 1080, frames)
    clip_tokens = profile.video_tokens(width, height, frames)
    needed = clip_tokens + v.limits.max_tokens + TEXT_MARGIN_TOKENS
    assert needed <= v.engine.max_model_len, (
        f"{name}: a {frames}-frame clip ({clip_tokens} tokens) + answer does not fit")
    default_frames = v.image.clip_duration_s * v.image.clip_fps
    assert default_frames <= frames, f"{name}: the default clip exceeds max_clip_frames"


def test_nano_image_budget_is_256_tokens() -> None:
    v = validated(CONFIG_DIR / "jetson_orin_nano.yaml")
    profile = detect_profile(v.engine.model)
    assert profile.max_visual_tokens(v.model.max_pixels) == 256
    # The warm-up image is what the node sends after resizing a 640x480 frame.
    assert (v.engine.warmup_width, v.engine.warmup_height) == profile.input_size(
        640, 480, v.model.max_pixels)


def test_remote_server_preset_talks_to_a_reasoning_server() -> None:
    v = validated(CONFIG_DIR / "remote_server.yaml")
    assert v.engine.kind == "openai"
    assert v.engine.url.startswith("http") and v.engine.url.endswith("/v1")
    assert v.engine.session_header == "X-Session-ID"  # vllm-router's consistent_hash key
    assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", v.engine.api_key_env)
    assert v.model.family == "cosmos_reason2"  # a served name cannot be auto-detected
    assert v.engine.constrains_after_reasoning is True
    assert "--reasoning-parser qwen3" in (CONFIG_DIR / "remote_server.yaml").read_text()


# --- launch file ---------------------------------------------------------------------------

def _launch_tree() -> ast.Module:
    return ast.parse(LAUNCH_FILE.read_text(encoding="utf-8"), filename=str(LAUNCH_FILE))


def _module_constant(tree: ast.Module, name: str) -> Any:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{LAUNCH_FILE.name} defines no {name}")


def _console_scripts() -> dict[str, str]:
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "console_scripts":
                    entries = ast.literal_eval(value)
                    return dict(tuple(s.strip() for s in e.split("=", 1)) for e in entries)
    raise AssertionError("setup.py declares no console_scripts")


def test_launch_arguments_are_the_documented_ones() -> None:
    arguments = _module_constant(_launch_tree(), "ARGUMENTS")
    names = [name for name, _, _ in arguments]
    assert len(names) == len(set(names))
    assert set(names) == LAUNCH_ARGUMENTS
    assert all(isinstance(d, str) and desc for _, d, desc in arguments)
    defaults = {name: default for name, default, _ in arguments}
    assert defaults["config"] == "x86_gpu"
    assert defaults["image_topic"] == "/camera/image_raw"
    assert defaults["use_sim_time"] == "false"


def test_default_config_is_an_existing_preset() -> None:
    defaults = {n: d for n, d, _ in _module_constant(_launch_tree(), "ARGUMENTS")}
    assert (CONFIG_DIR / f"{defaults['config']}.yaml").is_file()
    # Every preset the help text offers exists too.
    help_text = {n: desc for n, _, desc in _module_constant(_launch_tree(), "ARGUMENTS")}
    offered = set(re.findall(r"[a-z0-9]+(?:_[a-z0-9]+)+", help_text["config"]))
    assert offered >= EXPECTED_PRESETS
    assert all((CONFIG_DIR / f"{name}.yaml").is_file() for name in offered)


def test_launch_executables_are_console_scripts() -> None:
    tree = _launch_tree()
    scripts = _console_scripts()
    executable = _module_constant(tree, "EXECUTABLE")
    assert executable in scripts
    assert scripts[executable] == "cosmos_reason_ros.ros.node:main"
    assert _module_constant(tree, "PACKAGE") == "cosmos_reason_ros"
    # The node's own name (NODE_NAME in node.py); the presets apply under any name.
    assert _module_constant(tree, "NODE_NAME") == "cosmos_reason"
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "executable":
            if isinstance(node.value, ast.Constant):
                assert node.value.value in scripts


def test_console_script_targets_exist() -> None:
    scripts = _console_scripts()
    assert scripts["query"] == "cosmos_reason_ros.tools.query:main"
    module, func = scripts["cosmos_reason_node"].split(":")
    source = (REPO / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8")
    assert re.search(rf"^def {func}\(", source, re.MULTILINE)


class _Recorder:
    """Stand-in for a launch/launch_ros class: remembers its constructor arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


class _LaunchConfiguration:
    def __init__(self, name: str) -> None:
        self.name = name

    def perform(self, context: dict[str, str]) -> str:
        return context[self.name]


@pytest.fixture
def launch_module(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> types.ModuleType:
    """The launch file, executed against stand-ins for launch, launch_ros and ament_index."""
    share = tmp_path / "share" / "cosmos_reason_ros"
    share.mkdir(parents=True)
    (share / "config").symlink_to(CONFIG_DIR)

    def get_package_share_directory(package: str) -> str:
        assert package == "cosmos_reason_ros"
        return str(share)

    stubs = {
        "launch": {},
        "launch.launch_description": {"LaunchDescription": _Recorder},
        "launch.actions": {"DeclareLaunchArgument": _Recorder, "OpaqueFunction": _Recorder},
        "launch.substitutions": {"LaunchConfiguration": _LaunchConfiguration},
        "launch_ros": {},
        "launch_ros.actions": {"Node": _Recorder},
        "ament_index_python": {},
        "ament_index_python.packages": {
            "get_package_share_directory": get_package_share_directory},
    }
    for name, attrs in stubs.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("cosmos_reason_launch", LAUNCH_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _context(module: types.ModuleType, **overrides: str) -> dict[str, str]:
    context = {name: default for name, default, _ in module.ARGUMENTS}
    context.update(overrides)
    return context


def test_launch_description_declares_every_argument(launch_module: types.ModuleType) -> None:
    description = launch_module.generate_launch_description()
    actions = description.args[0]
    declared = [a.args[0] for a in actions if "default_value" in a.kwargs]
    assert set(declared) == LAUNCH_ARGUMENTS
    assert any(a.kwargs.get("function") is launch_module.launch_node for a in actions)


def test_launch_defaults_start_the_x86_preset(launch_module: types.ModuleType) -> None:
    (node,) = launch_module.launch_node(_context(launch_module))
    kw = node.kwargs
    assert (kw["package"], kw["executable"], kw["name"]) == (
        "cosmos_reason_ros", "cosmos_reason_node", "cosmos_reason")
    preset, overrides = kw["parameters"]
    assert Path(preset).resolve() == (CONFIG_DIR / "x86_gpu.yaml").resolve()
    assert overrides == {"use_sim_time": False}
    assert dict(kw["remappings"]) == {
        "image": "/camera/image_raw", "image/compressed": "/camera/image_raw/compressed",
        "depth/image": "/camera/aligned_depth_to_color/image_raw",
        "camera_info": "/camera/color/camera_info"}
    assert kw["arguments"] == ["--ros-args", "--log-level", "info"]


def test_launch_overrides_and_remaps(launch_module: types.ModuleType) -> None:
    (node,) = launch_module.launch_node(_context(
        launch_module, config="remote_server", model="cr2", engine="openai",
        endpoint="http://gpu:8000/v1", image_topic="/front/image", compressed_topic="/front/jpeg",
        depth="true", depth_topic="/front/depth", camera_info_topic="/front/info",
        namespace="robot1", use_sim_time="true", log_level="debug"))
    kw = node.kwargs
    preset, overrides = kw["parameters"]
    assert Path(preset).name == "remote_server.yaml"
    assert overrides == {"use_sim_time": True, "engine.model": "cr2", "engine.kind": "openai",
                         "engine.url": "http://gpu:8000/v1", "depth.enabled": True}
    # The preset applies to the node in its namespace, and the overrides are valid
    # parameters on top of it.
    values = load_yaml_params(preset, f"/{kw['namespace']}/{kw['name']}")
    assert values == load_yaml_params(preset)
    values.update({k: v for k, v in overrides.items() if k != "use_sim_time"})
    validate(values)
    assert dict(kw["remappings"]) == {"image": "/front/image", "image/compressed": "/front/jpeg",
                                      "depth/image": "/front/depth",
                                      "camera_info": "/front/info"}
    assert kw["namespace"] == "robot1"
    assert kw["arguments"][-1] == "debug"


def test_launch_cameras_name_the_cameras_and_remap_each(launch_module: types.ModuleType
                                                        ) -> None:
    (node,) = launch_module.launch_node(_context(
        launch_module, cameras="front=/front/image_raw, wrist=/wrist/image_raw", depth="true"))
    kw = node.kwargs
    preset, overrides = kw["parameters"]
    assert overrides["cameras.names"] == ["front", "wrist"]
    assert dict(kw["remappings"]) == {
        "front/image": "/front/image_raw", "front/image/compressed": "/front/image_raw/compressed",
        "wrist/image": "/wrist/image_raw", "wrist/image/compressed": "/wrist/image_raw/compressed",
        "front/depth/image": "/camera/aligned_depth_to_color/image_raw",
        "front/camera_info": "/camera/color/camera_info"}
    values = load_yaml_params(preset)
    values.update({k: v for k, v in overrides.items() if k != "use_sim_time"})
    assert validate(values).cameras.names == ("front", "wrist")
    with pytest.raises(RuntimeError, match=r"entry 'wrist' is not NAME=TOPIC"):
        launch_module.launch_node(_context(launch_module, cameras="front=/f/image,wrist"))


def test_launch_console_starts_the_web_console_beside_the_node(
        launch_module: types.ModuleType) -> None:
    node, console = launch_module.launch_node(_context(
        launch_module, console="true", namespace="robot1", image_topic="/front/image_raw"))
    assert node.kwargs["executable"] == "cosmos_reason_node"
    kw = console.kwargs
    assert (kw["package"], kw["executable"]) == ("cosmos_reason_ros", "console")
    assert "console" in _console_scripts()
    assert kw["arguments"] == ["--node", "/robot1/cosmos_reason",
                               "--image-topic", "/front/image_raw"]
    _, console = launch_module.launch_node(_context(
        launch_module, console="true", cameras="front=/front/image_raw, wrist=/wrist/image_raw"))
    assert console.kwargs["arguments"] == [
        "--node", "/cosmos_reason", "--cameras", "front=/front/image_raw,wrist=/wrist/image_raw"]


def test_launch_accepts_a_path_and_names_the_presets_on_a_typo(
        launch_module: types.ModuleType, tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text((CONFIG_DIR / "cpu_demo.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    (node,) = launch_module.launch_node(_context(launch_module, config=str(mine)))
    assert node.kwargs["parameters"][0] == str(mine)
    with pytest.raises(RuntimeError, match=r"jetson_orin_nanoo.*presets: .*jetson_orin_nano, "):
        launch_module.launch_node(_context(launch_module, config="jetson_orin_nanoo"))


# --- install rules -------------------------------------------------------------------------

def test_setup_installs_every_launch_file_and_preset() -> None:
    source = (REPO / "setup.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    installs: list[tuple[str, str]] = []  # (destination source text, glob pattern)
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple) and len(node.elts) == 2:
            dest, files = node.elts
            if (isinstance(files, ast.Call) and isinstance(files.func, ast.Name)
                    and files.func.id == "glob"):
                installs.append((ast.get_source_segment(source, dest) or "",
                                 ast.literal_eval(files.args[0])))
    for folder, suffix in (("launch", ".launch.py"), ("config", ".yaml")):
        files = sorted((REPO / folder).glob(f"*{suffix}"))
        assert files, folder
        for f in files:
            rel = f"{folder}/{f.name}"
            assert any(fnmatch.fnmatch(rel, pattern) and dest.endswith(f'/{folder}"')
                       for dest, pattern in installs), f"setup.py does not install {rel}"


# --- docs ----------------------------------------------------------------------------------

def test_parameters_doc_is_current() -> None:
    gen = load_script("gen_params_doc")
    current = (REPO / "docs" / "PARAMETERS.md").read_text(encoding="utf-8")
    assert current == gen.render(), "docs/PARAMETERS.md is stale: python scripts/gen_params.py"


def test_parameters_doc_lists_every_parameter_with_its_default() -> None:
    gen = load_script("gen_params_doc")
    rows = {}
    for line in (REPO / "docs" / "PARAMETERS.md").read_text(encoding="utf-8").splitlines():
        match = re.match(r"\| `([a-z_]+\.[a-z_0-9]+)` \| ([^|]+) \| `(.*?)` \|", line)
        if match:
            rows[match.group(1)] = (match.group(2).strip(), match.group(3))
    assert set(rows) == {p.name for p in PARAMS}
    for p in PARAMS:
        assert rows[p.name] == (gen.type_name(p.default), gen.format_default(p.default)), p.name


def test_parameters_doc_names_every_runtime_parameter() -> None:
    doc = (REPO / "docs" / "PARAMETERS.md").read_text(encoding="utf-8")
    (line,) = [x for x in doc.splitlines() if x.startswith("Settable while the node runs")]
    assert RUNTIME_PARAMS and set(re.findall(r"`([a-z_.]+)`", line)) == set(RUNTIME_PARAMS)
    assert "prefill.ready_frame_within_s" in RUNTIME_PARAMS


@pytest.mark.parametrize("command, module", [("tiny_model", "cosmos_reason_ros.eval.tiny_model"),
                                             ("query", "cosmos_reason_ros.tools.query")])
def test_tool_help_names_only_commands_that_exist(
        command: str, module: str, capsys: pytest.CaptureFixture[str]) -> None:
    tool = importlib.import_module(module)
    with pytest.raises(SystemExit):
        tool.main(["--help"])
    text = capsys.readouterr().out
    scripts = _console_scripts()
    assert scripts[command] == f"{module}:main"
    assert text.startswith(f"usage: {command} ")
    run = re.findall(r"ros2 run cosmos_reason_ros (\S+)", text)
    assert run and set(run) <= set(scripts), run
    for name in re.findall(r"python -m (\S+)", text):
        assert importlib.util.find_spec(name) is not None, name
    # No other command names: a word like cosmos-reason-tiny-model is not installed.
    assert not re.search(r"cosmos[-_]reason[-_][a-z_-]+ --", text)


def test_interfaces_doc_lists_every_error_code() -> None:
    msg = (REPO / "cosmos_reason_interfaces" / "msg" / "ReasoningResult.msg").read_text()
    codes = re.findall(r"^uint8 ([A-Z_]+)=(\d+)", msg, re.MULTILINE)
    assert len(codes) >= 10
    doc = (REPO / "docs" / "INTERFACES.md").read_text(encoding="utf-8")
    for name, value in codes:
        assert re.search(rf"\|\s*{value}\s*\|\s*`{name}`\s*\|", doc), f"{name}={value}"


def test_jetson_guide_names_every_jetson_preset() -> None:
    guide = (REPO / "docs" / "JETSON.md").read_text(encoding="utf-8")
    for preset in ("jetson_orin_nano", "jetson_orin_nx", "jetson_agx_orin", "jetson_thor",
                   "remote_server"):
        assert f"`{preset}`" in guide or f"config:={preset}" in guide, preset


def test_an_empty_yaml_list_reaches_the_node_unset_and_means_empty() -> None:
    # rclpy hands a preset's '[]' over as an unset value (None): no element type to give it.
    values = {"engine.model": "nvidia/Cosmos-Reason2-2B", "cameras.names": None}
    assert validate(values).cameras.names == ()
