"""The ``hiercls`` command line: ``hiercls <command> ...``.

Each command lives in its own module exposing ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``; only the chosen command's module is imported, so ``hiercls --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from hiercls import __version__

COMMANDS: dict[str, str] = {
    "taxonomy": "hiercls.cli.taxonomy_cmd",
    "train": "hiercls.cli.train_cmd",
    "evaluate": "hiercls.cli.evaluate_cmd",
    "predict": "hiercls.cli.predict_cmd",
    "decode": "hiercls.cli.decode_cmd",
}

SUMMARIES: dict[str, str] = {
    "taxonomy": "show, inspect, validate and convert taxonomies",
    "train": "train a hierarchical classifier from a YAML recipe",
    "evaluate": "hierarchical metrics for a saved model or saved probabilities",
    "predict": "predictions of a saved model on new inputs",
    "decode": "decode saved node probabilities with a metric-optimal rule",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``command`` the sub-parser of that command is filled in (importing its module)."""
    parser = argparse.ArgumentParser(prog="hiercls", description="Hierarchical classification toolkit.")
    parser.add_argument("--version", action="version", version=f"hiercls {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, summary in SUMMARIES.items():
        p = sub.add_parser(name, help=summary, description=summary)
        if name == command:
            importlib.import_module(COMMANDS[name]).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hiercls`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
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
