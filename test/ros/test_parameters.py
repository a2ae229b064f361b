"""The node's parameters as ROS sees them: presets under any namespace, descriptors, types.

Fast tier: ``declare_and_load`` on a plain in-process rclpy node created with the same
command-line arguments the node process gets (``--params-file``, ``-r __ns:=``, ``-p``), so
rcl's own parameters-file parsing and rclpy's section matching decide what reaches the node.
Real tier (one node process, module fixture): what only a process proves, that the presets
apply and the descriptors and types hold for ``ros2 param`` users (rcl_interfaces services of
``/robot1/cosmos_reason``), and that a parameters file for another node name stops it at
start. The process uses the remote_server preset with no server behind it: it is ready in a
few seconds without an engine, which nothing here needs.
"""

from __future__ import annotations

import concurrent.futures
import math
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from rcl_interfaces.msg import Parameter as ParameterMsg  # noqa: E402
from rcl_interfaces.msg import ParameterType, ParameterValue  # noqa: E402
from rcl_interfaces.srv import (  # noqa: E402
    DescribeParameters,
    GetParameters,
    SetParameters,
)
from rclpy.context import Context  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from waiting import DISCOVERY_S, NEVER_S  # noqa: E402

from cosmos_reason_ros.config import (  # noqa: E402
    PARAMS,
    RUNTIME_PARAMS,
    ConfigError,
    Range,
    load_yaml_params,
    validate,
)
from cosmos_reason_ros.core.params import NodeParams  # noqa: E402
from cosmos_reason_ros.ros.config import declare_and_load  # noqa: E402

pytestmark = [pytest.mark.ros]

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "config").glob("*.yaml"))
HUB_MODEL = "nvidia/Cosmos-Reason2-2B"  # any vllm model value that needs no files


# --- in-process: declare_and_load on a plain node ------------------------------------------

class InProcess:
    """Plain rclpy nodes on one context, created like the node process from its arguments."""

    def __init__(self) -> None:
        self.context = Context()
        rclpy.init(context=self.context, args=[])
        self.nodes: list[Any] = []

    def node(self, args: list[str], name: str = "cosmos_reason") -> Any:
        # cli_args are rcl arguments exactly as on a command line; global ones (sys.argv of
        # this pytest run) must not reach the node.
        node = rclpy.create_node(name, context=self.context, cli_args=args,
                                 use_global_arguments=False, start_parameter_services=False)
        self.nodes.append(node)
        return node

    def load(self, args: list[str], name: str = "cosmos_reason") -> tuple[Any, NodeParams]:
        node = self.node(args, name)
        return node, declare_and_load(node, argv=args)

    def close(self) -> None:
        for node in self.nodes:
            node.destroy_node()
        rclpy.try_shutdown(context=self.context)


@pytest.fixture
def ros() -> Iterator[InProcess]:
    ros = InProcess()
    yield ros
    ros.close()


def ros_args(params_file: Path | str | None = None, namespace: str = "",
             **params: str) -> list[str]:
    args = ["--ros-args"]
    if params_file is not None:
        args += ["--params-file", str(params_file)]
    if namespace:
        args += ["-r", f"__ns:={namespace}"]
    for name, value in params.items():
        args += ["-p", f"{name.replace('__', '.')}:={value}"]
    return args


def write(tmp_path: Path, text: str, name: str = "params.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("namespace,name", [("", "cosmos_reason"), ("/robot1", "cosmos_reason"),
                                            ("/fleet/robot2", "reasoner")])
@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_preset_applies_under_any_namespace_and_node_name(ros, preset, namespace, name):
    args = ros_args(preset, namespace, engine__model=HUB_MODEL)
    node, values = ros.load(args, name)
    assert node.get_fully_qualified_name() == f"{namespace}/{name}"
    expected = load_yaml_params(str(preset))
    expected["engine.model"] = HUB_MODEL
    expected = {k: v for k, v in validate(expected).to_values().items() if k in expected}
    assert len(expected) >= 4
    assert {k: values.to_values()[k] for k in expected} == expected
    assert {k: node.get_parameter(k).value for k in expected} == expected


def test_cpu_demo_under_robot1_is_not_the_code_defaults(ros):
    # The values the issue saw fall back to defaults (4096, auto, 8192, 2.0).
    _, v = ros.load(ros_args(REPO / "config" / "cpu_demo.yaml", "/robot1",
                             engine__model=HUB_MODEL))
    assert (v.limits.max_tokens, v.engine.dtype, v.engine.max_model_len,
            v.image.max_age_s) == (512, "float32", 4096, 5.0)


def test_file_keyed_for_another_node_name_stops_the_node_naming_it(ros, tmp_path):
    text = (REPO / "config" / "cpu_demo.yaml").read_text(encoding="utf-8")
    old_style = write(tmp_path, text.replace("/**:", "cosmos_reason:"), "old_style.yaml")
    # Without a namespace the section names the node, and applies ...
    _, v = ros.load(ros_args(old_style, engine__model=HUB_MODEL))
    assert v.limits.max_tokens == 512
    # ... under /robot1 it does not: refused, naming the file, its section and the fix.
    with pytest.raises(ConfigError) as e:
        ros.load(ros_args(old_style, "/robot1", engine__model=HUB_MODEL))
    message = str(e.value)
    assert str(old_style) in message and "/robot1/cosmos_reason" in message
    assert "'/cosmos_reason'" in message and "'/**:'" in message


@pytest.mark.parametrize("key", ["/robot1/cosmos_reason", "robot1/cosmos_reason",
                                 "robot1:\n  cosmos_reason", "/**"])
def test_sections_naming_the_node_in_its_namespace_apply(ros, tmp_path, key):
    lines = key.split("\n")
    indent = "  " * len(lines)
    text = "\n".join(lines) + ":\n" + f"{indent}ros__parameters:\n" + \
        f"{indent}  limits:\n{indent}    max_tokens: 77\n"
    path = write(tmp_path, text)
    node, v = ros.load(ros_args(path, "/robot1", engine__model=HUB_MODEL))
    assert v.limits.max_tokens == 77
    assert node.get_parameter("limits.max_tokens").value == 77


def test_a_file_among_several_that_applies_nowhere_is_still_reported(ros, tmp_path):
    good = write(tmp_path, "/**:\n  ros__parameters:\n    limits:\n      max_tokens: 77\n",
                 "good.yaml")
    other = write(tmp_path, "/camera_driver:\n  ros__parameters:\n    fps: 30\n", "other.yaml")
    args = ros_args(good, "/robot1", engine__model=HUB_MODEL)
    args += ["--params-file", str(other)]
    with pytest.raises(ConfigError, match=r"other\.yaml sets nothing for node /robot1/cosmos_"
                                          r"reason: none of its sections \('/camera_driver'\)"):
        ros.load(args)


@pytest.mark.parametrize("where", ["file", "-p"])
def test_unknown_parameter_names_stop_the_node_listing_them(ros, tmp_path, where):
    if where == "file":
        path = write(tmp_path, "/**:\n  ros__parameters:\n    limits:\n      max_token: 5\n"
                     "    engine:\n      modle: x\n")
        args = ros_args(path, engine__model=HUB_MODEL)
    else:
        args = ros_args(engine__model=HUB_MODEL, limits__max_token="5", engine__modle="x")
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) for node /cosmos_reason: "
                                          r"engine\.modle, limits\.max_token"):
        ros.load(args)


def test_a_removed_parameter_stops_the_node_naming_its_replacement(ros, tmp_path):
    # engine.endpoints (several servers, least-busy) became engine.url + engine.fallback_urls:
    # an old preset must not start with the default URL instead of the user's servers.
    path = write(tmp_path, "/**:\n  ros__parameters:\n    engine:\n      kind: openai\n"
                 "      endpoints: ['http://gpu:8000/v1']\n")
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) for node /cosmos_reason: "
                                          r"engine\.endpoints; engine\.endpoints was replaced "
                                          r"by engine\.url \(the server or router\) plus "
                                          r"engine\.fallback_urls"):
        ros.load(ros_args(path))


def test_ros_own_parameters_are_not_unknown(ros, tmp_path):
    path = write(tmp_path, "/**:\n  ros__parameters:\n    use_sim_time: true\n    limits:\n"
                 "      max_tokens: 77\n")
    node, v = ros.load(ros_args(path, engine__model=HUB_MODEL))
    assert v.limits.max_tokens == 77
    assert node.get_parameter("use_sim_time").value is True


def test_integers_written_for_doubles_are_declared_as_doubles(ros, tmp_path):
    path = write(tmp_path, "/**:\n  ros__parameters:\n    image:\n      max_age_s: 5\n")
    node, v = ros.load(ros_args(path, engine__model=HUB_MODEL,
                                prefill__ready_frame_within_s="0"))
    for name, value, loaded in (("image.max_age_s", 5.0, v.image.max_age_s),
                                ("prefill.ready_frame_within_s", 0.0,
                                 v.prefill.ready_frame_within_s)):
        declared = node.get_parameter(name)
        assert declared.type_ is Parameter.Type.DOUBLE, name
        assert declared.value == value and isinstance(loaded, float)


def test_a_double_written_for_an_integer_is_refused_naming_it(ros):
    with pytest.raises(ConfigError, match=r"limits\.max_tokens=512\.5: expected int"):
        ros.load(ros_args(engine__model=HUB_MODEL, limits__max_tokens="512.5"))


def test_runtime_double_keeps_its_type_when_set_with_an_integer(ros):
    node, _ = ros.load(ros_args(engine__model=HUB_MODEL, prefill__ready_frame_within_s="0.5"))
    name = "prefill.ready_frame_within_s"
    (result,) = node.set_parameters([Parameter(name, Parameter.Type.INTEGER, 0)])
    assert not result.successful
    assert "type" in result.reason.lower()
    declared = node.get_parameter(name)
    assert (declared.type_, declared.value) == (Parameter.Type.DOUBLE, 0.5)
    (result,) = node.set_parameters([Parameter(name, Parameter.Type.DOUBLE, 0.0)])
    assert result.successful, result.reason
    assert node.get_parameter(name).type_ is Parameter.Type.DOUBLE


def test_descriptors_carry_the_tables_constraints(ros):
    node, _ = ros.load(ros_args(engine__model=HUB_MODEL))
    descriptors = dict(zip([p.name for p in PARAMS],
                           node.describe_parameters([p.name for p in PARAMS]), strict=True))
    for p in PARAMS:
        d = descriptors[p.name]
        assert d.description == p.description, p.name
        assert d.read_only is (p.name not in RUNTIME_PARAMS), p.name
        assert not d.dynamic_typing, p.name
        if p.check is None:
            assert not d.additional_constraints and not d.integer_range \
                and not d.floating_point_range, p.name
            continue
        assert d.additional_constraints == f"allowed: {p.allowed}", p.name
        if isinstance(p.check, Range) and isinstance(p.default, float):
            (r,) = d.floating_point_range
            assert (r.from_value, r.to_value, r.step) == (p.check.low, p.check.high, 0.0)
        elif isinstance(p.check, Range):
            (r,) = d.integer_range
            assert r.from_value == p.check.low and r.step == 0, p.name
            assert r.to_value == (2**63 - 1 if p.check.high == math.inf else p.check.high)
        else:
            assert not d.integer_range and not d.floating_point_range, p.name
    assert descriptors["engine.kind"].additional_constraints == "allowed: vllm, openai"
    (r,) = descriptors["prefill.ready_frame_within_s"].floating_point_range
    assert (r.from_value, r.to_value) == (0.0, 10.0)
    # The open bound (> 0) is in the words; ROS ranges are inclusive.
    assert descriptors["engine.gpu_memory_utilization"].additional_constraints == \
        "allowed: > 0.0, <= 1.0"


def test_runtime_value_outside_the_range_is_refused_by_ros(ros):
    node, _ = ros.load(ros_args(engine__model=HUB_MODEL))
    (result,) = node.set_parameters([Parameter("prefill.ready_frame_within_s",
                                               Parameter.Type.DOUBLE, 11.0)])
    assert not result.successful and "out of range" in result.reason


# --- engine.model that is a path -----------------------------------------------------------

def test_mistyped_model_path_names_the_parameter_and_the_path(tmp_path):
    (tmp_path / "Cosmos-Reason2-2B").mkdir()
    missing = tmp_path / "Cosmos-Reason2-2b"
    with pytest.raises(ConfigError) as e:
        validate({"engine.model": str(missing)})
    message = str(e.value)
    assert f"engine.model='{missing}': no such directory {missing}" in message
    assert f"nearest existing folder is {tmp_path}, with folders: Cosmos-Reason2-2B" in message
    assert "cannot detect the model family" not in message
    with pytest.raises(ConfigError, match=r"engine\.model='/nonexistent/model': no such "
                                          r"directory /nonexistent/model"):
        validate({"engine.model": "/nonexistent/model"})
    file = tmp_path / "weights.safetensors"
    file.write_bytes(b"")
    with pytest.raises(ConfigError, match="is a file, not a checkpoint directory"):
        validate({"engine.model": str(file)})


def test_model_values_that_are_not_local_paths_are_left_to_the_engine(tmp_path):
    validate({"engine.model": HUB_MODEL})  # a hub id
    validate({"engine.model": str(tmp_path)})  # an existing directory
    # A served model name (openai) is the server's, often the path on the server.
    validate({"engine.kind": "openai", "engine.model": "/models/Cosmos-Reason2-2B"})


# --- real tier: one node process in /robot1 ------------------------------------------------

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def robot1():
    from node_process import NodeProcess
    from spun_node import SpunNode

    # No server at the endpoint: the node is ready after start_timeout_s (goals would fail
    # with ENGINE_UNAVAILABLE; none are sent here).
    proc = NodeProcess("remote_server", {
        "engine.url": f"http://127.0.0.1:{_closed_port()}/v1",
        "engine.start_timeout_s": 1.0}, remaps=["__ns:=/robot1"])
    side = None
    try:
        proc.wait_ready(NEVER_S)
        side = SpunNode("parameters_test")
        yield proc, side
    finally:
        if side is not None:
            side.close()
        code = proc.stop()
    assert code == 0, proc.output[-3000:]


def call(side: Any, srv: type, name: str, request: Any) -> Any:
    client = side.node.create_client(srv, f"/robot1/cosmos_reason/{name}")
    try:
        assert client.wait_for_service(timeout_sec=DISCOVERY_S), name
        # The side node's executor spins in its own thread and completes the rclpy future.
        waiter: concurrent.futures.Future = concurrent.futures.Future()
        client.call_async(request).add_done_callback(lambda f: waiter.set_result(f.result()))
        return waiter.result(timeout=NEVER_S)
    finally:
        side.node.destroy_client(client)


def get_values(side: Any, names: list[str]) -> dict[str, ParameterValue]:
    response = call(side, GetParameters, "get_parameters", GetParameters.Request(names=names))
    return dict(zip(names, response.values, strict=True))


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_process_in_a_namespace_runs_with_its_preset(robot1):
    proc, side = robot1
    assert "[robot1.cosmos_reason]: ready: " in proc.output  # the namespaced node's log
    v = get_values(side, ["engine.kind", "model.family", "limits.max_concurrent_goals",
                          "engine.read_timeout_s"])
    # remote_server's values, not the code defaults (vllm, auto, 8, 30.0).
    assert v["engine.kind"].string_value == "openai"
    assert v["model.family"].string_value == "cosmos_reason2"
    assert v["limits.max_concurrent_goals"].integer_value == 16
    assert v["engine.read_timeout_s"].double_value == 60.0


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_process_describes_constraints_for_ros2_param_describe(robot1):
    _, side = robot1
    names = ["prefill.ready_frame_within_s", "limits.max_tokens", "engine.kind"]
    response = call(side, DescribeParameters, "describe_parameters",
                    DescribeParameters.Request(names=names))
    d = dict(zip(names, response.descriptors, strict=True))
    (fr,) = d["prefill.ready_frame_within_s"].floating_point_range
    assert (fr.from_value, fr.to_value, fr.step) == (0.0, 10.0, 0.0)
    (ir,) = d["limits.max_tokens"].integer_range
    assert (ir.from_value, ir.to_value, ir.step) == (1, 1_000_000, 0)
    assert d["engine.kind"].additional_constraints == "allowed: vllm, openai"
    assert not any(x.dynamic_typing for x in d.values())


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_process_keeps_a_double_a_double_when_set_with_an_integer(robot1):
    _, side = robot1
    name = "prefill.ready_frame_within_s"

    def set_value(value: ParameterValue) -> Any:
        request = SetParameters.Request(parameters=[ParameterMsg(name=name, value=value)])
        (result,) = call(side, SetParameters, "set_parameters", request).results
        return result

    refused = set_value(ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=0))
    assert not refused.successful and "type" in refused.reason.lower()
    value = get_values(side, [name])[name]
    assert value.type == ParameterType.PARAMETER_DOUBLE
    accepted = set_value(ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=0.25))
    assert accepted.successful, accepted.reason
    value = get_values(side, [name])[name]
    assert (value.type, value.double_value) == (ParameterType.PARAMETER_DOUBLE, 0.25)


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_process_given_a_file_for_another_node_name_stops_at_start(tmp_path):
    from node_process import NodeProcess

    text = (REPO / "config" / "cpu_demo.yaml").read_text(encoding="utf-8")
    old_style = write(tmp_path, text.replace("/**:", "cosmos_reason:"), "old_style.yaml")
    # NodeProcess takes a preset name under config/; an absolute path without ".yaml" names
    # any file (pathlib drops the config/ prefix before an absolute part).
    proc = NodeProcess(str(old_style.with_suffix("")), {"engine.model": HUB_MODEL},
                       remaps=["__ns:=/robot1"])
    try:
        code = proc.proc.wait(NEVER_S)
    finally:
        proc.stop()
    assert code == 2, proc.output[-3000:]
    assert f"parameters file {old_style} sets nothing for node /robot1/cosmos_reason" in \
        proc.output
