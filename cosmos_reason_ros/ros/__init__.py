"""Thin ROS 2 glue: the node, message conversion, CDR readers, garbage-collector watch."""
