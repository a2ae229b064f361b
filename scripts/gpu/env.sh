# Environment for the offline GPU machine, after scripts/gpu/install.sh:
#   source scripts/gpu/env.sh
# ROS 2 kit (/tmp/ros312), our interfaces (/tmp/ros_ws/install), the vLLM site tree (/tmp/site)
# and this checkout on PYTHONPATH; ROS libraries on LD_LIBRARY_PATH; DDS on localhost only;
# vLLM without the flashinfer sampler; NVLink multicast off (the workplace requires it).
# Override any path by exporting it first (GPU_ROS_PREFIX, GPU_ROS_WS, GPU_VLLM_SITE).
_gpu_repo="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/../.." && pwd)"
GPU_ROS_PREFIX="${GPU_ROS_PREFIX:-/tmp/ros312}"
GPU_ROS_WS="${GPU_ROS_WS:-/tmp/ros_ws}"
GPU_VLLM_SITE="${GPU_VLLM_SITE:-/tmp/site}"
_gpu_ros_site="$GPU_ROS_PREFIX/lib/python3.12/site-packages"
_gpu_ws_install="$GPU_ROS_WS/install"
[ -d "$_gpu_ws_install" ] || _gpu_ws_install="$GPU_ROS_PREFIX/prebuilt"   # fallback build
_gpu_ws_site="$(cat "$_gpu_ws_install/pythonpath.txt" 2>/dev/null || true)"
# the prebuilt fallback was built elsewhere: its site dir has the same relative path
[ -d "$_gpu_ws_site" ] || _gpu_ws_site="$_gpu_ws_install/lib/python3.12/site-packages"

# the checkout last: its top-level folders (test/, build/, config/ ...) must not shadow anything
_gpu_pp="$_gpu_ws_site:$_gpu_ros_site"
[ -d "$GPU_VLLM_SITE" ] && _gpu_pp="$_gpu_pp:$GPU_VLLM_SITE"
_gpu_pp="$_gpu_pp:$_gpu_repo"
export PYTHONPATH="$_gpu_pp${PYTHONPATH:+:$PYTHONPATH}"
_gpu_ld="$_gpu_ws_install/lib:$GPU_ROS_PREFIX/lib"
for _d in "$_gpu_ros_site"/ros_*.libs; do [ -d "$_d" ] && _gpu_ld="$_gpu_ld:$_d"; done
export LD_LIBRARY_PATH="$_gpu_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export AMENT_PREFIX_PATH="$_gpu_ws_install:$GPU_ROS_PREFIX"
export CMAKE_PREFIX_PATH="$_gpu_ws_install:$GPU_ROS_PREFIX"
export PATH="$PATH:$GPU_ROS_PREFIX/bin"
export RMW_IMPLEMENTATION=rmw_fastrtps_cpp
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-17}"
# the ROS wheels' re-exec bootstrapper must not run (its .pth is not installed; belt and braces)
export _ROS_WHEELS_BOOTSTRAP_COMPLETE=1
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset _gpu_repo _gpu_ros_site _gpu_ws_install _gpu_ws_site _gpu_pp _gpu_ld _d
