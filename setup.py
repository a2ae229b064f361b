from glob import glob

from setuptools import find_packages, setup

package_name = "cosmos_reason_ros"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    # The console's page (HTML, CSS, JavaScript), served from the installed package.
    package_data={"cosmos_reason_ros.console": ["static/*"],
                  "cosmos_reason_ros": ["*.xml"]},
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{package_name}"]),
        (f"share/{package_name}", ["package.xml"]),
        (f"share/{package_name}/launch", glob("launch/*.launch.py")),
        (f"share/{package_name}/config", glob("config/*.yaml")),
        (f"share/{package_name}/config/scenarios", glob("config/scenarios/*.yaml")),
    ],
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="cosmos_reason_ros maintainers",
    maintainer_email="maintainers@cosmos-reason-ros.dev",
    description="Visual reasoning for ROS 2 robots with NVIDIA Cosmos-Reason on vLLM.",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "cosmos_reason_node = cosmos_reason_ros.ros.node:main",
            "query = cosmos_reason_ros.tools.query:main",
            "demo = cosmos_reason_ros.tools.demo:main",
            "replay = cosmos_reason_ros.eval.replay:main",
            "demo_recording = cosmos_reason_ros.eval.demo_recording:main",
            "tiny_model = cosmos_reason_ros.eval.tiny_model:main",
            "bench = cosmos_reason_ros.bench.runner:main",
            "soak = cosmos_reason_ros.bench.soak:main",
            "console = cosmos_reason_ros.console.server:main",
            "reason_patrol = cosmos_reason_ros.planning.patrol:main",
            "reason_mcp = cosmos_reason_ros.planning.mcp_server:main",
        ],
    },
)
