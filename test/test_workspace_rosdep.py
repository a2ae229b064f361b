"""The README's robot-workspace lines, run with the real rosdep and colcon, offline.

The repository root is a package (package.xml), and rosdep and colcon stop descending at a
folder that holds one, so the nested ``cosmos_reason_interfaces`` must be named as a path of
its own. Otherwise rosdep takes it for a system dependency and ``rosdep install`` fails with
"Cannot locate rosdep definition for [cosmos_reason_interfaces]".

rosdep runs against local data only: a sources list with one ``yaml file://`` entry (a
base.yaml written here with the keys our package.xml files name), a local rosdistro index
with no distributions, and ``ROS_HOME`` in a temporary folder. The workspace is
``ws/src/cosmos_reason_ros``, a link to this checkout, as the README's ``git clone`` makes it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from waiting import NEVER_S

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"cosmos_reason_ros": REPO_ROOT / "package.xml",
            "cosmos_reason_interfaces": REPO_ROOT / "cosmos_reason_interfaces" / "package.xml"}
DEPEND_TAGS = ("depend", "build_depend", "buildtool_depend", "exec_depend", "test_depend",
               "build_export_depend", "buildtool_export_depend")


def _tool(name: str) -> str:
    """The tool from this venv (the test's Python), else from PATH."""
    here = Path(sys.executable).parent / name
    path = str(here) if here.is_file() else shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (make setup installs it from requirements/lock-*)")
    return path


def _readme_command(tool: str, subcommand: str) -> list[str]:
    """The arguments of the README's ``<tool> <subcommand> ...`` line (one line, no comment)."""
    for line in (REPO_ROOT / "README.md").read_text().splitlines():
        if line.split()[:2] == [tool, subcommand]:
            return shlex.split(line, comments=True)[2:]
    raise AssertionError(f"README.md has no '{tool} {subcommand}' line")


def _dependency_keys() -> set[str]:
    keys = set()
    for path in PACKAGES.values():
        root = ET.parse(path).getroot()
        keys |= {e.text.strip() for tag in DEPEND_TAGS for e in root.iter(tag) if e.text}
    return keys


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A ``ws/src`` workspace holding this checkout and an initialized offline rosdep."""
    root = tmp_path_factory.mktemp("rosdep")
    ws = root / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "cosmos_reason_ros").symlink_to(REPO_ROOT, target_is_directory=True)
    # Every key resolves (to a made-up apt package) except our own packages' names.
    keys = sorted(_dependency_keys() - set(PACKAGES))
    (root / "base.yaml").write_text("".join(f"{k}:\n  ubuntu: [fake-{k}]\n" for k in keys))
    sources = root / "sources.list.d"
    sources.mkdir()
    (sources / "10-local.list").write_text(f"yaml {(root / 'base.yaml').as_uri()}\n")
    # rosdistro's index format needs its type and version besides the distributions.
    (root / "index.yaml").write_text("type: index\nversion: 4\ndistributions: {}\n")
    env = {**os.environ, "ROSDEP_SOURCE_PATH": str(sources),
           "ROSDISTRO_INDEX_URL": (root / "index.yaml").as_uri(),
           "ROS_HOME": str(root / "ros_home"), "ROS_PYTHON_VERSION": "3",
           "ROS_DISTRO": os.environ.get("COSMOS_REASON_ROS_DISTRO", "kilted"),
           # A fixed OS, so the apt rules of base.yaml apply on any machine.
           "ROS_OS_OVERRIDE": "ubuntu:24.04:noble"}
    # rosdep's --ignore-src also skips packages installed in these prefixes (env-<distro>.sh
    # puts this checkout's build there): a robot's fresh workspace has none of ours.
    for name in ("AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH", "COLCON_PREFIX_PATH",
                 "ROS_PACKAGE_PATH"):
        env.pop(name, None)
    proc = subprocess.run([_tool("rosdep"), "update"], env=env, capture_output=True, text=True,
                          timeout=NEVER_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return ws, env


def _rosdep(workspace: tuple[Path, dict[str, str]], *args: str) -> subprocess.CompletedProcess:
    ws, env = workspace
    return subprocess.run([_tool("rosdep"), *args], cwd=ws, env=env, capture_output=True,
                          text=True, timeout=NEVER_S)


def _from_paths(args: list[str]) -> list[str]:
    """The values of ``--from-paths`` in a rosdep argument list."""
    i = args.index("--from-paths") + 1
    paths = []
    while i < len(args) and not args[i].startswith("-"):
        paths.append(args[i])
        i += 1
    return paths


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_readme_rosdep_paths_do_not_ask_for_the_interface_package(workspace) -> None:
    args = _readme_command("rosdep", "install")
    proc = _rosdep(workspace, "keys", "--from-paths", *_from_paths(args), "--ignore-src")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    keys = set(proc.stdout.split())
    assert "cosmos_reason_interfaces" not in keys
    # Both package.xml files were read: a key only the root names and one only the nested names.
    assert {"rclpy", "rosidl_default_generators"} <= keys
    assert keys == _dependency_keys() - set(PACKAGES)


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_readme_rosdep_install_line_resolves_every_key(workspace) -> None:
    args = _readme_command("rosdep", "install")
    proc = _rosdep(workspace, "install", "--simulate", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fake-rclpy" in proc.stdout and "Cannot locate" not in proc.stderr


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_the_root_path_alone_misses_the_nested_package(workspace) -> None:
    # The failure the README's second path prevents, reproduced with the same rosdep data.
    proc = _rosdep(workspace, "keys", "--from-paths", "src", "--ignore-src")
    assert "cosmos_reason_interfaces" in proc.stdout.split()
    proc = _rosdep(workspace, "install", "--simulate", "--from-paths", "src", "--ignore-src")
    assert proc.returncode != 0
    assert "Cannot locate rosdep definition for [cosmos_reason_interfaces]" in proc.stderr


@pytest.mark.slow  # starts processes or waits on real time: the real tier
def test_readme_colcon_paths_find_both_packages_once(workspace) -> None:
    ws, env = workspace
    args = _readme_command("colcon", "build")
    i = args.index("--base-paths") + 1
    base_paths = []
    while i < len(args) and not args[i].startswith("-"):
        base_paths.append(args[i])
        i += 1
    proc = subprocess.run([_tool("colcon"), "--log-base", os.devnull, "list", "--names-only",
                           "--base-paths", *base_paths], cwd=ws, env=env, capture_output=True,
                          text=True, timeout=NEVER_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.split()) == sorted(PACKAGES)
