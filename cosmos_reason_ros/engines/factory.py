"""Create an engine by kind; backends are imported only when chosen (vLLM is heavy)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cosmos_reason_ros.core.types import BadRequestError
from cosmos_reason_ros.engines.base import Engine

ENGINE_KINDS = ("vllm", "openai")


def create_engine(kind: str, options: Mapping[str, Any]) -> Engine:
    """Build the engine ``kind`` ('vllm' in-process, 'openai' server client) from options."""
    if kind == "vllm":
        from cosmos_reason_ros.engines.vllm_local import VllmLocalConfig, VllmLocalEngine

        return VllmLocalEngine(VllmLocalConfig.from_dict(options))
    if kind == "openai":
        from cosmos_reason_ros.engines.openai_http import OpenAIServerConfig, OpenAIServerEngine

        return OpenAIServerEngine(OpenAIServerConfig.from_dict(options))
    raise BadRequestError(f"engine kind {kind!r} is unknown; allowed: {', '.join(ENGINE_KINDS)}")
