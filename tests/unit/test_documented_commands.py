"""Every command line the docs quote still runs as written: each ``python -m gh200rt.bench ...`` in README.md and
docs/**/*.md (docs/gpu-runs/ aside: it records past runs verbatim) is parsed by its subcommand's own parser, in
this process, and each ``python scripts/X.py`` (and any other mention of scripts/X.py) names a script that exists.

A command ends where its inline code span closes (lines may break inside it), else at the end of its line (a
trailing backslash continues it), at ``;``, ``&&``, `` # `` or a table's `` | ``. ``NAME=value`` prefixes are the environment, not arguments.
Placeholders (``<tree>``, ``REV``, ``DIR``: anything in angle brackets or in capitals) and ``...`` stand for a
value that parses or for arguments left out; ``[--flag]`` is an optional flag, written; ``a|b`` alternatives are
checked by their first.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from gh200rt.bench.__main__ import COMMANDS
from gh200rt.bench.commands import resolve

ROOT = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"\bpython3?\s+(-m\s+gh200rt\.bench(?![\w.])|(?:[^\s`]*/)?scripts/[\w.]+\.py\b)")
SCRIPT_MENTION = re.compile(r"\bscripts/(\w+\.py)\b")
END = re.compile(r"`|;|&&|\s#\s|\s\|\s")
PLACEHOLDER = re.compile(r"<[^<>]*>")
METAVAR = re.compile(r"[A-Z][A-Z_]*")
VALUES = ("1", "x", None)    # what a placeholder is tried as: a number, a word, nothing


@dataclass(frozen=True)
class Quoted:
    where: str                # file:line
    head: str                 # "-m gh200rt.bench" or the script's path as written
    text: str                 # the arguments as written


def documents(root: Path = ROOT) -> list[Path]:
    docs = root / "docs"
    return [root / "README.md"] + sorted(p for p in docs.rglob("*.md") if (docs / "gpu-runs") not in p.parents)


def quoted_commands(path: Path, root: Path = ROOT) -> list[Quoted]:
    """The commands ``path`` quotes, each with the rest of its inline code span, or of its line and continuations."""
    # fence lines out (their backticks open no inline span); a blank line ends any span
    text = "\n".join("" if line.lstrip().startswith("```") else line
                     for line in path.read_text(encoding="utf-8").splitlines())
    found = []
    for match in COMMAND.finditer(text):
        paragraph = text.rfind("\n\n", 0, match.start()) + 1
        in_span = text.count("`", paragraph, match.start()) % 2 == 1
        rest = text[match.end():text.find("\n\n", match.end()) % (len(text) + 1)]
        if not in_span:
            lines = rest.split("\n")
            rest = lines[0]
            for line in lines[1:]:
                if not rest.rstrip().endswith("\\"):
                    break
                rest = rest.rstrip().removesuffix("\\") + " " + line.strip()
        end = END.search(rest)
        rest = " ".join((rest if end is None else rest[:end.start()]).split())
        line = text.count("\n", 0, match.start()) + 1
        found.append(Quoted(f"{path.relative_to(root)}:{line}", " ".join(match.group(1).split()), " " + rest))
    return found


def arguments(text: str) -> list[str | None]:
    """The arguments of a quoted command; None where a placeholder stands for a value or for arguments left out."""
    words = shlex.split(PLACEHOLDER.sub(" PLACEHOLDER ", text.replace("\\|", "|")))
    out: list[str | None] = []
    for word in words:
        word = word.strip("[]")
        if word == "":
            continue
        word = word.split("|")[0] if "|" in word else word
        out.append(None if METAVAR.fullmatch(word) or word in ("...", "…") else word)
    return out


def parse_problem(argv: list[str | None]) -> str | None:
    """None when some choice of placeholder values parses with the subcommand's parser, else argparse's message (of
    the first choice). The entry point named alone (``python -m gh200rt.bench <subcommand>``) is prose, not a
    command."""
    holes = [i for i, a in enumerate(argv) if a is None]
    messages = []
    for values in itertools.product(VALUES, repeat=len(holes)):
        filled = list(argv)
        for i, value in zip(holes, values):
            filled[i] = value
        filled = [a for a in filled if a is not None]
        if not filled:
            return None
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                parser, _, rest = resolve(filled, COMMANDS, "python -m gh200rt.bench", "")
                parser.parse_args(rest)
            return None
        except SystemExit as exit_:
            if exit_.code == 0:        # --help
                return None
            messages.append(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exit_.code}")
    return messages[0]


def problems(root: Path = ROOT) -> list[str]:
    found = []
    for path in documents(root):
        for quoted in quoted_commands(path, root):
            if quoted.head.startswith("-m"):
                try:
                    argv = arguments(quoted.text)
                except ValueError as err:      # shlex: an unclosed quote
                    found.append(f"{quoted.where}: cannot split {quoted.text.strip()!r}: {err}")
                    continue
                if (problem := parse_problem(argv)) is not None:
                    found.append(f"{quoted.where}: python -m gh200rt.bench{quoted.text.rstrip()}: {problem}")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            for script in SCRIPT_MENTION.findall(line):
                if not (root / "scripts" / script).is_file():
                    found.append(f"{path.relative_to(root)}:{number + 1}: scripts/{script} does not exist (the "
                                 f"benchmarks are subcommands of python -m gh200rt.bench)")
    return found


def test_every_documented_command_parses():
    assert not problems(), "\n".join(["commands quoted in the docs that do not parse:", *problems()])


def test_it_finds_a_wrong_command_and_a_moved_script(tmp_path):
    (tmp_path / "docs" / "gpu-runs").mkdir(parents=True)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "validate_gpu.py").write_text("")
    (tmp_path / "README.md").write_text(
        "Run `python -m gh200rt.bench kernel sampler --batches 1,8 --warp 9` and\n"
        "`OMP_NUM_THREADS=1 python -m gh200rt.bench kernel sampler --reps <n> [--device cpu]`; then\n"
        "    python -m gh200rt.bench kernel sampler --vocab 49152 \\\n"
        "        --reps two\n"
        "| row | `python -m gh200rt.bench kernel quant-load --shape REV --workers 2` | 1.0 |\n"
        "`python scripts/validate_gpu.py --dry-run` and `python scripts/bench_peers.py --rows single`\n"
        "\n```\npython -m gh200rt.bench kernel sampler --batches 8   # fenced\n```\nSee (`python -m\n"
        "gh200rt.bench kernel sampler --vocab\nlarge`).\n"
        "Fine: `python -m gh200rt.bench` alone, `python -m gh200rt.bench kernel sampler --device ... --reps N`,\n"
        "`python -m gh200rt.bench.peer_worker ENGINE SPEC OUT` (a module of its own).\n")
    (tmp_path / "docs" / "gpu-runs" / "old.md").write_text("python scripts/bench_decode.py --quick\n")
    found = problems(tmp_path)
    assert len(found) == 5, found
    assert found[0].startswith("README.md:1: python -m gh200rt.bench kernel sampler --batches 1,8 --warp 9: ")
    assert "unrecognized arguments: --warp 9" in found[0]
    assert found[1].startswith("README.md:3:") and "argument --reps: invalid int value: 'two'" in found[1]
    assert found[2].startswith("README.md:5:") and "--shape: invalid choice" in found[2]
    assert found[3].startswith("README.md:11:") and "--vocab: invalid int value: 'large'" in found[3]
    assert found[4].startswith("README.md:6: scripts/bench_peers.py does not exist")
