"""The package uses only rclpy API that ROS 2 Humble's rclpy (3.3.x, Ubuntu 22.04) provides.

No Humble wheels exist, so Humble's rclpy cannot be imported here; CI runs Kilted and Jazzy.
This test reads the package's source instead (``ast``, no import) and checks every rclpy use it
can resolve against ``HUMBLE``, an allowlist written from Humble's rclpy:

- source: https://github.com/ros2/rclpy/tree/humble/rclpy/rclpy (``__init__.py``, ``node.py``,
  ``executors.py``, ``action/server.py``, ``action/client.py``, ``qos.py``, ``qos_event.py``,
  ``signals.py``, ``task.py``, ``clock.py``, ``time.py``, ``duration.py``, ``parameter.py``,
  ``context.py``, ``logging.py``, ``serialization.py``, ``impl/rcutils_logger.py``,
  ``lifecycle/__init__.py``, ``lifecycle/node.py``: ``LifecycleNode(node_name, *,
  enable_communication_interface, **kwargs)``, ``LifecycleState(label, state_id)``, the
  ``on_configure``/``on_activate``/``on_deactivate``/``on_cleanup``/``on_shutdown``/``on_error``
  callbacks returning ``TransitionCallbackReturn``, ``trigger_*``: rclpy 3.0 added them, so
  Humble has them);
- cross-checked with rclpy's CHANGELOG.rst (ros2/rclpy rclpy/CHANGELOG.rst, as stored at commit
  0216a1aa9e16c6a8ea1861d3c241a2b19909a1b5 of the jazzy branch): Humble branched at 3.3.x;
  what rolling added later is not in Humble unless backported -- e.g. ``rclpy.event_handler``
  (4.x, Iron: Humble has ``rclpy.qos_event``), Executor/Context as context managers (4.2.1),
  ``create_timer(autostart=...)`` (5.0.0), the type-description service (5.0.0),
  ``Executor.create_future`` (7.1.6 backport), ``rclpy.experimental.EventsExecutor`` (7.1.4),
  pre/post-set parameter callbacks (3.7.0). Names the package does not use are listed only
  where they mark such a boundary, or are the obvious neighbours of a used one.

What is checked (``humble_api_violations``):

1. ``import rclpy.X`` / ``from rclpy.X import N``: the module exists in Humble and exports N.
   An import inside ``try:`` whose handler catches ``ImportError`` is a newer-distro choice
   with a fallback; only the handler's imports must be Humble's.
2. Attribute chains from the ``rclpy`` module (``rclpy.init``, ``rclpy.logging.get_logger``).
3. Attributes and methods used on objects of a known rclpy class (``CLASSES``), where the
   class is known from: ``self`` in a class deriving from one (names the class does not define
   itself), a constructor or factory call (``Node(...)``, ``rclpy.create_node(...)``,
   ``node.get_clock()``, ``node.get_logger()``...), an annotation (``node: Node``,
   ``self._server: ActionServer | None``), or the callbacks given to ``ActionServer``
   (their first argument is a ``ServerGoalHandle``).
4. Keyword arguments of calls to those functions, constructors and methods, against Humble's
   parameter names (``create_timer(..., autostart=False)`` fails).

Limits: a name whose class the scan cannot infer (a value passed around untyped, returned from
an unlisted call, kept in a container) is not checked; positional argument counts are not
checked; behaviour differences behind an unchanged signature (e.g. Humble's
MultiThreadedExecutor default thread count) are not checked; rosidl is used only through
the generated message classes (fields, constants and ``get_fields_and_field_types()``, which
rosidl_generator_py has had since Eloquent), so only rclpy is listed. Only
``cosmos_reason_ros/`` is scanned -- what a Humble robot runs; test helpers run only on
Kilted and Jazzy.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "cosmos_reason_ros"

# --- Humble's rclpy (3.3.x): modules -> public names --------------------------------------------

HUMBLE: dict[str, frozenset[str]] = {k: frozenset(v.split()) for k, v in {
    "rclpy": """init shutdown try_shutdown ok create_node spin spin_once
        spin_until_future_complete get_global_executor get_default_context
        get_rmw_implementation_identifier utilities logging node executors qos qos_event
        action callback_groups duration time clock parameter context signals serialization
        task timer publisher subscription exceptions lifecycle""",
    "rclpy.node": "Node",
    "rclpy.action": """ActionServer ActionClient CancelResponse GoalResponse
        get_action_client_names_and_types_by_node get_action_server_names_and_types_by_node
        get_action_names_and_types""",
    "rclpy.action.server": "ActionServer ServerGoalHandle CancelResponse GoalResponse GoalEvent",
    "rclpy.action.client": "ActionClient ClientGoalHandle",
    "rclpy.executors": """Executor SingleThreadedExecutor MultiThreadedExecutor
        ExternalShutdownException ShutdownException TimeoutException
        ConditionReachedException""",
    "rclpy.callback_groups": "CallbackGroup MutuallyExclusiveCallbackGroup ReentrantCallbackGroup",
    "rclpy.qos": """QoSProfile HistoryPolicy ReliabilityPolicy DurabilityPolicy LivelinessPolicy
        QoSHistoryPolicy QoSReliabilityPolicy QoSDurabilityPolicy QoSLivelinessPolicy
        QoSPresetProfiles QoSPolicyKind qos_profile_sensor_data qos_profile_system_default
        qos_profile_services_default qos_profile_parameters qos_profile_parameter_events
        qos_profile_action_status_default""",
    "rclpy.qos_event": """SubscriptionEventCallbacks PublisherEventCallbacks QoSEventHandler
        QoSRequestedDeadlineMissedInfo QoSLivelinessChangedInfo QoSMessageLostInfo
        QoSRequestedIncompatibleQoSInfo QoSOfferedDeadlineMissedInfo QoSLivelinessLostInfo
        QoSOfferedIncompatibleQoSInfo""",
    "rclpy.duration": "Duration Infinite",
    "rclpy.time": "Time",
    "rclpy.clock": "Clock ClockType ROSClock JumpThreshold JumpHandle TimeJump",
    "rclpy.parameter": "Parameter parameter_value_to_python",
    "rclpy.context": "Context",
    "rclpy.signals": "SignalHandlerOptions SignalHandlerGuardCondition",
    "rclpy.serialization": "serialize_message deserialize_message",
    # Humble's impl/rcutils_logger.py writes each line with
    # rclpy_implementation.rclpy_logging_rcutils_log(severity, name, message, function_name,
    # file_path, line_number), the call ros/pylog.py's log_line makes (FlexBE does so on Humble).
    "rclpy.impl.implementation_singleton": "rclpy_implementation",
    "rclpy.logging": """get_logger LoggingSeverity set_logger_level get_logger_effective_level
        initialize clear_config get_logging_directory""",
    "rclpy.task": "Future Task",
    "rclpy.timer": "Timer Rate",
    "rclpy.publisher": "Publisher",
    "rclpy.subscription": "Subscription",
    "rclpy.exceptions": """ROSInterruptException InvalidHandle ParameterException
        ParameterNotDeclaredException ParameterAlreadyDeclaredException
        InvalidParameterValueException ParameterImmutableException
        ParameterUninitializedException NotInitializedException""",
    "rclpy.utilities": "ok shutdown try_shutdown get_default_context remove_ros_args",
    "rclpy.lifecycle": """LifecycleNode LifecycleNodeMixin LifecycleState LifecyclePublisher
        ManagedEntity SimpleManagedEntity TransitionCallbackReturn Publisher""",
}.items()}

# Classes: (module, name) -> Humble's attributes and methods, each with its keyword parameters
# (None: not a call, or keywords not checked).
_KW = dict[str, "frozenset[str] | None"]


def _members(spec: str) -> _KW:
    """``"name(kw1 kw2) attr other()"`` -> {name: {kw1, kw2}, attr: None, other: {}}."""
    out: _KW = {}
    for item in spec.replace("\n", " ").split(";"):
        item = item.strip()
        if not item:
            continue
        if "(" in item:
            name, args = item.split("(", 1)
            out[name.strip()] = frozenset(args.rstrip(")").split())
        else:
            out[item] = None
    return out


_NODE_KW = ("context cli_args namespace use_global_arguments enable_rosout "
            "start_parameter_services parameter_overrides allow_undeclared_parameters "
            "automatically_declare_parameters_from_overrides")
_QOS_KW = ("history depth reliability durability lifespan deadline liveliness "
           "liveliness_lease_duration avoid_ros_namespace_conventions")
_EXECUTOR = """add_node(node); remove_node(node); get_nodes(); spin(); wake();
    spin_once(timeout_sec); spin_until_future_complete(future timeout_sec);
    spin_once_until_future_complete(future timeout_sec); shutdown(timeout_sec);
    create_task(); context; can_execute(entity); wait_for_ready_callbacks(timeout_sec nodes
    condition)"""
_FUTURE = """result(); exception(); done(); cancelled(); cancel(); add_done_callback(callback);
    set_result(result); set_exception(exception)"""

# node.py: Node.__init__ also sets ``_parameter_overrides`` (the overrides the node was created
# with; private, but the same name and meaning from Foxy to Rolling: ros/config.py says why).
_NODE_MEMBERS = _members(f"""__init__(node_name {_NODE_KW});
        publishers; subscriptions; _parameter_overrides; clients; services; timers; guards;
        waitables; executor;
        context; handle; default_callback_group;
        get_name(); get_namespace(); get_fully_qualified_name(); get_clock(); get_logger();
        declare_parameter(name value descriptor ignore_override);
        declare_parameters(namespace parameters ignore_override); undeclare_parameter(name);
        has_parameter(name); get_parameter(name); get_parameter_or(name alternative_value);
        get_parameters(names); get_parameters_by_prefix(prefix); get_parameter_types(names);
        set_parameters(parameter_list); set_parameters_atomically(parameter_list);
        add_on_set_parameters_callback(callback);
        remove_on_set_parameters_callback(callback); describe_parameter(name);
        describe_parameters(names); set_descriptor(name descriptor alternative_value);
        add_waitable(waitable); remove_waitable(waitable);
        resolve_topic_name(topic only_expand); resolve_service_name(service only_expand);
        create_publisher(msg_type topic qos_profile callback_group event_callbacks
            qos_overriding_options publisher_class);
        create_subscription(msg_type topic callback qos_profile callback_group
            event_callbacks qos_overriding_options raw);
        create_client(srv_type srv_name qos_profile callback_group);
        create_service(srv_type srv_name callback qos_profile callback_group);
        create_timer(timer_period_sec callback callback_group clock);
        create_guard_condition(callback callback_group); create_rate(frequency clock);
        destroy_publisher(publisher); destroy_subscription(subscription);
        destroy_client(client); destroy_service(service); destroy_timer(timer);
        destroy_guard_condition(guard); destroy_rate(rate); destroy_node();
        get_topic_names_and_types(no_demangle); get_service_names_and_types();
        get_node_names(); get_node_names_and_namespaces();
        get_node_names_and_namespaces_with_enclaves(); get_fully_qualified_node_names();
        count_publishers(topic_name); count_subscribers(topic_name);
        get_publishers_info_by_topic(topic_name no_mangle);
        get_subscriptions_info_by_topic(topic_name no_mangle);
        get_publisher_names_and_types_by_node(node_name node_namespace no_demangle);
        get_subscriber_names_and_types_by_node(node_name node_namespace no_demangle);
        get_service_names_and_types_by_node(node_name node_namespace);
        get_client_names_and_types_by_node(node_name node_namespace)""")

CLASSES: dict[str, _KW] = {
    "rclpy.node.Node": _NODE_MEMBERS,
    # lifecycle/node.py: LifecycleNode(LifecycleNodeMixin, Node); __init__ takes Node's
    # keywords plus enable_communication_interface.
    "rclpy.lifecycle.LifecycleNode": {**_NODE_MEMBERS, **_members(f"""__init__(node_name
        enable_communication_interface {_NODE_KW}); trigger_configure(); trigger_cleanup();
        trigger_activate(); trigger_deactivate(); trigger_shutdown();
        add_managed_entity(entity); on_configure(state); on_cleanup(state);
        on_shutdown(state); on_activate(state); on_deactivate(state); on_error(state);
        create_lifecycle_publisher(); destroy_lifecycle_publisher(publisher)""")},
    "rclpy.lifecycle.LifecycleState": _members("label; state_id"),
    "rclpy.executors.Executor": _members(f"__init__(context); {_EXECUTOR}"),
    "rclpy.executors.SingleThreadedExecutor": _members(f"__init__(context); {_EXECUTOR}"),
    "rclpy.executors.MultiThreadedExecutor": _members(
        f"__init__(num_threads context); {_EXECUTOR}"),
    "rclpy.action.ActionServer": _members("""__init__(node action_type action_name
            execute_callback callback_group goal_callback handle_accepted_callback
            cancel_callback goal_service_qos_profile result_service_qos_profile
            cancel_service_qos_profile feedback_pub_qos_profile status_pub_qos_profile
            result_timeout);
        destroy(); register_handle_accepted_callback(handle_accepted_callback);
        register_goal_callback(goal_callback); register_cancel_callback(cancel_callback);
        register_execute_callback(execute_callback); action_type;
        _execute_get_result_request(request_header_and_message)"""),
    "rclpy.action.server.ServerGoalHandle": _members("""request; goal_id; is_active;
        is_cancel_requested; status; execute(execute_callback); publish_feedback(feedback);
        succeed(); abort(); canceled(); destroy()"""),
    "rclpy.action.ActionClient": _members("""__init__(node action_type action_name
            callback_group goal_service_qos_profile result_service_qos_profile
            cancel_service_qos_profile feedback_sub_qos_profile status_sub_qos_profile);
        send_goal(goal feedback_callback goal_uuid);
        send_goal_async(goal feedback_callback goal_uuid); server_is_ready();
        wait_for_server(timeout_sec); destroy()"""),
    "rclpy.action.client.ClientGoalHandle": _members("""goal_id; stamp; accepted; status;
        cancel_goal(); cancel_goal_async(); get_result(); get_result_async()"""),
    "rclpy.task.Future": _members(_FUTURE),
    "rclpy.task.Task": _members(_FUTURE),
    "rclpy.qos.QoSProfile": _members(f"__init__({_QOS_KW}); {_QOS_KW.replace(' ', '; ')}"),
    "rclpy.qos_event.SubscriptionEventCallbacks": _members(
        "__init__(deadline incompatible_qos liveliness message_lost use_default_callbacks)"),
    "rclpy.qos_event.PublisherEventCallbacks": _members(
        "__init__(deadline incompatible_qos liveliness use_default_callbacks)"),
    "rclpy.duration.Duration": _members(
        "__init__(seconds nanoseconds); nanoseconds; to_msg(); from_msg(msg)"),
    "rclpy.time.Time": _members("""__init__(seconds nanoseconds clock_type); nanoseconds;
        seconds_nanoseconds(); to_msg(); from_msg(msg clock_type); clock_type"""),
    "rclpy.clock.Clock": _members("""__init__(clock_type); now(); clock_type; handle;
        create_jump_callback(threshold pre_callback post_callback);
        sleep_until(until context); sleep_for(rel_time context)"""),
    "rclpy.parameter.Parameter": _members("""__init__(name type_ value); Type; name; value;
        type_; get_parameter_value(); from_parameter_msg(param_msg); to_parameter_msg()"""),
    "rclpy.context.Context": _members("""__init__(); init(args initialize_logging domain_id);
        ok(); shutdown(); try_shutdown(); on_shutdown(callback); get_domain_id(); handle"""),
    "rclpy.publisher.Publisher": _members("""publish(msg); get_subscription_count();
        topic_name; handle; destroy(); assert_liveliness(); wait_for_all_acked(timeout)"""),
    "rclpy.subscription.Subscription": _members(
        "topic_name; msg_type; callback; callback_group; handle; raw; destroy()"),
    "rclpy.timer.Timer": _members("""cancel(); reset(); is_canceled(); is_ready(); destroy();
        timer_period_ns; time_since_last_call(); time_until_next_call(); clock; handle"""),
    "rclpy.impl.rcutils_logger.RcutilsLogger": _members("""name; get_child(name);
        set_level(level); get_effective_level(); is_enabled_for(severity);
        log(message severity once throttle_duration_sec throttle_time_source_type
            skip_first);
        debug(message once throttle_duration_sec throttle_time_source_type skip_first);
        info(message once throttle_duration_sec throttle_time_source_type skip_first);
        warning(message once throttle_duration_sec throttle_time_source_type skip_first);
        warn(message once throttle_duration_sec throttle_time_source_type skip_first);
        error(message once throttle_duration_sec throttle_time_source_type skip_first);
        fatal(message once throttle_duration_sec throttle_time_source_type skip_first)"""),
}

# Module-level functions and their keyword parameters in Humble.
FUNCTIONS: dict[str, frozenset[str]] = {k: frozenset(v.split()) for k, v in {
    "rclpy.init": "args context domain_id signal_handler_options",
    "rclpy.shutdown": "context uninstall_handlers",
    "rclpy.try_shutdown": "context uninstall_handlers",
    "rclpy.ok": "context",
    "rclpy.create_node": "node_name " + _NODE_KW,
    "rclpy.spin": "node executor",
    "rclpy.spin_once": "node executor timeout_sec",
    "rclpy.spin_until_future_complete": "node future executor timeout_sec",
    "rclpy.logging.get_logger": "name",
    "rclpy.serialization.serialize_message": "message",
    "rclpy.serialization.deserialize_message": "serialized_message message_type",
}.items()}

# Classes re-exported under another module path (the scan resolves both to one entry).
ALIASES = {
    "rclpy.action.server.ActionServer": "rclpy.action.ActionServer",
    "rclpy.action.client.ActionClient": "rclpy.action.ActionClient",
}

# What calls return, where the result is a class listed above.
RETURNS: dict[str, str] = {
    "rclpy.create_node": "rclpy.node.Node",
    "rclpy.logging.get_logger": "rclpy.impl.rcutils_logger.RcutilsLogger",
    "rclpy.node.Node.get_logger": "rclpy.impl.rcutils_logger.RcutilsLogger",
    "rclpy.node.Node.get_clock": "rclpy.clock.Clock",
    "rclpy.node.Node.create_publisher": "rclpy.publisher.Publisher",
    "rclpy.node.Node.create_subscription": "rclpy.subscription.Subscription",
    "rclpy.node.Node.create_timer": "rclpy.timer.Timer",
    "rclpy.clock.Clock.now": "rclpy.time.Time",
    "rclpy.impl.rcutils_logger.RcutilsLogger.get_child":
        "rclpy.impl.rcutils_logger.RcutilsLogger",
    "rclpy.action.ActionClient.send_goal_async": "rclpy.task.Future",
    "rclpy.executors.SingleThreadedExecutor.create_task": "rclpy.task.Task",
    "rclpy.executors.MultiThreadedExecutor.create_task": "rclpy.task.Task",
    "rclpy.executors.Executor.create_task": "rclpy.task.Task",
}

# ActionServer callbacks whose first argument is a ServerGoalHandle.
GOAL_HANDLE_CALLBACKS = ("execute_callback", "handle_accepted_callback", "cancel_callback")


# --- the scan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """One use of rclpy that Humble's rclpy does not have."""

    where: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.where}:{self.line}: {self.what}"


def _class_key(qualified: str) -> str | None:
    qualified = ALIASES.get(qualified, qualified)
    return qualified if qualified in CLASSES else None


def _guarded(node: ast.stmt) -> bool:
    """``try:`` whose handlers catch ImportError (a newer-distro import with a fallback)."""
    if not isinstance(node, ast.Try):
        return False
    for handler in node.handlers:
        caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError")
               for n in caught):
            return True
    return False


def _self_attributes(cls: ast.ClassDef) -> set[str]:
    """Names a class defines itself: methods, class attributes, ``self.X = ...``."""
    names: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.add(stmt.target.id)
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return names


# Cached, and read when first needed rather than at import: every pytest worker collects
# every module, and parsing the whole package cost each worker's start seconds.
@functools.cache
def _package_classes(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Class name -> the names it defines itself, for every class of the package.

    A class deriving from one of the package's classes and an rclpy class (e.g.
    ``class Sub(ReasonNode, LifecycleNode)``) inherits these as its own.
    """
    classes: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, set()).update(_self_attributes(node))
    return classes


@functools.cache
def _package_rclpy_subclasses(root: Path = PACKAGE) -> dict[str, str]:
    """Package class name -> its rclpy base, for classes built with the base's own arguments.

    A class without an ``__init__`` of its own, or with ``__init__(self, *args, **kwargs)``
    (``ResultRequestsActionServer``): a call to it anywhere in the package is checked as a
    call to the rclpy class (its keywords, the goal handles of its execute callback).
    """
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        rclpy_names = {a.asname or a.name: f"{n.module}.{a.name}" for n in ast.walk(tree)
                       if isinstance(n, ast.ImportFrom) and n.module
                       and n.module.split(".")[0] == "rclpy" for a in n.names}
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            bases = [rclpy_names[b.id] for b in cls.bases
                     if isinstance(b, ast.Name) and b.id in rclpy_names]
            init = next((f for f in cls.body if isinstance(f, ast.FunctionDef)
                         and f.name == "__init__"), None)
            passes_through = init is None or (
                [a.arg for a in init.args.args] == ["self"] and init.args.vararg is not None
                and init.args.kwarg is not None)
            if len(bases) == 1 and len(cls.bases) == 1 and passes_through:
                found[cls.name] = bases[0]
    return found


@dataclass
class _ClassContext:
    """What ``self`` is inside a class body: its rclpy base, own names, typed attributes."""

    base: str | None
    own: set[str]
    members: dict[str, str]
    inherited: frozenset[str] = frozenset()  # names a package base class defines


class _Scan:
    """Resolves rclpy names and the types of values in one module; records violations.

    Types are strings: ``module:rclpy.x``, ``class:rclpy.x.C`` (the class itself),
    ``obj:rclpy.x.C`` (an instance), ``func:rclpy.x.f``, ``method:rclpy.x.C.m``, ``self``.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self.violations: list[Violation] = []
        self.checked: set[str] = set()  # every use found in Humble's API
        self.imports: dict[str, str] = {}  # local name -> "rclpy.x" or "rclpy.x.Name"
        self.cls: _ClassContext | None = None
        self.package_classes: dict[str, set[str]] = {}
        self.package_subclasses: dict[str, str] = {}

    def _bad(self, line: int, what: str) -> None:
        v = Violation(self.where, line, f"{what} is not in Humble's rclpy")
        if v not in self.violations:
            self.violations.append(v)

    # imports (module level and lazy ones in functions alike)
    def collect_imports(self, tree: ast.AST, guarded: bool = False) -> None:
        for node in ast.iter_child_nodes(tree):
            if isinstance(node, ast.stmt) and _guarded(node):
                assert isinstance(node, ast.Try)
                for stmt in node.body:
                    self.collect_imports_stmt(stmt, guarded=True)
                for handler in node.handlers:
                    self.collect_imports(handler, guarded)
                for stmt in node.orelse + node.finalbody:
                    self.collect_imports_stmt(stmt, guarded)
            elif isinstance(node, ast.stmt):
                self.collect_imports_stmt(node, guarded)
            else:
                self.collect_imports(node, guarded)

    def collect_imports_stmt(self, stmt: ast.stmt, guarded: bool) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.name.split(".")[0] != "rclpy":
                    continue
                if not guarded and alias.name not in HUMBLE:
                    self._bad(stmt.lineno, f"module {alias.name}")
                self.imports[alias.asname or "rclpy"] = alias.name if alias.asname else "rclpy"
        elif isinstance(stmt, ast.ImportFrom):
            if not stmt.module or stmt.level or stmt.module.split(".")[0] != "rclpy":
                return
            if not guarded and stmt.module not in HUMBLE:
                self._bad(stmt.lineno, f"module {stmt.module}")
                return
            for alias in stmt.names:
                if not guarded and alias.name not in HUMBLE[stmt.module]:
                    self._bad(stmt.lineno, f"{stmt.module}.{alias.name}")
                elif not guarded:
                    self.checked.add(f"{stmt.module}.{alias.name}")
                self.imports[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
        else:
            self.collect_imports(stmt, guarded)

    def _kind(self, qualified: str) -> str | None:
        qualified = ALIASES.get(qualified, qualified)
        if qualified in HUMBLE:
            return f"module:{qualified}"
        if _class_key(qualified):
            return f"class:{qualified}"
        if qualified.rpartition(".")[0] in HUMBLE:
            return f"func:{qualified}"
        return None

    def _member(self, cls: str, attr: str, line: int) -> str | None:
        members = CLASSES[cls]
        if any(base == cls and attr in self.package_classes[sub]
               for sub, base in self.package_subclasses.items()):
            return None  # the package subclass's own (an object typed as its rclpy base)
        if attr not in members:
            self._bad(line, f"{cls}.{attr}")
            return None
        self.checked.add(f"{cls}.{attr}")
        return f"method:{cls}.{attr}" if members[attr] is not None else None

    def resolve(self, expr: ast.expr, env: dict[str, str]) -> str | None:
        """The type of ``expr``; records a violation for every non-Humble use on the way."""
        if isinstance(expr, ast.Name):
            if expr.id in env:
                return env[expr.id]
            qualified = self.imports.get(expr.id) or self.package_subclasses.get(expr.id)
            return self._kind(qualified) if qualified else None
        if isinstance(expr, ast.Attribute):
            if isinstance(expr.value, ast.Call) and isinstance(expr.value.func, ast.Name) \
                    and expr.value.func.id == "super" and self.cls and self.cls.base:
                if expr.attr in self.cls.inherited:  # the package base's (e.g. __init__)
                    return None
                return self._member(self.cls.base, expr.attr, expr.lineno)
            base = self.resolve(expr.value, env)
            if base == "self" and self.cls is not None:
                if expr.attr in self.cls.members:
                    return self.cls.members[expr.attr]
                if expr.attr in self.cls.own or self.cls.base is None:
                    return None
                return self._member(self.cls.base, expr.attr, expr.lineno)
            kind, _, name = (base or "").partition(":")
            if kind == "module":
                if expr.attr not in HUMBLE[name]:
                    self._bad(expr.lineno, f"{name}.{expr.attr}")
                    return None
                self.checked.add(f"{name}.{expr.attr}")
                return self._kind(f"{name}.{expr.attr}")
            if kind == "obj":
                return self._member(name, expr.attr, expr.lineno)
            return None
        if isinstance(expr, ast.Call):
            target = self.resolve(expr.func, env)
            kind, _, name = (target or "").partition(":")
            allowed: frozenset[str] | None = None
            result = None
            if kind == "class":
                allowed, result = CLASSES[name].get("__init__"), f"obj:{name}"
            elif kind == "method":
                cls, _, method = name.rpartition(".")
                allowed = CLASSES[cls][method]
            elif kind == "func":
                allowed = FUNCTIONS.get(name)
            if name in RETURNS:
                result = f"obj:{RETURNS[name]}"
            if allowed is not None:
                for kw in expr.keywords:
                    if kw.arg is not None and kw.arg not in allowed:
                        self._bad(expr.lineno, f"keyword {kw.arg}= of {name}")
                    elif kw.arg is not None:
                        self.checked.add(f"{name}({kw.arg}=)")
            return result
        return None

    def annotation_type(self, ann: ast.expr | None) -> str | None:
        """``Node``, ``Node | None``, ``Optional[Node]``, ``"Node"`` -> ``obj:rclpy.node.Node``."""
        if ann is None:
            return None
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            try:
                ann = ast.parse(ann.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
            return self.annotation_type(ann.left) or self.annotation_type(ann.right)
        if isinstance(ann, ast.Subscript):
            return self.annotation_type(ann.slice)
        if isinstance(ann, ast.Tuple):
            return next((t for t in map(self.annotation_type, ann.elts) if t), None)
        resolved = self.resolve(ann, {})
        return "obj:" + resolved.partition(":")[2] if resolved and \
            resolved.startswith("class:") else None

    # statements
    def check(self, expr: ast.AST, env: dict[str, str]) -> None:
        for node in ast.walk(expr):
            if isinstance(node, ast.Attribute | ast.Call):
                self.resolve(node, env)

    def block(self, body: list[ast.stmt], env: dict[str, str]) -> None:
        for stmt in body:
            self.statement(stmt, env)

    def statement(self, stmt: ast.stmt, env: dict[str, str]) -> None:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            self.function(stmt, env, goal_handle=False)
            return
        if isinstance(stmt, ast.ClassDef):
            self.klass(stmt, env)
            return
        for _field, value in ast.iter_fields(stmt):
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, ast.stmt):
                    self.statement(item, env)
                elif isinstance(item, ast.expr):
                    self.check(item, env)
                elif isinstance(item, ast.ExceptHandler):
                    self.block(item.body, env)
                elif isinstance(item, ast.withitem):
                    self.check(item.context_expr, env)
        # An assignment gives a local name a type for what follows.
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            typed = self.resolve(stmt.value, env)
            if isinstance(stmt, ast.AnnAssign):
                typed = self.annotation_type(stmt.annotation) or typed
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                if isinstance(t, ast.Name) and typed and typed.startswith("obj:"):
                    env[t.id] = typed

    def function(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, env: dict[str, str],
                 goal_handle: bool) -> None:
        local = dict(env)
        for default in fn.args.defaults + [d for d in fn.args.kw_defaults if d is not None]:
            self.check(default, env)
        params = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        for arg in params:
            typed = self.annotation_type(arg.annotation)
            if typed:
                local[arg.arg] = typed
        real = [a for a in params if a.arg not in ("self", "cls")]
        if goal_handle and real:
            local[real[0].arg] = "obj:rclpy.action.server.ServerGoalHandle"
        self.block(fn.body, local)

    def klass(self, cls: ast.ClassDef, env: dict[str, str]) -> None:
        outer = self.cls
        base = None
        for b in cls.bases:
            resolved = self.resolve(b, env)
            if resolved and resolved.startswith("class:"):
                base = resolved.partition(":")[2]
        inherited: set[str] = set()
        for b in cls.bases:  # names a package base class defines are this class's own too
            if isinstance(b, ast.Name) and b.id in self.package_classes:
                inherited |= self.package_classes[b.id]
        self.cls = ctx = _ClassContext(base, _self_attributes(cls) | inherited, {},
                                       frozenset(inherited))
        inner_env = {**env, "self": "self"}
        handlers: set[str] = set()
        for _ in range(2):  # twice: an attribute typed from another one (self.a = self.b.c())
            for node in ast.walk(cls):
                target, value, ann = None, None, None
                if isinstance(node, ast.AnnAssign):
                    target, value, ann = node.target, node.value, node.annotation
                elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value = node.targets[0], node.value
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id == "self":
                    typed = self.annotation_type(ann)
                    if typed is None and value is not None:
                        typed = self.resolve(value, inner_env)
                    if typed and typed.startswith("obj:"):
                        ctx.members[target.attr] = typed
                # ActionServer(..., execute_callback=self._execute, ...): goal handles.
                if isinstance(node, ast.Call) and \
                        self.resolve(node.func, inner_env) == "class:rclpy.action.ActionServer":
                    given = {k.arg: k.value for k in node.keywords}
                    if len(node.args) >= 4:
                        given.setdefault("execute_callback", node.args[3])
                    for key in GOAL_HANDLE_CALLBACKS:
                        cb = given.get(key)
                        if isinstance(cb, ast.Attribute) and isinstance(cb.value, ast.Name) \
                                and cb.value.id == "self":
                            handlers.add(cb.attr)
        for stmt in cls.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                for deco in stmt.decorator_list:
                    self.check(deco, env)
                self.function(stmt, inner_env, goal_handle=stmt.name in handlers)
            else:
                self.statement(stmt, env)
        self.cls = outer


def _scan(source: str, where: str) -> _Scan:
    tree = ast.parse(source)
    scan = _Scan(where)
    if where != "<snippet>":
        scan.package_classes, scan.package_subclasses = _package_classes(), \
            _package_rclpy_subclasses()
    scan.collect_imports(tree)
    scan.block(tree.body, {})
    return scan




def scan_source(source: str, where: str = "<snippet>") -> list[Violation]:
    """Every use in ``source`` of rclpy API that Humble's rclpy lacks."""
    return _scan(source, where).violations


def scan_package(root: Path = PACKAGE) -> tuple[list[Violation], set[str]]:
    """Scan every module of the package: the violations, and every use found in Humble's."""
    violations: list[Violation] = []
    checked: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        scan = _scan(path.read_text(encoding="utf-8"), str(path.relative_to(root.parent)))
        violations += scan.violations
        checked |= scan.checked
    return violations, checked


# --- tests ---------------------------------------------------------------------------------------


def test_package_uses_only_humble_rclpy_api() -> None:
    violations, checked = scan_package()
    assert not violations, "rclpy API missing from Humble:\n" + "\n".join(map(str, violations))
    print(f"\n{len(checked)} distinct rclpy uses checked against Humble's API")


def test_the_result_request_hook_is_rclpys_coroutine() -> None:
    # ros/action_results.py overrides a private coroutine (rclpy has no public hook for a
    # result request): it must be in the installed rclpy with the same one argument, as it has
    # been since Humble.
    from rclpy.action.server import ActionServer

    method = ActionServer._execute_get_result_request
    assert inspect.iscoroutinefunction(method)
    assert list(inspect.signature(method).parameters) == ["self", "request_header_and_message"]


def test_the_scan_reaches_the_node_client_and_process_loop() -> None:
    # Passing means something only if the scan resolved the package's real uses: the node
    # (a Node subclass, its action server's goal handles), the client, the process loop.
    _violations, checked = scan_package()
    for use in ("rclpy.node.Node.create_publisher", "rclpy.node.Node.create_subscription",
                "rclpy.node.Node.create_timer", "rclpy.node.Node.get_clock",
                "rclpy.clock.Clock.now", "rclpy.action.ActionServer(execute_callback=)",
                "rclpy.action.server.ServerGoalHandle.publish_feedback",
                "rclpy.action.server.ServerGoalHandle.is_cancel_requested",
                "rclpy.action.ActionClient.send_goal_async", "rclpy.task.Future.add_done_callback",
                "rclpy.executors.MultiThreadedExecutor.spin_once",
                "rclpy.init(signal_handler_options=)", "rclpy.try_shutdown",
                "rclpy.impl.rcutils_logger.RcutilsLogger.info"):
        assert use in checked, f"the scan did not resolve {use}"


JAZZY_ONLY = {
    "events executor": ("""
        from rclpy.experimental import EventsExecutor
        """, "module rclpy.experimental"),
    "event_handler module": ("""
        from rclpy.event_handler import SubscriptionEventCallbacks
        """, "module rclpy.event_handler"),
    "type description service on a Node subclass": ("""
        from rclpy.node import Node

        class N(Node):
            def __init__(self):
                super().__init__("n")
                self.get_type_description_service()
        """, "rclpy.node.Node.get_type_description_service"),
    "timer autostart": ("""
        import rclpy

        def make(context):
            node = rclpy.create_node("n", context=context)
            node.create_timer(1.0, lambda: None, autostart=False)
        """, "keyword autostart= of rclpy.node.Node.create_timer"),
    "executor create_future": ("""
        from rclpy.executors import MultiThreadedExecutor

        def go():
            ex = MultiThreadedExecutor(num_threads=2)
            return ex.create_future()
        """, "rclpy.executors.MultiThreadedExecutor.create_future"),
    "annotated node parameter": ("""
        from rclpy.node import Node

        def f(node: Node | None):
            node.get_type_description_service()
        """, "rclpy.node.Node.get_type_description_service"),
    "goal handle in an execute callback": ("""
        from rclpy.action import ActionServer
        from rclpy.node import Node

        class N(Node):
            def __init__(self):
                super().__init__("n")
                self._server = ActionServer(self, object, "a", execute_callback=self._run)

            def _run(self, handle):
                handle.publish_feedback(None)
                handle.goal_status_new_thing()
        """, "rclpy.action.server.ServerGoalHandle.goal_status_new_thing"),
    "attribute chain": ("""
        import rclpy

        def f():
            rclpy.experimental.EventsExecutor()
        """, "rclpy.experimental"),
    "self attribute typed by a factory": ("""
        import rclpy

        class C:
            def __init__(self):
                self.node = rclpy.create_node("c")

            def go(self):
                self.node.get_clock().now().to_msg()
                self.node.get_logger().info("x", throttle_duration_sec=1.0)
                self.node.get_type_description_service()
        """, "rclpy.node.Node.get_type_description_service"),
}


@pytest.mark.parametrize("case", sorted(JAZZY_ONLY))
def test_a_jazzy_only_use_fails_the_check(case: str) -> None:
    source, expected = JAZZY_ONLY[case]
    found = [v.what for v in scan_source(textwrap.dedent(source))]
    assert found == [f"{expected} is not in Humble's rclpy"], found


HUMBLE_OK = {
    "guarded newer import with a Humble fallback": """
        try:
            from rclpy.event_handler import SubscriptionEventCallbacks
        except ImportError:
            from rclpy.qos_event import SubscriptionEventCallbacks
        """,
    "the node's usual calls": """
        import rclpy
        from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
        from rclpy.node import Node
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from rclpy.signals import SignalHandlerOptions

        class N(Node):
            def __init__(self):
                super().__init__("n")
                self.pub = self.create_publisher(object, "~/x", QoSProfile(
                    depth=1, reliability=ReliabilityPolicy.RELIABLE))
                self.create_timer(0.5, self.tick)
                self.declare_parameter("a", 1)

            def tick(self):
                self.pub.publish(None)
                self.get_logger().info("t", throttle_duration_sec=5.0)

        def main():
            rclpy.init(args=None, signal_handler_options=SignalHandlerOptions.NO)
            ex = MultiThreadedExecutor(num_threads=4)
            ex.add_node(N())
            while rclpy.ok():
                ex.spin_once(timeout_sec=0.2)
            rclpy.try_shutdown()
        """,
}


@pytest.mark.parametrize("case", sorted(HUMBLE_OK))
def test_humble_api_passes_the_check(case: str) -> None:
    assert scan_source(textwrap.dedent(HUMBLE_OK[case])) == []
