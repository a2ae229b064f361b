"""Build tiny, randomly initialised Qwen2.5-VL / Qwen3-VL checkpoints entirely offline.

Tests and the CPU demo need a real checkpoint that vLLM loads, with the real chat template,
processor and Qwen special tokens, but nothing may be downloaded. This builder trains a small
byte-level BPE tokenizer with ``tokenizers`` (Qwen2's pre-tokenizer), appends the Qwen special
tokens, and saves a few-MB model with deterministic random weights.

Usage::

    ros2 run cosmos_reason_ros tiny_model --arch qwen3_vl --out DIR   # build into DIR
    ros2 run cosmos_reason_ros tiny_model --arch qwen3_vl --cache     # build once, print path
    python -m cosmos_reason_ros.eval.tiny_model --cache              # the same from a checkout

``ensure_tiny_model(arch)`` returns a cached directory keyed by this file's content, so tests
and the demo build each architecture once per machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Same pre-tokenisation regex as transformers' Qwen2Tokenizer.
PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501

# Qwen special tokens, in Qwen's own order (ids are assigned after the BPE vocab).
QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Non-special added tokens (Qwen marks these special=False).
QWEN_ADDED = [
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]

# Qwen2-VL / Qwen2.5-VL chat template (as shipped with Qwen2.5-VL-*-Instruct).
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3-VL style template (no default system prompt, like Qwen3-VL-*-Instruct),
# simplified: no tool calling.
QWEN3_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def synthetic_corpus(n_lines: int = 4000, seed: int = 0) -> list[str]:
    """Deterministic English-ish + JSON + robotics text to learn a small BPE."""
    rng = random.Random(seed)
    words = (
        "the a an robot arm gripper camera image video frame object table cup box red green blue "
        "yellow left right front behind above below near far move pick place grasp push pull open "
        "close door drawer person hand safe unsafe collision obstacle path plan step next action "
        "answer question reason because therefore yes no true false null what where which is are "
        "can should will not there this that scene shows contains visible hidden count number of "
        "and or with without in on at to from by for is was be been being have has had do does "
        "you i we they it he she assistant user system helpful describe explain think final"
    ).split()
    json_bits = [
        '{"answer": "',
        '"}',
        '{"safe": true}',
        '{"safe": false}',
        '"reason": "',
        '"confidence": 0.',
        '"objects": [',
        "]",
        '{"x": ',
        ', "y": ',
        "}",
        ", ",
        '": ',
        '"label": "',
        '"count": ',
        "true",
        "false",
        "null",
    ]
    lines = []
    for _ in range(n_lines):
        k = rng.randint(4, 16)
        s = " ".join(rng.choice(words) for _ in range(k))
        if rng.random() < 0.5:
            s = s.capitalize() + rng.choice([".", "?", "!", ",", ":", ";"])
        if rng.random() < 0.4:
            s += " " + "".join(rng.choice(json_bits) for _ in range(rng.randint(2, 6)))
        if rng.random() < 0.3:
            s += " " + str(rng.randint(0, 100000)) + " " + f"{rng.random():.3f}"
        lines.append(s)
    return lines


def train_byte_bpe(bpe_vocab: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a Qwen2-style byte-level BPE on the synthetic corpus; return (vocab, merges)."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(synthetic_corpus(), trainer=trainer)
    model_json = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
              for m in model_json["merges"]]
    return model_json["vocab"], merges


def qwen2_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]],
                    model_max_length: int = 32768):
    """Wrap a vocab that already holds the Qwen added tokens as transformers' Qwen2Tokenizer."""
    from transformers import AddedToken
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    hf_tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        errors="replace",
        model_max_length=model_max_length,
        split_special_tokens=False,
    )
    # Qwen order: specials first, then the non-special ones.
    hf_tok.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIALS], special_tokens=True
    )
    hf_tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_ADDED])
    return hf_tok


def build_tokenizer(bpe_vocab: int):
    """Train a Qwen2-style byte-level BPE and wrap it as transformers' Qwen2Tokenizer."""
    vocab, merges = train_byte_bpe(bpe_vocab)
    # Put the Qwen added tokens right after the BPE vocab, in Qwen's order, so that
    # <|endoftext|> < <|im_start|> < <|im_end|> < ... < <|image_pad|> < <|video_pad|>.
    base = len(vocab)
    for i, t in enumerate(QWEN_SPECIALS + QWEN_ADDED):
        vocab[t] = base + i
    return qwen2_tokenizer(vocab, merges)


@dataclass(frozen=True)
class TinyModelSpec:
    """Sizes of the tiny model; the defaults give a few-MB checkpoint that vLLM runs on a CPU."""

    arch: str = "qwen3_vl"  # "qwen3_vl" | "qwen2_5_vl"
    hidden: int = 128  # text hidden size
    layers: int = 2
    heads: int = 4  # head_dim = hidden / heads; keep 32 or 64
    kv_heads: int = 2
    vision_hidden: int = 64
    vision_depth: int = 2
    vision_heads: int = 2
    bpe_vocab: int = 1000
    max_pixels: int = 0  # 0: 64 merged tokens' worth (64 * 4 * patch^2)
    dtype: str = "bfloat16"
    seed: int = 0


def build_tiny_model(out: str, spec: TinyModelSpec = TinyModelSpec()) -> dict:
    """Write a tiny random-weight checkpoint for ``spec.arch`` into ``out``; return its facts."""
    import torch

    torch.manual_seed(spec.seed)
    os.makedirs(out, exist_ok=True)

    tok = build_tokenizer(spec.bpe_vocab)
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIALS + QWEN_ADDED}
    n_tok = len(tok)
    vocab_size = ((n_tok + 63) // 64) * 64  # pad like real checkpoints do
    head_dim = spec.hidden // spec.heads
    half = head_dim // 2  # mrope_section sums to head_dim/2

    if spec.arch == "qwen2_5_vl":
        from transformers import (
            Qwen2_5_VLConfig,
            Qwen2_5_VLForConditionalGeneration,
            Qwen2_5_VLProcessor,
        )
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        patch = 14
        mrope = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
        cfg = Qwen2_5_VLConfig(
            text_config=dict(
                vocab_size=vocab_size,
                hidden_size=spec.hidden,
                intermediate_size=spec.hidden * 2,
                num_hidden_layers=spec.layers,
                num_attention_heads=spec.heads,
                num_key_value_heads=spec.kv_heads,
                max_position_embeddings=32768,
                rms_norm_eps=1e-6,
                hidden_act="silu",
                use_sliding_window=False,
                max_window_layers=spec.layers,
                tie_word_embeddings=False,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 1000000.0,
                    "mrope_section": mrope,
                },
                bos_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"],
                dtype=spec.dtype,
            ),
            vision_config=dict(
                depth=spec.vision_depth,
                hidden_size=spec.vision_hidden,
                intermediate_size=spec.vision_hidden * 2,
                num_heads=spec.vision_heads,
                in_channels=3,
                patch_size=patch,
                spatial_merge_size=2,
                temporal_patch_size=2,
                tokens_per_second=2,
                window_size=112,
                out_hidden_size=spec.hidden,
                fullatt_block_indexes=[spec.vision_depth - 1],
                hidden_act="silu",
            ),
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
            tie_word_embeddings=False,
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
        )
        model_cls, proc_cls, template = (
            Qwen2_5_VLForConditionalGeneration,
            Qwen2_5_VLProcessor,
            QWEN2_5_VL_CHAT_TEMPLATE,
        )
        mean, std = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
    else:
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        patch = 16
        m0 = half - 2 * (half * 5 // 16)
        mrope = [m0, half * 5 // 16, half * 5 // 16]  # e.g. 128-dim heads -> [24, 20, 20]
        cfg = Qwen3VLConfig(
            text_config=dict(
                vocab_size=vocab_size,
                hidden_size=spec.hidden,
                intermediate_size=spec.hidden * 2,
                num_hidden_layers=spec.layers,
                num_attention_heads=spec.heads,
                num_key_value_heads=spec.kv_heads,
                head_dim=head_dim,
                max_position_embeddings=32768,
                rms_norm_eps=1e-6,
                hidden_act="silu",
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 5000000.0,
                    "mrope_section": mrope,
                    "mrope_interleaved": True,
                },
                bos_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"],
                tie_word_embeddings=False,
                dtype=spec.dtype,
            ),
            vision_config=dict(
                depth=spec.vision_depth,
                hidden_size=spec.vision_hidden,
                intermediate_size=spec.vision_hidden * 2,
                num_heads=spec.vision_heads,
                in_channels=3,
                patch_size=patch,
                spatial_merge_size=2,
                temporal_patch_size=2,
                out_hidden_size=spec.hidden,
                num_position_embeddings=256,
                deepstack_visual_indexes=[0],
                hidden_act="gelu_pytorch_tanh",
            ),
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
            tie_word_embeddings=False,
        )
        model_cls, proc_cls, template = (
            Qwen3VLForConditionalGeneration,
            Qwen3VLProcessor,
            QWEN3_VL_CHAT_TEMPLATE,
        )
        mean, std = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]

    max_pixels = spec.max_pixels or 64 * 4 * patch * patch
    min_pixels = 4 * 4 * patch * patch // 4  # >= one merged token
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
        patch_size=patch,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=mean,
        image_std=std,
    )
    processor_kwargs = dict(image_processor=image_processor, tokenizer=tok, chat_template=template)
    try:  # video processors exist only with a working torchvision
        if spec.arch == "qwen2_5_vl":
            from transformers import Qwen2VLVideoProcessor as VP

            vp = VP(
                size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
                patch_size=patch,
                temporal_patch_size=2,
                merge_size=2,
                image_mean=mean,
                image_std=std,
                min_frames=2,
                max_frames=16,
            )
        else:
            from transformers import Qwen3VLVideoProcessor as VP

            vp = VP(
                size={"shortest_edge": min_pixels, "longest_edge": max_pixels * 4},
                patch_size=patch,
                temporal_patch_size=2,
                merge_size=2,
                image_mean=mean,
                image_std=std,
                fps=2,
                min_frames=2,
                max_frames=16,
            )
        processor_kwargs["video_processor"] = vp
    except Exception as e:  # noqa: BLE001
        print(f"WARNING: no video processor ({type(e).__name__}: {e}); images only")
    processor = proc_cls(**processor_kwargs)

    model = model_cls(cfg)
    model = model.to(getattr(torch, spec.dtype))
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.bos_token_id = ids["<|endoftext|>"]
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    tok.save_pretrained(out)
    # Also keep the template in tokenizer_config.json (some tools read only that).
    tc_path = os.path.join(out, "tokenizer_config.json")
    tc = json.load(open(tc_path))
    tc["chat_template"] = template
    json.dump(tc, open(tc_path, "w"), indent=2, ensure_ascii=False)

    n_params = sum(p.numel() for p in model.parameters())
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    return {
        "out": out,
        "arch": spec.arch,
        "params": n_params,
        "dir_bytes": size,
        "len_tokenizer": n_tok,
        "vocab_size": vocab_size,
        "token_ids": {
            k: ids[k]
            for k in [
                "<|endoftext|>",
                "<|im_start|>",
                "<|im_end|>",
                "<|vision_start|>",
                "<|vision_end|>",
                "<|image_pad|>",
                "<|video_pad|>",
            ]
        },
        "mrope_section": mrope,
        "max_pixels": max_pixels,
    }


def default_cache_root() -> Path:
    """Where built models are cached: $COSMOS_REASON_CACHE, else ~/.cache/cosmos_reason_ros."""
    env = os.environ.get("COSMOS_REASON_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "cosmos_reason_ros"


def ensure_tiny_model(arch: str = "qwen3_vl", cache_root: Path | None = None) -> Path:
    """Return a cached tiny checkpoint for ``arch``, building it once (atomically) if missing.

    The cache key covers this file's source and the spec, so a change to the builder gives a
    fresh model instead of a stale one.
    """
    spec = TinyModelSpec(arch=arch)
    digest = hashlib.sha256(Path(__file__).read_bytes() + repr(spec).encode()).hexdigest()[:12]
    root = cache_root or default_cache_root()
    target = root / f"tiny-{arch}-{digest}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".build-{arch}-") as tmp:
        build_tiny_model(tmp, spec)
        try:
            os.rename(tmp, target)  # atomic: concurrent builders race, one wins
        except OSError:
            if not (target / "config.json").is_file():
                raise
        os.makedirs(tmp, exist_ok=True)  # TemporaryDirectory cleanup expects it
    return target


def main(argv: list[str] | None = None) -> int:
    """Command line: build into --out, or into the cache with --cache (prints the path)."""
    ap = argparse.ArgumentParser(
        prog="tiny_model",  # the console script's name (setup.py), also under python -m
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--arch", choices=["qwen2_5_vl", "qwen3_vl"], default="qwen3_vl")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="directory to write the checkpoint into")
    where.add_argument("--cache", action="store_true", help="build into the cache, print path")
    args = ap.parse_args(argv)
    if args.cache:
        print(ensure_tiny_model(args.arch))
    else:
        print(json.dumps(build_tiny_model(args.out, TinyModelSpec(arch=args.arch)), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
