"""Pure logic: model profiles, prompts, parsing, geometry, image codec, frame history.

Nothing in this package imports rclpy or vllm, so it is testable in milliseconds.
"""
