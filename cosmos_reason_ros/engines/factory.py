"""The registry of engine kinds; a backend is imported only when chosen (vLLM is heavy)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from cosmos_reason_ros.core.types import BadRequestError
from cosmos_reason_ros.engines.base import Engine

# kind -> (module, engine class, config class with ``from_dict``). The one list of kinds:
# the ``engine.kind`` parameter's choices come from here.
ENGINE_KINDS: dict[str, tuple[str, str, str]] = {
    "vllm": ("cosmos_reason_ros.engines.vllm_local", "VllmLocalEngine", "VllmLocalConfig"),
    "openai": ("cosmos_reason_ros.engines.openai_http", "OpenAIServerEngine",
               "OpenAIServerConfig"),
}


def create_engine(kind: str, options: Mapping[str, Any]) -> Engine:
    """Build the engine ``kind`` ('vllm' in-process, 'openai' server client) from options."""
    if kind not in ENGINE_KINDS:
        raise BadRequestError(f"engine kind {kind!r} is unknown; allowed: "
                              f"{', '.join(ENGINE_KINDS)}")
    module_name, engine_class, config_class = ENGINE_KINDS[kind]
    module = importlib.import_module(module_name)
    config = getattr(module, config_class).from_dict(options)
    return getattr(module, engine_class)(config)
