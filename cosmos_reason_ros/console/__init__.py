"""The operator web console: a small web page that is a ROS 2 client of the node.

``console`` (``server.main``) serves one offline page on 127.0.0.1:8080: the live camera, a
question form whose answers stream in from the action's feedback, the answer's boxes, points
and trajectories drawn over the frame it is about, recent ``~/results`` and a ``/diagnostics``
status strip. It sends goals through ``ReasonClient`` and reads the node's topics; it never
talks to the engine. ``server.py`` is the HTTP/WebSocket side, ``ros_bridge.py`` the ROS side,
``frames.py`` the frame store, ``static/`` the page.
"""
