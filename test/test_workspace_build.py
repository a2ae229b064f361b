"""The README's robot instructions: both packages build with colcon in a workspace layout."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Every CI leg's setup already builds both packages with colcon on its distro and Python; this
# adds the workspace layout (ws/src, the nested interface package), which does not depend on it.
pytestmark = [pytest.mark.ros, pytest.mark.slow, pytest.mark.first_distro_only]


def test_colcon_builds_both_packages_in_a_workspace(tmp_path):
    colcon = shutil.which("colcon")
    if colcon is None:
        pytest.fail("colcon is not installed (make setup installs it)")
    src = tmp_path / "ws" / "src" / "cosmos_reason_ros"
    shutil.copytree(REPO_ROOT, src, ignore=shutil.ignore_patterns(
        ".venv-*", "build", "install", "log", "out", ".git", "__pycache__", ".cache"))
    venv = Path(sys.prefix)
    env = {**os.environ, "AMENT_PREFIX_PATH": str(venv), "CMAKE_PREFIX_PATH": str(venv)}
    env.pop("COLCON_PREFIX_PATH", None)
    proc = subprocess.run(
        [colcon, "build", "--base-paths", "src", "src/cosmos_reason_ros/cosmos_reason_interfaces",
         "--event-handlers", "console_direct-", "--cmake-args", "-DBUILD_TESTING=OFF",
         f"-DPython3_EXECUTABLE={sys.executable}"],
        cwd=tmp_path / "ws", env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    install = tmp_path / "ws" / "install"
    assert (install / "cosmos_reason_interfaces" / "share" / "cosmos_reason_interfaces" /
            "action" / "Reason.action").is_file()
    share = install / "cosmos_reason_ros" / "share" / "cosmos_reason_ros"
    assert (share / "launch" / "cosmos_reason.launch.py").is_file()
    assert (share / "config" / "cpu_demo.yaml").is_file()
    for script in ("cosmos_reason_node", "query", "demo", "console"):
        assert (install / "cosmos_reason_ros" / "lib" / "cosmos_reason_ros" / script).is_file()
    # The console's page is not Python: it is installed only through setup.py's package_data.
    static = REPO_ROOT / "cosmos_reason_ros" / "console" / "static"
    installed = list(install.glob("cosmos_reason_ros/lib/python3*/site-packages/"
                                  "cosmos_reason_ros/console/static"))
    assert len(installed) == 1, installed
    assert sorted(p.name for p in installed[0].iterdir()) == \
        sorted(p.name for p in static.iterdir() if p.is_file())
