"""Benchmarks and checks of gh200rt, one command: ``python -m gh200rt.bench <subcommand> ...`` (``gh200rt-bench``).

Contract of a subcommand module: its docstring is its ``--help`` description, ``add_arguments(parser)`` adds its
flags to an ``argparse`` parser, and ``run(args) -> int`` runs it and returns the exit status (it raises
``commands.UsageError`` for a flag value it finds wrong, reported as argparse reports one). A group (``kernel``,
``ab``) is a package whose ``COMMANDS`` maps names to such modules. Registries name modules by dotted path and
import nothing: ``--help`` lists the commands without importing torch or a kernel; only the chosen module is
imported. Figures, and how each is measured, are documented in docs/BENCHMARKS.md with the commands that
produced them.
"""
