r"""Start the cosmos_reason node with a config preset.

    ros2 launch cosmos_reason_ros cosmos_reason.launch.py config:=jetson_agx_orin
    ros2 launch cosmos_reason_ros cosmos_reason.launch.py config:=/path/to/my.yaml \
        model:=/models/Cosmos-Reason2-2B image_topic:=/front_camera/image_raw
    ros2 launch cosmos_reason_ros cosmos_reason.launch.py config:=remote_server \
        endpoint:=http://gpu-box.local:8000/v1
    ros2 launch cosmos_reason_ros cosmos_reason.launch.py config:=x86_gpu depth:=true \
        image_topic:=/camera/color/image_raw \
        depth_topic:=/camera/aligned_depth_to_color/image_raw \
        camera_info_topic:=/camera/color/camera_info
    ros2 launch cosmos_reason_ros cosmos_reason.launch.py config:=x86_gpu \
        cameras:=front=/front/image_raw,wrist=/wrist/image_raw
    ros2 launch cosmos_reason_ros cosmos_reason.launch.py config:=x86_gpu autostart:=false
    ros2 launch cosmos_reason_ros cosmos_reason.launch.py config:=x86_gpu console:=true

`config` is a preset name (a file in this package's share/config/) or a path to a parameter
file; `model`, `engine` and `endpoint` override the preset when non-empty. Everything else is
a parameter in the file (docs/PARAMETERS.md). The node is a lifecycle node that configures
and activates itself; `autostart:=false` (`lifecycle.autostart`, a launch_ros LifecycleNode)
leaves it unconfigured for a lifecycle manager (docs/INTERFACES.md, "Lifecycle").
`console:=true` also starts the operator web console (the `console` command) for this node
on http://127.0.0.1:8080/.
"""

# LaunchDescription comes from its module, not `from launch import ...`: this repository's
# launch/ folder would make isort file the top-level `launch` package as first-party.
import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.launch_description import LaunchDescription
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

PACKAGE = "cosmos_reason_ros"
EXECUTABLE = "cosmos_reason_node"
CONSOLE_EXECUTABLE = "console"
# The presets are keyed "/**" (any node name and namespace), so `namespace` and a renamed
# node keep them; the node fails at start if a file given here applies to it nowhere.
NODE_NAME = "cosmos_reason"

# (name, default, description): a literal, so tests can read it without launch installed.
ARGUMENTS = (
    ("config", "x86_gpu",
     "Preset name (x86_gpu, jetson_orin_nano, jetson_orin_nx, jetson_agx_orin, jetson_thor, "
     "remote_server, cpu_demo) or a path to a parameter file."),
    ("model", "", "Overrides engine.model: checkpoint directory or hub name (vllm), or served "
     "model name (openai)."),
    ("engine", "", "Overrides engine.kind: vllm or openai."),
    ("endpoint", "", "Overrides engine.url, the server or router (openai), e.g. "
     "http://127.0.0.1:8000/v1."),
    ("image_topic", "/camera/image_raw", "sensor_msgs/Image topic (the node's 'image')."),
    ("compressed_topic", "", "sensor_msgs/CompressedImage topic (the node's "
     "'image/compressed'); empty = <image_topic>/compressed, image_transport's name."),
    ("depth", "false", "3D lifting (depth.enabled): needs depth registered to the colour "
     "image and the colour CameraInfo."),
    ("depth_topic", "/camera/aligned_depth_to_color/image_raw", "Registered depth "
     "sensor_msgs/Image topic (the node's 'depth/image'; 16UC1 mm or 32FC1 m)."),
    ("camera_info_topic", "/camera/color/camera_info", "CameraInfo of the colour camera "
     "(the node's 'camera_info')."),
    ("cameras", "", "Several named cameras as NAME=TOPIC pairs, comma-separated, the default "
     "camera first (e.g. front=/front/image_raw,wrist=/wrist/image_raw): sets cameras.names "
     "and remaps NAME/image to TOPIC and NAME/image/compressed to TOPIC/compressed; "
     "depth_topic and camera_info_topic then go to the first camera. Empty = one camera on "
     "image_topic."),
    ("namespace", "", "Namespace of the node (the preset applies in any namespace)."),
    ("use_sim_time", "false", "Use /clock (rosbag replay with --clock)."),
    ("log_level", "info", "Logging level: debug, info, warn, error, fatal."),
    ("autostart", "true", "Configure and activate the lifecycle node at start; false: it waits "
     "unconfigured for a lifecycle manager, e.g. nav2_lifecycle_manager (lifecycle.autostart)."),
    ("console", "false", "Also start the operator web console for this node (the console "
     "command) on http://127.0.0.1:8080/, showing image_topic or the cameras."),
)


def resolve_config(value):
    """Return the parameter file for a preset name or a path; fail with the choices."""
    if os.sep in value or value.endswith((".yaml", ".yml")):
        path = os.path.abspath(os.path.expanduser(value))
    else:
        path = os.path.join(get_package_share_directory(PACKAGE), "config", f"{value}.yaml")
    if not os.path.isfile(path):
        config_dir = os.path.join(get_package_share_directory(PACKAGE), "config")
        presets = sorted(f[:-5] for f in os.listdir(config_dir) if f.endswith(".yaml"))
        raise RuntimeError(f"config:={value!r}: no such file {path}; presets: "
                           f"{', '.join(presets)}, or give a path to a .yaml file")
    return path


def parse_cameras(value):
    """``front=/a/image,wrist=/b/image`` -> [("front", "/a/image"), ...]; fail naming the entry.

    Names are checked again by the node (cameras.names); here only the form.
    """
    cameras = []
    for entry in (e.strip() for e in value.split(",") if e.strip()):
        name, sep, topic = (part.strip() for part in entry.partition("="))
        if not sep or not name or not topic:
            raise RuntimeError(f"cameras:={value!r}: entry {entry!r} is not NAME=TOPIC "
                               f"(e.g. cameras:=front=/front/image_raw,wrist=/wrist/image_raw)")
        cameras.append((name, topic))
    return cameras


def _is_true(value):
    return value.strip().lower() in ("true", "1", "yes", "on")


def launch_node(context, *args, **kwargs):
    """Build the node from the evaluated launch arguments (OpaqueFunction)."""
    arg = {name: LaunchConfiguration(name).perform(context) for name, _, _ in ARGUMENTS}
    overrides = {"use_sim_time": _is_true(arg["use_sim_time"])}
    if arg["model"]:
        overrides["engine.model"] = arg["model"]
    if arg["engine"]:
        overrides["engine.kind"] = arg["engine"]
    if arg["endpoint"]:
        overrides["engine.url"] = arg["endpoint"]
    if _is_true(arg["depth"]):
        overrides["depth.enabled"] = True
    managed = not _is_true(arg["autostart"])
    if managed:
        overrides["lifecycle.autostart"] = False
    image_topic = arg["image_topic"]
    compressed_topic = arg["compressed_topic"] or f"{image_topic.rstrip('/')}/compressed"
    remappings = [("image", image_topic), ("image/compressed", compressed_topic),
                  ("depth/image", arg["depth_topic"]), ("camera_info", arg["camera_info_topic"])]
    cameras = parse_cameras(arg["cameras"])
    if cameras:  # each camera's topics are its name's: front/image, front/image/compressed
        overrides["cameras.names"] = [name for name, _ in cameras]
        remappings = [pair for name, topic in cameras for pair in (
            (f"{name}/image", topic), (f"{name}/image/compressed",
                                       f"{topic.rstrip('/')}/compressed"))]
        remappings += [(f"{cameras[0][0]}/depth/image", arg["depth_topic"]),
                       (f"{cameras[0][0]}/camera_info", arg["camera_info_topic"])]
    action = Node
    if managed:  # the same process; launch_ros's LifecycleNode also takes transition events
        from launch_ros.actions import LifecycleNode as action
    consoles = [console_node(arg)] if _is_true(arg["console"]) else []
    return [action(
        package=PACKAGE,
        executable=EXECUTABLE,
        name=NODE_NAME,
        namespace=arg["namespace"],
        # Later entries win: the launch overrides apply on top of the preset.
        parameters=[resolve_config(arg["config"]), overrides],
        remappings=remappings,
        arguments=["--ros-args", "--log-level", arg["log_level"]],
        output="screen",
        emulate_tty=True,
    )] + consoles


def console_node(arg):
    """The web console beside the node: a ROS client of it, showing the same camera topics."""
    namespace = arg["namespace"].strip("/")
    node_path = f"/{namespace}/{NODE_NAME}" if namespace else f"/{NODE_NAME}"
    shown = ["--cameras", arg["cameras"].replace(" ", "")] if arg["cameras"].strip() \
        else ["--image-topic", arg["image_topic"]]
    # No name or namespace of its own: launch_ros would pass them as --ros-args remaps, which
    # rename every node the process creates (its goal client's too).
    return Node(package=PACKAGE, executable=CONSOLE_EXECUTABLE,
                arguments=["--node", node_path, *shown], output="screen")


def generate_launch_description():
    """Declare the launch arguments and the node."""
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=description)
         for name, default, description in ARGUMENTS]
        + [OpaqueFunction(function=launch_node)])
