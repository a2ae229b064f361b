"""One-shot command-line action client: ask the node, stream the text, print the result.

    ros2 run cosmos_reason_ros query --prompt "What is on the table?"
    ros2 run cosmos_reason_ros query --task ground --targets "red cup" --image cup.jpg
    ros2 run cosmos_reason_ros query --prompt "Is the part in the gripper?" --cameras front,wrist

The streamed model text goes to stderr as it arrives; the final result goes to stdout as one
JSON object (so ``| jq`` works). Exit status: 0 succeeded, 1 aborted/canceled/rejected/not
delivered (a lost request or reply, named)/no answer in time, 2 usage error.

Two time limits, kept apart:
  --goal-timeout S  the goal's own limit (its timeout_s): the node aborts the goal with TIMEOUT
                    after S seconds; 0 (default) = the node's limits.goal_timeout_s.
  --timeout S       how long this command waits, for the action server and then the result;
                    when it passes, the goal is cancelled, the node's reply (status canceled)
                    is printed and the command exits 1. Make it longer than the goal's limit
                    to see the node's own TIMEOUT result.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
from pathlib import Path
from typing import Any

from cosmos_reason_ros.client import SOURCES
from cosmos_reason_ros.core.plain import to_plain

# The client's default wait: longer than the node's default goal limit (120 s), so a goal
# that runs out of time ends with the node's TIMEOUT result rather than a cancel from here.
WAIT_S = 150.0
# After --timeout, how long to wait for the node's result of the cancel: the goal's end is
# printed (as any result) rather than left unknown.
CANCEL_REPLY_S = 10.0


def camera_list(text: str) -> list[str]:
    """``--cameras front,wrist``: the node's camera names, comma-separated, in prompt order."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"--cameras {text!r}: an empty name; give camera names separated by commas, "
            f"e.g. front,wrist")
    return names


def build_parser() -> argparse.ArgumentParser:
    """Build the command-line parser."""
    from cosmos_reason_ros.core.prompts import DEFAULT_TASK
    ap = argparse.ArgumentParser(prog="query", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", default="", help="question or instruction")
    from cosmos_reason_ros.core.tasks import TASKS

    # From the package's task table: a task added there is offered here too.
    ap.add_argument("--task", default="", help=", ".join(
        f"{task.value} (default)" if task is DEFAULT_TASK else task.value for task in TASKS))
    ap.add_argument("--targets", nargs="*", default=[], help="objects to ground / point at")
    ap.add_argument("--image", type=Path, help="JPEG/PNG file sent in the goal "
                    "(default: the node's live camera)")
    ap.add_argument("--source", choices=sorted(SOURCES), default="latest",
                    help="live-camera frame to use when --image is not given")
    ap.add_argument("--cameras", type=camera_list, default=[], metavar="NAMES",
                    help="the node's cameras to ask about together, comma-separated, in the "
                    "order the model sees them (e.g. front,wrist; default: the node's default "
                    "camera)")
    ap.add_argument("--reasoning", action="store_true", help="ask the model to reason first")
    ap.add_argument("--schema", default="", help="JSON schema text, or @FILE")
    ap.add_argument("--max-tokens", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--timeout", type=float, default=WAIT_S, metavar="S",
                    help="seconds this command waits for the server and the result; the goal "
                    "is cancelled when they pass (default: %(default)s)")
    ap.add_argument("--goal-timeout", type=float, default=0.0, metavar="S",
                    help="the goal's timeout_s: the node aborts it with TIMEOUT after S "
                    "seconds (default 0: the node's limits.goal_timeout_s)")
    ap.add_argument("--action", default="/cosmos_reason/reason", help="action name")
    ap.add_argument("--quiet", action="store_true", help="do not stream text to stderr")
    return ap


def make_goal(args: argparse.Namespace) -> Any:
    """Turn parsed arguments into a ``Reason.Goal``."""
    from sensor_msgs.msg import CompressedImage

    from cosmos_reason_interfaces.action import Reason

    schema = args.schema
    if schema.startswith("@"):
        schema = Path(schema[1:]).read_text(encoding="utf-8")
    goal = Reason.Goal(prompt=args.prompt, task=args.task, targets=list(args.targets),
                       reasoning=args.reasoning, response_schema=schema,
                       max_tokens=args.max_tokens, temperature=args.temperature,
                       greedy=args.greedy, timeout_s=float(args.goal_timeout),
                       cameras=list(args.cameras))
    if args.image is not None:
        suffix = args.image.suffix.lower().lstrip(".")
        goal.compressed_image = CompressedImage(
            format="png" if suffix == "png" else "jpeg", data=args.image.read_bytes())
        goal.source = Reason.Goal.SOURCE_GOAL_IMAGE
    else:
        goal.source = SOURCES[args.source]
    return goal


def main(argv: list[str] | None = None) -> int:
    """Run one query; print the result as JSON."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.image is not None and args.cameras:
        parser.error("--cameras asks about the node's cameras and --image sends an image of "
                     "its own: give one of them")
    import rclpy

    from cosmos_reason_ros.client import ReasonClient, ServerUnavailableError

    try:
        goal = make_goal(args)
    except OSError as e:
        print(f"query: {e}", file=sys.stderr)
        return 2
    if args.timeout <= 0 or args.goal_timeout < 0:
        print("query: --timeout must be > 0 and --goal-timeout >= 0", file=sys.stderr)
        return 2
    rclpy.init()
    try:
        with ReasonClient(args.action) as client:

            def on_feedback(fb: Any) -> None:
                if fb.text_delta and not args.quiet:
                    sys.stderr.write(fb.text_delta)
                    sys.stderr.flush()

            # One deadline for the server's discovery and the result.
            handle = client.submit(goal, None if args.quiet else on_feedback,
                                   server_timeout_s=args.timeout)
            try:
                try:
                    result = handle.result(args.timeout)
                except (TimeoutError, concurrent.futures.TimeoutError):
                    if not handle.sent:
                        handle.cancel()  # never sent now, even if the server shows up
                        raise ServerUnavailableError(args.action, args.timeout) from None
                    print(f"\nquery: no result within --timeout {args.timeout:g} s: cancelling "
                          "the goal", file=sys.stderr)
                    handle.cancel()
                    result = handle.result(CANCEL_REPLY_S)
            except ServerUnavailableError as e:
                print(f"query: {e} (--timeout {args.timeout:g} s)", file=sys.stderr)
                return 1
            except (TimeoutError, concurrent.futures.TimeoutError):
                print(f"query: no reply to the cancel within {CANCEL_REPLY_S:g} s; the goal's "
                      f"end is unknown (client's view: {handle.delivery()})", file=sys.stderr)
                return 1
        if not args.quiet:
            sys.stderr.write("\n")
        out = {"status": result.status, **to_plain(result.message)}
        print(json.dumps(out, ensure_ascii=False, indent=1))
        return 0 if result.ok else 1
    finally:
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
