"""Example behaviour tree: verify the aisle is clear; otherwise find the obstacle, publish its pose.

    ros2 run cosmos_reason_ros reason_patrol
    ros2 run cosmos_reason_ros reason_patrol --obstacle pallet --obstacle box --cycles 5
    python -m cosmos_reason_ros.planning.patrol --statement "The corridor is empty." --cameras front

The tree, ticked at --rate-hz (every tick returns at once; goals run in the background):

    Selector "patrol"
      Verify "aisle clear?"                  the statement; yes ends the cycle
      Sequence "obstacle"
        Ground "find obstacle"               boxes -> /patrol/obstacle_boxes (pixels),
                                             pose  -> /patrol/obstacle_pose (where lifted)
        PublishPose "publish obstacle pose"  /patrol/obstacle_pose -> ~/obstacle_pose

One line per cycle on stdout (clear, the obstacle's pose or pixels, or why the cycle failed);
a new cycle starts --period-s after the last one ended. The pose is published only when the
node lifted the box to 3D (depth input on: README, "3D"). Exit status 0 after --cycles cycles
or Ctrl-C, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import py_trees
from py_trees.blackboard import Blackboard
from py_trees.common import Access, Status

from cosmos_reason_ros.client import ReasonClient
from cosmos_reason_ros.planning.behaviours import Ground, Verify

STATEMENT = "The aisle ahead is clear of obstacles."
POSE_KEY = "/patrol/obstacle_pose"
BOXES_KEY = "/patrol/obstacle_boxes"
VERDICT_KEY = "/patrol/verdict"
REASON_KEY = "/patrol/reason"


def camera_list(text: str) -> list[str]:
    """``--cameras front,wrist``: the node's camera names, comma-separated."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"--cameras {text!r}: an empty name; give camera "
                                         "names separated by commas, e.g. front,wrist")
    return names


def build_parser() -> argparse.ArgumentParser:
    """Build the command-line parser."""
    ap = argparse.ArgumentParser(prog="reason_patrol", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--statement", default=STATEMENT, help="what must hold for the aisle to "
                    "count as clear (a verify goal)")
    ap.add_argument("--obstacle", action="append", default=None, metavar="TARGET",
                    help="what to ground when it is not clear; repeat for several "
                    "(default: obstacle)")
    ap.add_argument("--cameras", type=camera_list, default=[], metavar="NAMES",
                    help="the node's cameras to ask about (default: its default camera)")
    ap.add_argument("--source", choices=("latest", "next"), default="latest")
    ap.add_argument("--timeout-s", type=float, default=30.0, help="each goal's limit")
    ap.add_argument("--period-s", type=float, default=1.0,
                    help="pause between one cycle's end and the next one's start")
    ap.add_argument("--rate-hz", type=float, default=20.0, help="tick rate while a cycle runs")
    ap.add_argument("--cycles", type=int, default=0, help="stop after N cycles (0: never)")
    ap.add_argument("--action", default="/cosmos_reason/reason", help="action name")
    ap.add_argument("--pose-topic", default="~/obstacle_pose",
                    help="where the obstacle's PoseStamped goes")
    return ap


def build_tree(client: ReasonClient, publish: Callable[[Any], None],
               args: argparse.Namespace) -> py_trees.composites.Selector:
    """Return the patrol tree's root; ``publish(pose)`` sends the obstacle's pose."""
    common = {"client": client, "cameras": args.cameras, "source": args.source,
              "timeout_s": args.timeout_s}
    clear = Verify("aisle clear?", args.statement, verdict_key=VERDICT_KEY,
                   reason_key=REASON_KEY, **common)
    find = Ground("find obstacle", args.obstacle or ["obstacle"], boxes_key=BOXES_KEY,
                  pose_key=POSE_KEY, **common)
    obstacle = py_trees.composites.Sequence("obstacle", memory=True,
                                            children=[find, PublishPose(publish)])
    return py_trees.composites.Selector("patrol", memory=True, children=[clear, obstacle])


class PublishPose(py_trees.behaviour.Behaviour):
    """Publish the obstacle's pose from the blackboard; FAILURE when it was not lifted."""

    def __init__(self, publish: Callable[[Any], None],
                 name: str = "publish obstacle pose") -> None:
        """``publish(pose)``: e.g. a ``PoseStamped`` publisher's ``publish``."""
        super().__init__(name)
        self.publish = publish
        self.board = self.attach_blackboard_client(name=name)
        self.board.register_key(POSE_KEY, access=Access.READ)

    def update(self) -> Status:
        """Publish the pose, if the node lifted the obstacle to 3D."""
        pose = self.board.get(POSE_KEY)
        if pose is None:
            self.feedback_message = "not lifted to 3D: no pose to publish"
            return Status.FAILURE
        self.publish(pose)
        self.feedback_message = "pose published"
        return Status.SUCCESS


def describe(root: py_trees.composites.Selector) -> str:
    """Return one line for an ended cycle, from the tree and the blackboard."""
    clear, obstacle = root.children
    find, publish = obstacle.children
    if clear.status == Status.SUCCESS:
        return f"aisle clear: {Blackboard.get(REASON_KEY)}"
    why = f"not clear ({clear.feedback_message})"
    if find.status != Status.SUCCESS:
        return f"{why}; obstacle not found: {find.feedback_message}"
    box = Blackboard.get(BOXES_KEY)[0]
    pixels = f"{box.label!r} at pixels ({box.x_min:.0f}, {box.y_min:.0f}, {box.x_max:.0f}, " \
             f"{box.y_max:.0f})"
    if publish.status != Status.SUCCESS:
        return f"{why}; obstacle {pixels}, {publish.feedback_message}"
    pose = Blackboard.get(POSE_KEY)
    p = pose.pose.position
    return (f"{why}; obstacle {pixels}, at ({p.x:.2f}, {p.y:.2f}, {p.z:.2f}) m in "
            f"{pose.header.frame_id}: pose published")


def main(argv: list[str] | None = None) -> int:
    """Tick the patrol tree until --cycles cycles have ended, or Ctrl-C."""
    import rclpy
    from rclpy.utilities import remove_ros_args

    argv = remove_ros_args(args=sys.argv if argv is None else ["reason_patrol", *argv])[1:]
    args = build_parser().parse_args(argv)
    if not (args.timeout_s > 0 and args.period_s >= 0 and args.rate_hz > 0
            and args.cycles >= 0):
        print("reason_patrol: --timeout-s and --rate-hz must be > 0, --period-s and --cycles "
              ">= 0", file=sys.stderr)
        return 2
    from geometry_msgs.msg import PoseStamped
    from rclpy.context import Context

    context = Context()
    rclpy.init(context=context)
    node = rclpy.create_node("reason_patrol", context=context)
    publisher = node.create_publisher(PoseStamped, args.pose_topic, 10)
    cycles = 0
    try:
        with ReasonClient(args.action) as client:
            root = build_tree(client, publisher.publish, args)
            next_start = time.monotonic()
            while (args.cycles == 0 or cycles < args.cycles) and context.ok():
                if root.status == Status.RUNNING or time.monotonic() >= next_start:
                    root.tick_once()
                    if root.status != Status.RUNNING:
                        cycles += 1
                        print(f"cycle {cycles}: {describe(root)}", flush=True)
                        next_start = time.monotonic() + args.period_s
                time.sleep(1.0 / args.rate_hz)  # the tick rate: ticks never block
    except KeyboardInterrupt:
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown(context=context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
