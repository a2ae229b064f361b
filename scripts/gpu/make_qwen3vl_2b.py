#!/usr/bin/env python3
"""Build a random-weight Qwen3-VL-2B (= Cosmos-Reason2-2B) checkpoint for GPU benchmarks.

A RANDOM-WEIGHT model directory with the exact architecture of
Qwen3-VL-2B-Instruct (= NVIDIA Cosmos-Reason2-2B): Qwen3VLForConditionalGeneration, bf16,
safetensors, plus a small offline byte-level BPE tokenizer with the Qwen special tokens,
a Qwen3-VL processor (Qwen2VL image processor, patch 16, merge 2, mean/std 0.5) and a
Qwen3-VL-style chat template. Nothing is downloaded.

Tokenizer / processor / chat-template code is reused from ../reference/make_tiny_vlm.py;
the model dimensions are the real 2B ones (see CONFIG below).

Usage:  python make_qwen3vl_2b.py --out /root/m2b [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

# Same pre-tokenisation regex as transformers' Qwen2Tokenizer.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

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
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
              "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
              "<tool_response>", "</tool_response>", "<think>", "</think>"]

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
    json_bits = ['{"answer": "', '"}', '{"safe": true}', '{"safe": false}', '"reason": "',
                 '"confidence": 0.', '"objects": [', ']', '{"x": ', ', "y": ', '}', ', ', '": ',
                 '"label": "', '"count": ', "true", "false", "null"]
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


def build_tokenizer(bpe_vocab: int):
    """Train a Qwen2-style byte-level BPE and wrap it as transformers' Qwen2Tokenizer."""
    from transformers import AddedToken
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
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
    vocab = model_json["vocab"]
    merges = model_json["merges"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in merges]
    # Put the Qwen added tokens right after the BPE vocab, in Qwen's order, so that
    # <|endoftext|> < <|im_start|> < <|im_end|> < ... < <|image_pad|> < <|video_pad|>.
    base = len(vocab)
    for i, t in enumerate(QWEN_SPECIALS + QWEN_ADDED):
        vocab[t] = base + i

    hf_tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        errors="replace",
        model_max_length=32768,
        split_special_tokens=False,
    )
    # Qwen order: specials first (ids right after the BPE vocab), then the non-special ones.
    hf_tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIALS],
                      special_tokens=True)
    hf_tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_ADDED])
    return hf_tok




REAL_VOCAB = 151936      # embedding rows of Qwen3-VL-2B (text_config.vocab_size)
REAL_SPECIAL_BASE = 151643  # id of <|endoftext|> in the real Qwen tokenizer


def build_tokenizer_full(bpe_vocab: int):
    """Build a tokenizer whose vocabulary covers every embedding row (151936 ids).

    Like build_tokenizer(), but the vocabulary covers EVERY embedding row and the
    Qwen special tokens get their real ids (<|endoftext|>=151643 ... <|image_pad|>=151655).

    Random weights sample ids uniformly over all 151936 rows; a tokenizer with only a few
    thousand ids would make detokenization fail. The gap ids are plain vocab entries
    ("<unusedN>") that no merge produces: they are never emitted by encoding but decode fine.
    """
    from transformers import AddedToken
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=bpe_vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(synthetic_corpus(), trainer=trainer)
    model_json = json.loads(tok.to_str())["model"]
    vocab = model_json["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
              for m in model_json["merges"]]
    n = len(vocab)
    assert sorted(vocab.values()) == list(range(n))

    def fill(lo, hi):
        for i in range(lo, hi):
            t = f"<unused{i}>"
            assert t not in vocab
            vocab[t] = i

    fill(n, REAL_SPECIAL_BASE)
    added = QWEN_SPECIALS + QWEN_ADDED
    for i, t in enumerate(added):
        vocab[t] = REAL_SPECIAL_BASE + i
    fill(REAL_SPECIAL_BASE + len(added), REAL_VOCAB)
    assert sorted(vocab.values()) == list(range(REAL_VOCAB))

    hf_tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None,
                            eos_token="<|im_end|>", pad_token="<|endoftext|>", errors="replace",
                            model_max_length=262144, split_special_tokens=False)
    hf_tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIALS],
                      special_tokens=True)
    hf_tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_ADDED])
    return hf_tok


def main() -> None:
    """Parse the arguments, build the tokenizer, processor and model, save them."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bpe-vocab", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true",
                    help="LOCAL LOGIC TEST ONLY: tiny dims, same tokenizer/vocab/processor")
    args = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)

    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = build_tokenizer_full(args.bpe_vocab)
    assert len(tok) == REAL_VOCAB, len(tok)
    assert tok.convert_tokens_to_ids("<|image_pad|>") == 151655
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIALS + QWEN_ADDED}

    # ---- Qwen3-VL-2B-Instruct dimensions (config.json of Qwen/Qwen3-VL-2B-Instruct) ----
    text_config = dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144,
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        hidden_act="silu", max_position_embeddings=262144, rms_norm_eps=1e-6,
        attention_bias=False, attention_dropout=0.0, initializer_range=0.02, use_cache=True,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                         "mrope_section": [24, 20, 20], "mrope_interleaved": True},
        tie_word_embeddings=True, dtype="bfloat16",
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    vision_config = dict(
        depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, in_channels=3,
        patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=2048,
        num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17],
        hidden_act="gelu_pytorch_tanh", initializer_range=0.02,
    )
    if args.tiny:
        text_config.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           max_position_embeddings=8192)
        text_config["rope_parameters"]["mrope_section"] = [6, 5, 5]
        vision_config.update(depth=2, hidden_size=64, intermediate_size=128, num_heads=2,
                             out_hidden_size=128, num_position_embeddings=256,
                             deepstack_visual_indexes=[0])
    cfg = Qwen3VLConfig(
        text_config=text_config, vision_config=vision_config,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    patch = 16
    mean, std = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]
    # Qwen3-VL-2B-Instruct preprocessor_config.json: shortest_edge 65536, longest_edge 16777216
    min_pixels, max_pixels = 65536, 16777216
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
        patch_size=patch, temporal_patch_size=2, merge_size=2, image_mean=mean, image_std=std,
    )
    processor_kwargs = dict(image_processor=image_processor, tokenizer=tok,
                            chat_template=QWEN3_VL_CHAT_TEMPLATE)
    try:
        from transformers import Qwen3VLVideoProcessor as VP
        processor_kwargs["video_processor"] = VP(
            size={"shortest_edge": 4096, "longest_edge": 25165824}, patch_size=patch,
            temporal_patch_size=2, merge_size=2, image_mean=mean, image_std=std,
            fps=2, min_frames=4, max_frames=768)
    except Exception as e:  # noqa: BLE001
        print(f"WARNING: no video processor ({type(e).__name__}: {e}); images only")
    processor = Qwen3VLProcessor(**processor_kwargs)

    t1 = time.time()
    with torch.device(args.device):
        model = Qwen3VLForConditionalGeneration(cfg)
    model = model.to(torch.bfloat16)
    t2 = time.time()
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.bos_token_id = ids["<|endoftext|>"]
    model.generation_config.do_sample = False
    model.save_pretrained(args.out, safe_serialization=True)
    processor.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    tc_path = os.path.join(args.out, "tokenizer_config.json")
    tc = json.load(open(tc_path))
    tc["chat_template"] = QWEN3_VL_CHAT_TEMPLATE
    json.dump(tc, open(tc_path, "w"), indent=2, ensure_ascii=False)
    t3 = time.time()
    n_params = sum(p.numel() for p in model.parameters())
    n_vis = sum(p.numel() for n, p in model.named_parameters()
                if ".visual." in n or n.startswith("visual") or "model.visual" in n)
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print(json.dumps({"out": args.out, "params": n_params, "vision_params": n_vis,
                      "dir_bytes": size, "len_tokenizer": len(tok),
                      "token_ids": {k: ids[k] for k in [
                          "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                          "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]},
                      "t_tokenizer_s": round(t1 - t0, 2), "t_init_s": round(t2 - t1, 2),
                      "t_save_s": round(t3 - t2, 2), "device": args.device}, indent=1))


if __name__ == "__main__":
    main()
