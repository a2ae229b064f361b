"""cosmos_reason_ros: visual reasoning for ROS 2 robots with Cosmos-Reason on vLLM."""
