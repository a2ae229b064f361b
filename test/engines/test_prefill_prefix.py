"""The prefill request renders to a token prefix of every goal about the same frame.

Prefix caching matches token blocks, so the shared part must be identical after the model's
own chat template and tokenizer, not only as messages.
"""

import importlib.util

import numpy as np
import pytest

from cosmos_reason_ros.core import query
from cosmos_reason_ros.core.models import PROFILES
from cosmos_reason_ros.core.types import Task
from cosmos_reason_ros.engines.vllm_local import _template_messages

# The model's own tokenizer (transformers comes with vLLM; the jazzy-py310 venv has neither).
# Looked up, not imported, here: every pytest worker collects every module, and importing
# transformers (torch with it) took 5-37 s of each worker's start.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="needs transformers (vLLM's)")

CASES = [("qwen3_vl", "cosmos_reason2"), ("qwen2_5_vl", "cosmos_reason1")]


def _render(tokenizer, request):
    return tokenizer.apply_chat_template(_template_messages(request), tokenize=False,
                                         add_generation_prompt=True)


@pytest.mark.parametrize("arch,family", CASES)
@pytest.mark.parametrize("reasoning", [False, True])
def test_prefill_renders_to_the_prefix_of_goal_prompts(request, arch, family, reasoning):
    model_dir = request.getfixturevalue(f"tiny_{arch}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    profile = PROFILES[family]
    media = query.prepare_image(profile, np.zeros((480, 640, 3), np.uint8))
    prefill_text = _render(tokenizer, query.build_prefill_request("p", profile, media,
                                                                  reasoning=reasoning))
    # The shared part ends with the media turn's last vision token.
    shared = prefill_text[:prefill_text.rindex("<|vision_end|>") + len("<|vision_end|>")]
    for task, targets in ((Task.VQA, []), (Task.GROUND, ["cup"]), (Task.VERIFY, [])):
        spec = query.make_spec(profile, task=task, prompt="Is the cup full?", targets=targets,
                               reasoning=reasoning)
        goal_text = _render(tokenizer, query.build_request("g", profile, spec, media))
        assert goal_text.startswith(shared), (task, goal_text[:300])
        shared_ids = tokenizer(shared)["input_ids"]
        assert tokenizer(goal_text)["input_ids"][:len(shared_ids)] == shared_ids
