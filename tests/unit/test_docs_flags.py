"""The docs agree with the code: README.md's Configuration table against the services' argparse defaults, and
every `edgespec COMMAND` the docs and the services' help name against the commands edge_client/cli.py has.

A row is ``| service[, service] | `--flag`[, `--flag2`] | default[, default2] | meaning |``: one default per
flag (or one for all of them), and "a / b" in a row of several services is each service's own default, in
the order listed; "all" is every service. The code is the truth: a row that states another default fails.
A default is compared strictly: numbers as numbers (``4 MiB`` = 4194304), ``off`` as an unset/0/False value,
other words as the string itself; the few defaults the table describes in words are listed in DESCRIBED,
each with the value it stands for.
"""
from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("coordinator", "drafter", "verifier")

# Defaults the table states in words, and the argparse default each stands for.
DESCRIBED = {
    ("--threads", "torch default"): 0,            # 0 = the backend's own thread count
    ("--rate-burst", "2×rate"): 0,                # 0 = twice the rate
    ("--window", "auto"): -1,                     # window_arg("auto")
    ("--tree-depth", "auto"): -1,
    ("--profile-window", "8, at most --max-window"): None,   # None = min(8, --max-window)
    ("--http-host", "--host"): "",                # "" = the --host address
    ("--ctx-tokens", "by --exact"): None,         # None = llamacpp.context_size's default for the mode
    ("--prefill-chunk", "64 (llamacpp), 0 (torch)"): None,   # None = llamacpp.PREFILL_CHUNK, or 0 off llama.cpp
    ("--max-sequences", "by --exact"): None,
    ("--served-model-name", "the verifier's model"): "",
    **{(f"--upstream-{flag}", "plaintext"): None for flag in ("tls-ca", "tls-cert", "tls-key", "token-file")},
}
UNITS = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def service_parser(service: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser services/SERVICE/__main__.py's parse_args builds, caught before it parses anything (so no
    environment variable or command line changes a default)."""
    module = importlib.import_module(f"services.{service}.__main__")

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", capture)
        try:
            module.parse_args([])
        except _Captured as caught:
            return caught.parser
    raise AssertionError(f"services.{service}: parse_args never called ArgumentParser.parse_args")


@pytest.fixture(scope="module")
def defaults() -> dict[str, dict[str, object]]:
    """service -> {--flag: its argparse default}, with no OTEL_* or EDGESPEC_* variable set."""
    monkeypatch = pytest.MonkeyPatch()
    import os
    for name in list(os.environ):
        if name.startswith(("OTEL_", "EDGESPEC_")):
            monkeypatch.delenv(name)
    try:
        out = {}
        for service in SERVICES:
            parser = service_parser(service, monkeypatch)
            out[service] = {option: parser.get_default(action.dest) for action in parser._actions
                            for option in action.option_strings if option.startswith("--")}
        return out
    finally:
        monkeypatch.undo()


def configuration_rows() -> list[tuple[int, list[str], list[str], str]]:
    """(line number, services, flags, default cell) of every row of README's Configuration table."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("## Configuration")
    rows, seen_header = [], False
    for number, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if seen_header and rows:
                break
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|", 3)]
        if cells[0] == "service" or set(cells[0]) <= {"-"}:
            seen_header = True
            continue
        assert len(cells) == 4, f"README.md:{number}: not a 4-column row: {line}"
        services = [s.strip() for s in cells[0].split(",")]
        services = list(SERVICES) if services == ["all"] else services
        assert set(services) <= set(SERVICES), f"README.md:{number}: unknown service in {cells[0]!r}"
        flags = re.findall(r"`(--[a-z0-9-]+)`", cells[1])
        rows.append((number, services, flags, cells[2]))
    assert len(rows) > 30, "README.md's Configuration table was not found or lost its rows"
    return rows


def split_defaults(cell: str, count: int) -> list[str]:
    """One default per flag: "a, b, c" for three flags, or one default shared by all of them."""
    parts = [p.strip() for p in cell.split(",")] if count > 1 else [cell.strip()]
    if len(parts) == 1:
        return parts * count
    return parts


def matches(flag: str, stated: str, actual: object) -> bool:
    text = stated.replace("`", "").strip()
    if (flag, text) in DESCRIBED:
        return actual == DESCRIBED[flag, text] and type(actual) is type(DESCRIBED[flag, text])
    if text == "off":
        return actual in (None, False, "", 0, "off") and actual is not True
    if text == "on":
        return actual is True or actual == "on"
    number = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s*(KiB|MiB|GiB)?", text)
    if number:
        return (isinstance(actual, (int, float)) and not isinstance(actual, bool)
                and actual == float(number[1]) * UNITS[number[2] or ""])
    return isinstance(actual, str) and actual == text


def test_every_default_in_the_configuration_table_is_the_services_default(defaults):
    wrong, checked = [], 0
    for number, services, flags, cell in configuration_rows():
        if not flags:       # an environment variable row (EDGESPEC_CACHE)
            continue
        stated = split_defaults(cell, len(flags))
        assert len(stated) == len(flags), (f"README.md:{number}: {len(flags)} flags {flags} but defaults "
                                           f"{cell!r}: give one default per flag, or one for all")
        for flag, text in zip(flags, stated):
            per_service = [t.strip() for t in text.split(" / ")]
            if len(per_service) > 1:
                assert len(per_service) == len(services), (f"README.md:{number}: {flag}: {text!r} gives "
                                                           f"{len(per_service)} defaults for {services}")
            else:
                per_service = per_service * len(services)
            for service, value in zip(services, per_service):
                if flag not in defaults[service]:
                    wrong.append(f"README.md:{number}: {service} has no flag {flag}")
                    continue
                checked += 1
                if not matches(flag, value, defaults[service][flag]):
                    wrong.append(f"README.md:{number}: {service} {flag}: README says {value!r}, the code "
                                 f"{defaults[service][flag]!r}")
    assert not wrong, "\n".join(wrong)
    assert checked > 80


def test_the_comparison_is_strict():
    assert matches("--max-batch", "16", 16) and not matches("--max-batch", "5", 16)
    assert matches("--batch-wait-ms", "200", 200.0) and not matches("--batch-wait-ms", "5", 200.0)
    assert matches("--max-message-bytes", "4 MiB", 4 << 20) and not matches("--max-message-bytes", "4", 4 << 20)
    assert matches("--rate-limit", "off", 0.0) and not matches("--rate-limit", "off", 2.0)
    assert not matches("--share-prefixes", "off", True) and not matches("--metrics-port", "0", None)
    assert matches("--log-format", "`text`", "text") and not matches("--log-format", "`json`", "text")
    assert not matches("--window", "auto", 4) and not matches("--threads", "torch default", 2)


def test_every_service_flag_is_documented_in_the_readme(defaults):
    # A flag nobody can find is as good as missing: each appears in README (the table or its text).
    readme = (ROOT / "README.md").read_text()
    missing = sorted({f"{service} {flag}" for service, flags in defaults.items() for flag in flags
                      if flag != "--help" and f"`{flag}" not in readme and f"{flag} " not in readme})
    assert not missing, f"flags not in README.md: {missing}"


def unknown_commands(text: str, code: bool = False) -> list[str]:
    """`edgespec X` and `edgespec GROUP MEMBER` in ``text`` (with ``code``, also at the start of a line: a command
    line in a code block) that `edgespec` does not have. Old, deprecated names count as unknown: the docs name
    the current ones."""
    from edge_client.commands import COMMANDS, Group

    wrong, start = [], r"(?:`|bin/|^\s*)" if code else r"(?:`|bin/)"
    for name, member in re.findall(start + r"edgespec ([a-z][a-z0-9-]*)(?: ([a-z][a-z0-9-]*))?", text, re.M):
        command = COMMANDS.get(name, False)
        if command is False:
            wrong.append(f"edgespec {name}")
        elif isinstance(command, Group) and member and member not in command.tools and member not in ("suite", "role"):
            wrong.append(f"edgespec {name} {member}")
    return wrong


def test_every_edgespec_command_the_docs_name_exists():
    wrong = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        code = False
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                code = not code
                continue
            wrong += [f"{doc.relative_to(ROOT)}:{number}: {name}" for name in unknown_commands(line, code)]
    assert not wrong, "commands the docs name that `edgespec` does not have:\n" + "\n".join(wrong)


def test_a_misspelt_command_in_the_docs_would_be_found():
    assert unknown_commands("run `edgespec bench-capacity` or `edgespec bench capacty`, then `edgespec frob`") == [
        "edgespec bench-capacity", "edgespec bench capacty", "edgespec frob"]
    assert unknown_commands("`edgespec bench capacity --json x` and\n  edgespec serve verifier --port 1", code=True) == []
    assert unknown_commands("edgespec serves users") == []     # prose


def test_the_services_help_names_only_commands_that_exist(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100000")     # no line wrapping (argparse wraps at hyphens)
    wrong = []
    for service in SERVICES:
        text = service_parser(service, monkeypatch).format_help()
        named = unknown_commands(text.replace("edgespec ", "`edgespec "))
        wrong += [f"{service}: {name}" for name in named if name.split()[1] not in ("coordinator", "verifier", "drafter")]
    assert not wrong, wrong


def test_the_docs_say_no_issue_numbers():
    # "issue #4" means something to the people who filed it, nothing to a user reading the docs.
    wrong = []
    for doc in [ROOT / "README.md", ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "deployment.md"]:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if re.search(r"\b[Ii]ssues? #?\d+|\bthe issue\b|\bthe issue's\b", line):
                wrong.append(f"{doc.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not wrong, "\n".join(wrong)
