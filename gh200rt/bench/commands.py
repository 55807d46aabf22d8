"""From a command line to a subcommand module: registries of names, each module imported only when chosen."""
from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType
from typing import NamedTuple


class Command(NamedTuple):
    module: str    # dotted path of a module with add_arguments and run, or of a group with COMMANDS
    help: str      # one line, listed by --help


class UsageError(Exception):
    """A flag value ``run`` finds wrong: reported with the usage line, exit status 2 (as argparse does)."""


def default_prog() -> str:
    """``python -m gh200rt.bench`` run as a module, else the installed script's name (``gh200rt-bench``)."""
    name = sys.argv[0].rsplit("/", 1)[-1]
    return "python -m gh200rt.bench" if name in ("__main__.py", "-m", "") else name


def resolve(argv: list[str], commands: dict[str, Command], prog: str, description: str
            ) -> tuple[argparse.ArgumentParser, ModuleType, list[str]]:
    """The parser of the subcommand ``argv`` names (through groups), its module, and the arguments left for it.

    ``--help`` of a registry (or an unknown name) exits as argparse does, listing the names without importing any."""
    listing = argparse.ArgumentParser(prog=prog, description=description,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
    names = listing.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in commands.items():
        names.add_parser(name, help=command.help, add_help=False)
    chosen = listing.parse_args(argv[:1]).command
    module = importlib.import_module(commands[chosen].module)
    if hasattr(module, "COMMANDS"):
        return resolve(argv[1:], module.COMMANDS, f"{prog} {chosen}", module.__doc__ or "")
    parser = argparse.ArgumentParser(prog=f"{prog} {chosen}", description=module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(parser)
    return parser, module, argv[1:]


def dispatch(argv: list[str], commands: dict[str, Command], prog: str, description: str) -> int:
    parser, module, rest = resolve(argv, commands, prog, description)
    args = parser.parse_args(rest)
    try:
        return module.run(args) or 0
    except UsageError as err:
        parser.error(str(err))
