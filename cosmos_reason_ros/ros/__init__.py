"""Thin ROS 2 glue: the node, message conversion."""
