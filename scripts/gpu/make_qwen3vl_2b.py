#!/usr/bin/env python3
"""Build a random-weight Qwen3-VL-2B (= Cosmos-Reason2-2B) checkpoint for GPU benchmarks.

A RANDOM-WEIGHT model directory with the exact architecture of
Qwen3-VL-2B-Instruct (= NVIDIA Cosmos-Reason2-2B): Qwen3VLForConditionalGeneration, bf16,
safetensors, plus a small offline byte-level BPE tokenizer with the Qwen special tokens,
a Qwen3-VL processor (Qwen2VL image processor, patch 16, merge 2, mean/std 0.5) and a
Qwen3-VL-style chat template. Nothing is downloaded.

The tokenizer and chat template come from cosmos_reason_ros.eval.tiny_model (the tests'
builder); the model dimensions are the real 2B ones (see main()).

Usage:  python make_qwen3vl_2b.py --out /root/m2b [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, when run as a script
from cosmos_reason_ros.eval.tiny_model import (  # noqa: E402
    QWEN3_VL_CHAT_TEMPLATE,
    QWEN_ADDED,
    QWEN_SPECIALS,
    qwen2_tokenizer,
    train_byte_bpe,
)

REAL_VOCAB = 151936      # embedding rows of Qwen3-VL-2B (text_config.vocab_size)
REAL_SPECIAL_BASE = 151643  # id of <|endoftext|> in the real Qwen tokenizer


def build_tokenizer_full(bpe_vocab: int):
    """Build a tokenizer whose vocabulary covers every embedding row (151936 ids).

    Like tiny_model.build_tokenizer(), but the Qwen special tokens get their real ids
    (<|endoftext|>=151643 ... <|image_pad|>=151655). Random weights sample ids uniformly over
    all 151936 rows; a tokenizer with only a few thousand ids would make detokenization fail.
    The gap ids are plain vocab entries ("<unusedN>") that no merge produces: they are never
    emitted by encoding but decode fine.
    """
    vocab, merges = train_byte_bpe(bpe_vocab)
    n = len(vocab)
    assert sorted(vocab.values()) == list(range(n))

    def fill(lo: int, hi: int) -> None:
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
    return qwen2_tokenizer(vocab, merges, model_max_length=262144)


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
