#!/usr/bin/env python3
"""Check, without importing vLLM, that a vLLM source tree has what ``engines/vllm_local`` uses.

    python scripts/gpu/check_vllm_api.py /work/gpu-dep/sitebuild/vllm     # vLLM 0.24 (the H200)
    python scripts/gpu/check_vllm_api.py .venv-kilted/lib/python3.11/site-packages/vllm

Reads the tree's ``engine/arg_utils.py``, ``sampling_params.py``, ``config/structured_outputs.py``,
``v1/engine/async_llm.py`` and exception modules with ``ast`` and compares them with every engine
argument ``VllmLocalConfig.engine_args()`` can emit (all fields set), the SamplingParams and
StructuredOutputs fields ``_sampling_params``/``_build_engine_args`` pass, and the AsyncLLM
methods and keyword arguments the engine calls. Prints ``OK``/``MISSING``/``absent (fallback)``
lines; exits 1 when something without a fallback is missing.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "presence_penalty",
                   "repetition_penalty", "seed", "ignore_eos", "output_kind", "structured_outputs")
# AsyncLLM members the engine uses; (name, required keyword arguments)
ASYNC_LLM = (("from_engine_args", ()), ("generate", ("priority", "reasoning_ended")),
             ("abort", ()), ("shutdown", ("timeout",)), ("get_tokenizer", ()), ("errored", ()))
# (module file, class, fallback in vllm_local when absent)
EXCEPTIONS = (("v1/engine/exceptions.py", "EngineDeadError", False),
              ("v1/engine/exceptions.py", "EngineGenerateError", False),
              ("exceptions.py", "VLLMClientError", True),
              ("exceptions.py", "GracefulHTTPError", True))


def classes(path: str) -> dict[str, ast.ClassDef]:
    """Top-level classes of a source file (empty when the file does not exist)."""
    if not os.path.exists(path):
        return {}
    tree = ast.parse(open(path, encoding="utf-8").read())
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def fields(cls: ast.ClassDef | None) -> set[str]:
    """Annotated class attributes (dataclass / msgspec fields)."""
    if cls is None:
        return set()
    return {s.target.id for s in cls.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def methods(cls: ast.ClassDef | None) -> dict[str, set[str]]:
    """Map each method name to its argument names (properties included)."""
    if cls is None:
        return {}
    out = {}
    for s in cls.body:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = s.args
            out[s.name] = {x.arg for x in a.args + a.kwonlyargs}
    return out


def main(argv: list[str]) -> int:
    """Compare the tree named in argv[0] with what vllm_local uses; 1 on a hard miss."""
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        print("usage: check_vllm_api.py PATH/TO/vllm (the package directory)", file=sys.stderr)
        return 2
    root = argv[0]
    from cosmos_reason_ros.engines.vllm_local import VllmLocalConfig

    version = "?"
    vfile = os.path.join(root, "_version.py")
    if os.path.exists(vfile):
        for line in open(vfile, encoding="utf-8"):
            if line.startswith("__version__"):
                version = line.split("=")[-1].strip().strip("'\"")
    print(f"vLLM source tree {root} (version {version})")
    missing_hard: list[str] = []

    def report(ok: bool, what: str, fallback: bool = False) -> None:
        if ok:
            print(f"OK {what}")
        elif fallback:
            print(f"absent (fallback in vllm_local) {what}")
        else:
            print(f"MISSING {what}")
            missing_hard.append(what)

    # every engine argument the config can emit: set each optional field to a value
    probe = {"model": "/m", "served_model_name": "m", "tokenizer": "/m", "quantization": "fp8",
             "mm_processor_kwargs": {"a": 1}, "reasoning_parser": "qwen3"}
    for f in dataclasses.fields(VllmLocalConfig):
        if f.name not in probe and f.default is None:
            probe[f.name] = 1.0 if "gb" in f.name else 1
    cfg = VllmLocalConfig(**{k: v for k, v in probe.items()
                             if k in {f.name for f in dataclasses.fields(VllmLocalConfig)}})
    args_cls = classes(os.path.join(root, "engine", "arg_utils.py"))
    engine_fields = fields(args_cls.get("EngineArgs")) | fields(args_cls.get("AsyncEngineArgs"))
    for key in sorted(cfg.engine_args()) + ["structured_outputs_config"]:
        report(key in engine_fields, f"AsyncEngineArgs.{key}")

    sp = classes(os.path.join(root, "sampling_params.py"))
    sp_fields = fields(sp.get("SamplingParams"))
    for key in SAMPLING_FIELDS:
        report(key in sp_fields, f"SamplingParams.{key}")
    report("json" in fields(sp.get("StructuredOutputsParams")), "StructuredOutputsParams.json")
    kind = sp.get("RequestOutputKind")
    members = {t.id for st in (kind.body if kind else []) if isinstance(st, ast.Assign)
               for t in st.targets if isinstance(t, ast.Name)}
    report("DELTA" in members, "RequestOutputKind.DELTA")
    so = classes(os.path.join(root, "config", "structured_outputs.py")).get(
        "StructuredOutputsConfig")
    for key in ("backend", "disable_any_whitespace"):
        report(key in fields(so), f"StructuredOutputsConfig.{key}")

    llm = methods(classes(os.path.join(root, "v1", "engine", "async_llm.py")).get("AsyncLLM"))
    for name, kwargs in ASYNC_LLM:
        report(name in llm, f"AsyncLLM.{name}")
        for kw in kwargs:
            report(kw in llm.get(name, set()), f"AsyncLLM.{name}({kw}=...)")
    op = methods(classes(os.path.join(root, "v1", "engine", "output_processor.py"))
                 .get("OutputProcessor"))
    report("get_num_unfinished_requests" in llm or "get_num_unfinished_requests" in op,
           "AsyncLLM.get_num_unfinished_requests or OutputProcessor.get_num_unfinished_requests")
    for path, name, fallback in EXCEPTIONS:
        report(name in classes(os.path.join(root, path)), f"{path.replace('/', '.')[:-3]}.{name}",
               fallback)
    print("result:", "all used names present" if not missing_hard
          else f"{len(missing_hard)} missing: {', '.join(missing_hard)}")
    return 1 if missing_hard else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
