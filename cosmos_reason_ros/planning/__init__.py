"""Planners on top of the ``~/reason`` action: behaviour-tree behaviours and the example tree.

Built on ``cosmos_reason_ros.client`` (and ``core`` types) only; nothing below imports it.
"""
