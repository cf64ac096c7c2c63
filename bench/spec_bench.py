"""The prompts and outputs the free-drafts and floor benches share: Spec-Bench's questions (shipped in
data/spec_bench with their licence), a few of our own code edits, and the demo's two prompts."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from harness.cluster import REPO_ROOT
from bench.demo import GROUNDED_PROMPT, OPEN_PROMPT
from bench.prompt_set import CODE

SPEC_BENCH = REPO_ROOT / "data" / "spec_bench" / "question.jsonl"
CODE_EDITS = [text for text in CODE if "\n\n" in text][:3]   # edits of given code: the answer repeats the prompt


def prompt_parser(prog: str, description: str, per_category: int) -> argparse.ArgumentParser:
    """A bench's parser with the prompt set's flags: --prompts-file, --per-category, --tokens, --out."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts-file", type=Path, default=SPEC_BENCH,
                        help="JSONL questions {\"category\", \"turns\"} (default: Spec-Bench's, shipped in data/)")
    parser.add_argument("--per-category", type=int, default=per_category,
                        help="questions of each category (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per generation (default %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="write JSON here and markdown beside it (.md)")
    return parser


def check_prompt_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.per_category < 1 or args.tokens < 1:
        parser.error("--per-category and --tokens must be >= 1")
    if not args.prompts_file.is_file():
        parser.error(f"--prompts-file: no such file {args.prompts_file}")


def bench_prompts(path: Path, per_category: int) -> list[tuple[str, str]]:
    """(category, text): the first turns of the first ``per_category`` questions of each category in ``path``,
    in file order, then our code edits and the demo's two prompts."""
    taken: dict[str, int] = {}
    out = []
    for line in path.read_text().splitlines():
        question = json.loads(line)
        if taken.get(question["category"], 0) < per_category:
            taken[question["category"]] = taken.get(question["category"], 0) + 1
            out.append((question["category"], question["turns"][0]))
    return out + [("code-edit", text) for text in CODE_EDITS] + [("demo-edit", GROUNDED_PROMPT),
                                                                   ("demo-open", OPEN_PROMPT)]


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")
