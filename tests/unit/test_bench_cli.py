"""`python -m gh200rt.bench`: every registered subcommand is a module with add_arguments and run (groups list
their own), --help lists them without importing any of them (nor torch), and a bad name or flag value is a usage
error that names it."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from gh200rt.bench.__main__ import COMMANDS
from gh200rt.bench.commands import UsageError, dispatch, resolve

ROOT = Path(__file__).resolve().parents[2]


def every_command(commands=COMMANDS, path=()):
    for name, command in commands.items():
        module = importlib.import_module(command.module)
        if hasattr(module, "COMMANDS"):
            yield from every_command(module.COMMANDS, (*path, name))
        else:
            yield (*path, name), module


def test_every_subcommand_builds_its_parser_and_can_run():
    found = list(every_command())
    assert len(found) == 25   # 11 subcommands, 12 kernels, 2 experiments
    for names, module in found:
        assert callable(module.run) and module.__doc__, names
        parser, resolved, rest = resolve([*names, "--help"], COMMANDS, "bench", "")
        assert resolved is module and rest == ["--help"], names
        assert parser.prog == "bench " + " ".join(names)


def test_help_lists_the_subcommands_without_importing_them():
    code = ("import sys\nfrom gh200rt.bench.__main__ import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n"
            "    pass\nprint(sorted(m for m in sys.modules if m.startswith('gh200rt.bench.') or m == 'torch'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert all(f"\n    {name}" in proc.stdout for name in COMMANDS), proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "['gh200rt.bench.__main__', 'gh200rt.bench.commands']"


def test_an_unknown_subcommand_is_a_usage_error_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as exit_:
        dispatch(["kernel", "warp-drive"], COMMANDS, "bench", "")
    assert exit_.value.code == 2 and "invalid choice: 'warp-drive'" in capsys.readouterr().err


def test_a_usage_error_raised_by_run_exits_2_with_its_message(capsys, monkeypatch):
    module = importlib.import_module("gh200rt.bench.kernel.sampler")

    def refuse(args):
        raise UsageError("--vocab 1: at least 2")
    monkeypatch.setattr(module, "run", refuse)
    with pytest.raises(SystemExit) as exit_:
        dispatch(["kernel", "sampler", "--vocab", "1"], COMMANDS, "bench", "")
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "bench kernel sampler: error: --vocab 1: at least 2" in err
