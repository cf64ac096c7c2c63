"""What kind of request a prompt is: code, factual QA or chat — a cheap, pure signal.

Used to pick a per-task relaxed-verification weight and as a router feature. It is
a keyword score, not a model: good enough to separate "write a function" from
"what causes the seasons" from "suggest a name for my cat", and wrong sometimes.
"""
from __future__ import annotations

import re
from dataclasses import replace

from edgespec.errors import InvalidArgument
from edgespec.verify.relaxed import WeightHead
from edgespec.verify.sampling import SamplingParams

CATEGORIES = ("code", "qa", "chat")

_CODE = re.compile(r"```|\bdef |\bclass |\breturn\b|\bimport |\bfunction\b|\bpython\b|\bjavascript\b|\bjava\b|"
                   r"\bc\+\+|\brust\b|\bsql\b|\bcode\b|\bimplement|\bcompile|\bregex|\bbug\b|\bscript\b|[{};]\s*$|"
                   r"\bapi\b|\balgorithm|\barray\b|\blist\b.*\bpython|\bstring\b", re.IGNORECASE | re.MULTILINE)
_QA = re.compile(r"(^|[.!?]\s+)(what|who|when|where|why|how|which|explain|define|describe|is|are|does|did)\b|"
                 r"\bdifference between\b|\bcapital of\b|\bmeaning of\b", re.IGNORECASE | re.MULTILINE)


def categorize(prompt: str) -> str:
    """'code', 'qa' or 'chat'."""
    code = len(_CODE.findall(prompt))
    if code >= 1 and (code >= 2 or not _QA.search(prompt) or "def " in prompt or "```" in prompt):
        return "code"
    if _QA.search(prompt):
        return "qa"
    return "chat"


def resolve_task(params: SamplingParams, prompt: str, head: WeightHead) -> SamplingParams:
    """Replace a per-task request by its measured static weight ("auto" = the prompt's category)."""
    relax = params.relaxation
    task = categorize(prompt) if relax.task == "auto" else relax.task
    if task not in head.task_weights:
        raise InvalidArgument("sampling.relaxation.task", f"no measured weight for task {task!r}")
    return replace(params, relaxation=replace(relax, weight=round(head.task_weights[task], 3), task=task))
