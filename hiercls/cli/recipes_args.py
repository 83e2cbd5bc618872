"""``hiercls recipes``: the training recipes shipped with hiercls (also in a wheel install).

Examples::

    hiercls recipes list
    hiercls recipes show quickstart
    hiercls recipes copy quickstart               # writes ./quickstart.yaml (never over an existing file)
    hiercls recipes copy quickstart my_run.yaml
    hiercls train quickstart                      # a shipped recipe by name, or your copy: hiercls train my_run.yaml
"""

from __future__ import annotations

import argparse

HELP = "list, show and copy the shipped training recipes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("Examples::", 1)[1]
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("list", help="the shipped recipes: name, description, file")
    p = sub.add_parser("show", help="print a recipe's YAML")
    p.add_argument("name", help="a shipped recipe (see 'list'), with or without .yaml")
    p = sub.add_parser("copy", help="copy a recipe to edit it (refuses to overwrite a file)")
    p.add_argument("name", help="a shipped recipe (see 'list'), with or without .yaml")
    p.add_argument("dest", nargs="?", default=".", help="target file, or a folder to write NAME.yaml into (default: .)")
