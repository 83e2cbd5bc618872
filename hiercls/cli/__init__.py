"""The ``hiercls`` command line: ``hiercls <command> ...``.

Each command has two modules. ``<command>_args`` holds its ``HELP`` line and ``add_arguments(parser)`` and imports
only the standard library and :mod:`hiercls.cli.names`, so that ``--help`` and an argument error answer at once;
``<command>_cmd`` holds ``run(args) -> int`` and the heavy imports (torch, timm, transformers), and is imported by
name (:data:`COMMANDS`) only once the arguments have parsed.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from types import ModuleType

from hiercls import __version__
from hiercls.cli import data_args, decode_args, evaluate_args, predict_args, recipes_args, taxonomy_args, train_args

#: The argument modules of the commands, in the order ``hiercls --help`` lists them.
ARGUMENTS: dict[str, ModuleType] = {
    "taxonomy": taxonomy_args,
    "recipes": recipes_args,
    "train": train_args,
    "evaluate": evaluate_args,
    "predict": predict_args,
    "decode": decode_args,
    "data": data_args,
}
#: The module that runs each command, imported after parsing.
COMMANDS: dict[str, str] = {name: f"hiercls.cli.{name}_cmd" for name in ARGUMENTS}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (imports nothing heavy).

    Example:
        >>> build_parser().parse_args(["taxonomy", "show", "cifar100", "--depth", "2"]).depth
        2
    """
    parser = argparse.ArgumentParser(prog="hiercls", description="Hierarchical classification toolkit.")
    parser.add_argument("--version", action="version", version=f"hiercls {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in ARGUMENTS.items():
        module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hiercls`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), format="%(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        status = int(importlib.import_module(COMMANDS[args.command]).run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows up here, inside the handler, not at interpreter exit
        return status
    except BrokenPipeError:
        return _broken_pipe()
    except (ValueError, KeyError, OSError) as err:
        # A user's mistake (TaxonomyError, ConfigError, ProbabilityError, TextFileError are ValueErrors; a missing,
        # unreadable or unwritable path an OSError) gets one line naming the culprit, not a traceback;
        # -vv shows the traceback.
        if args.verbose >= 2:
            raise
        print(f"hiercls {args.command}: error: {error_line(err)}", file=sys.stderr)
        return 2


def error_line(err: BaseException) -> str:
    """The one-line message of a user error: the exception's text, its lines joined (a KeyError unquoted).

    Example:
        >>> error_line(KeyError("unknown taxonomy 'x'")), error_line(ValueError("a\\n  b"))
        ("unknown taxonomy 'x'", 'a b')
    """
    msg = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    if isinstance(err, OSError) and not msg.startswith("[Errno") and err.filename and err.filename not in msg:
        msg = f"{err.filename}: {msg}"
    return " ".join(part.strip() for part in msg.splitlines() if part.strip()) or type(err).__name__


def _broken_pipe() -> int:
    """The reader of our output went away (``hiercls taxonomy show ... | head``): stop quietly, as Unix tools do.

    stdout is pointed at /dev/null so that the interpreter's final flush does not fail a second time.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
        pass
    return 0
