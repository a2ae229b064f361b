"""The node's parameters declared on the node: descriptors with ranges, and the overrides loaded.

The table, its checks and the parameters files' rules are ``cosmos_reason_ros/config.py``
(no ROS needed); this is the part that touches rclpy.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

from cosmos_reason_ros.config import (
    PARAMS,
    PARAMS_BY_NAME,
    ConfigError,
    Param,
    Range,
    check_params_files,
    renamed_hint,
    ros_params_files,
    same_type,
    validate,
)
from cosmos_reason_ros.core.params import NodeParams

_INT64_MAX = 2**63 - 1


def descriptor(param: Param, managed: bool = False) -> Any:
    """Build the ``ParameterDescriptor`` of ``param``: description, read-only, constraints.

    ``managed`` (``lifecycle.autostart`` false): nothing is read-only, so a parameter can be
    fixed while the node is unconfigured; the node's set-parameters callback refuses other
    changes.

    Ranges become ``integer_range`` / ``floating_point_range`` (step 0: any value between
    the bounds), so ``ros2 param describe`` shows them and rclpy refuses a runtime value
    outside them; every check is also spelled out in ``additional_constraints`` (an open
    lower bound such as ``> 0.0`` exists only there: ROS ranges are inclusive). The type
    is static (no ``dynamic_typing``): a double stays a double.
    """
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

    d = ParameterDescriptor(description=param.description,
                            read_only=not (param.runtime or managed))
    if param.check is not None:
        d.additional_constraints = f"allowed: {param.allowed}"
    check = param.check
    if isinstance(check, Range) and not isinstance(param.default, bool):
        if isinstance(param.default, int):
            low = math.floor(check.low) + 1 if check.low_open else math.ceil(check.low)
            high = _INT64_MAX if check.high == math.inf else math.floor(check.high)
            d.integer_range = [IntegerRange(from_value=low, to_value=high, step=0)]
        elif isinstance(param.default, float):
            d.floating_point_range = [FloatingPointRange(
                from_value=float(check.low), to_value=float(check.high), step=0.0)]
    return d


def _is_ros_own(name: str, node: Any) -> bool:
    # Parameters rclpy itself declares (use_sim_time; start_type_description_service from
    # Jazzy on) or derives from publishers' QoS overriding options.
    return node.has_parameter(name) or name.startswith("qos_overrides.")


def declare_and_load(node: Any, argv: Sequence[str] | None = None) -> NodeParams | None:
    """Declare every parameter on ``node`` and return the validated values.

    The values come from the node's parameter overrides (parameters files, ``-p``); before
    anything is declared they are checked: a name the node does not have, a parameters file
    in ``argv`` (default ``sys.argv``, where ``rclpy.init`` reads the global arguments) none
    of whose sections reaches the node, or a bad value raise ``ConfigError``. Parameters are
    declared with their validated values, statically typed (an integer written for a double
    parameter, e.g. ``max_age_s: 5``, is declared as 5.0) and with their constraints.

    With ``lifecycle.autostart`` false (the node waits for a lifecycle manager, and validates
    again at each configure) a value outside its check is declared as given and None is
    returned, so the manager sees configure fail with the reason; unknown names and wrong
    types still raise.
    """
    # Humble's rclpy has no public accessor for the overrides the node was created with
    # (rcl resolves them per node in Node.__init__); `_parameter_overrides` holds them, with
    # the same name and meaning from Foxy to Rolling. Declaring each name first to read it
    # would not reveal names the node does not have, which is what must be reported here.
    overrides = {name: p.value for name, p in node._parameter_overrides.items()
                 if not _is_ros_own(name, node)}
    fqn = node.get_fully_qualified_name()
    unknown = sorted(set(overrides) - set(PARAMS_BY_NAME))
    if unknown:
        raise ConfigError(
            f"unknown parameter(s) for node {fqn}: {', '.join(unknown)}{renamed_hint(unknown)} "
            f"(from its parameters "
            f"file or -p; docs/PARAMETERS.md lists the parameters)")
    check_params_files(ros_params_files(sys.argv if argv is None else argv), fqn,
                       node._parameter_overrides)
    managed = overrides.get("lifecycle.autostart") is False
    params: NodeParams | None
    try:
        params = validate(overrides)
        values = params.to_values()
    except ConfigError:
        if not managed:
            raise
        params, values = None, {}
        for param in PARAMS:
            value = overrides.get(param.name, param.default)
            value = [] if isinstance(param.default, list) and value is None else value
            if not same_type(param.default, value):
                raise
            values[param.name] = float(value) if isinstance(param.default, float) else value
    for param in PARAMS:
        # ignore_override: the override was validated (and typed) above.
        node.declare_parameter(param.name, values[param.name], descriptor(param, managed),
                               ignore_override=True)
    return params


def declared_values(node: Any) -> dict[str, Any]:
    """Return the node's current value of every parameter in the table (for ``validate``)."""
    return {param.name: node.get_parameter(param.name).value for param in PARAMS}
