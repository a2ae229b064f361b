"""docs/PLANNERS.md's snippets: each configuration parses and its command takes its arguments.

The blackboard table is the behaviours' docstring's (scripts/gen_planners_doc.py renders it);
each ``json`` block is an agent's ``mcpServers`` configuration: a stdio entry is accepted by
the SDK's ``StdioServerParameters`` and the ``reason_mcp`` command it runs takes its arguments,
an HTTP entry names the server's ``/mcp`` path on a port the page's commands serve, with a
bearer token off loopback. (The shell lines are test/test_commands.py's: every flag must be in
the command's ``--help``; the ``python`` blocks run in test/test_documented_python.py.)
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

mcp = pytest.importorskip("mcp", reason="needs the mcp SDK (make setup)")

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "PLANNERS.md"
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import gen_planners_doc  # noqa: E402

TEXT = DOC.read_text(encoding="utf-8")


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", TEXT, re.MULTILINE | re.DOTALL)


def servers() -> list[tuple[str, dict]]:
    return [(name, entry) for block in blocks("json")
            for name, entry in json.loads(block)["mcpServers"].items()]


def reason_mcp_args(command: str, args: list[str]) -> list[str]:
    """The arguments ``reason_mcp`` gets from an entry's command (directly or in ``bash -c``)."""
    if command == "reason_mcp":
        return args
    assert command == "bash" and args[0] == "-c", (command, args)
    for part in args[1].split("&&"):
        words = shlex.split(part)
        words = words[1:] if words[:1] == ["exec"] else words
        for prefix in (["reason_mcp"], ["ros2", "run", "cosmos_reason_ros", "reason_mcp"]):
            if words[:len(prefix)] == prefix:
                return words[len(prefix):]
    raise AssertionError(f"no reason_mcp in {args[1]!r}")


def test_the_blackboard_table_is_the_behaviours_docstring() -> None:
    source = gen_planners_doc.SOURCE.read_text(encoding="utf-8")
    assert gen_planners_doc.render(TEXT, source) == TEXT, \
        f"docs/PLANNERS.md is stale: {gen_planners_doc.COMMAND}"
    assert "| `Verify` | `verdict_key` |" in TEXT


def test_the_stdio_configuration_starts_reason_mcp_with_arguments_it_takes() -> None:
    from cosmos_reason_ros.planning.mcp_server import build_parser

    stdio = [(name, entry) for name, entry in servers() if "command" in entry]
    assert stdio, "docs/PLANNERS.md: no stdio configuration"
    for name, entry in stdio:
        params = mcp.StdioServerParameters(command=entry["command"], args=entry["args"],
                                           env=entry.get("env"))
        assert "ROS_DOMAIN_ID" in (params.env or {}), name  # the ROS variables are passed
        args = build_parser().parse_args(reason_mcp_args(params.command, params.args))
        assert args.transport == "stdio", name


def test_the_http_configuration_names_a_served_url_and_the_token_off_loopback() -> None:
    http = [(name, entry) for name, entry in servers() if "url" in entry]
    assert http, "docs/PLANNERS.md: no streamable HTTP configuration"
    served_ports = set(re.findall(r"reason_mcp --transport http .*--port (\d+)", TEXT))
    for name, entry in http:
        url = urlparse(entry["url"])
        assert url.scheme == "http" and url.path == "/mcp", name
        assert str(url.port) in served_ports, (name, served_ports)
        try:
            loopback = ipaddress.ip_address(url.hostname).is_loopback
        except ValueError:
            loopback = url.hostname == "localhost"
        if not loopback:
            assert entry["headers"]["Authorization"].startswith("Bearer "), name

