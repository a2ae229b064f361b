"""Make PyPI's CUDA build of torchvision importable next to CPU torch.

torchvision 0.28.0 (the build pip finds for torch 2.13 here) registers fake kernels for its
``nms``/``qnms`` C ops unconditionally; on a CPU-only torch those ops do not exist and
``import torchvision`` dies. vLLM's Qwen-VL code only needs torchvision's transforms, so the two
registrations are guarded on ``torchvision.extension._has_ops()``. Idempotent.
"""

import importlib.util
import os
import pathlib
import re
import sys


def main() -> int:
    """Patch the installed torchvision in place; print what was done."""
    spec = importlib.util.find_spec("torchvision")  # does not execute torchvision/__init__
    if spec is None or not spec.submodule_search_locations:
        print("patch_torchvision: torchvision not installed, nothing to do")
        return 0
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "_meta_registrations.py"
    source = path.read_text()
    patched = re.sub(
        r'^@torch\.library\.register_fake\("torchvision::(q?nms)"\)',
        r'@(torch.library.register_fake("torchvision::\1") '
        r"if torchvision.extension._has_ops() else (lambda f: f))",
        source,
        flags=re.M,
    )
    if patched != source:
        # A new file, not a rewrite in place: uv hard-links installed files to its cache, and
        # an in-place write would patch the cached wheel of every other environment too.
        tmp = path.with_suffix(".py.patching")
        tmp.write_text(patched)
        os.replace(tmp, path)
        print(f"patch_torchvision: patched {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
