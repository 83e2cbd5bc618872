"""``hiercls data``: prepare data sets for training.

Examples::

    hiercls data shard images/train shards/train --taxonomy imagenet21k --shard-size 1000
    hiercls data shard my_tree/ shards/ --shard-size 500    # nested folders: the tree is the taxonomy

Train on them with ``data: {dataset: shards, options: {shards: shards/}}`` (a folder with one sub-folder per
split, or ``shards/{split}-{000000..000009}.tar``).
"""

from __future__ import annotations

import argparse

HELP = "prepare data sets: write tar shards from an image folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("Examples::", 1)[1]
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser(
        "shard",
        help="write the images of a folder tree as tar shards (folder names are the labels); never overwrites",
    )
    p.add_argument("src", metavar="SRC_FOLDER", help="image folder: one sub-folder per label (node name or path)")
    p.add_argument("out", metavar="OUT_DIR", help="folder to write <prefix>-000000.tar ... and index.json into")
    p.add_argument(
        "--taxonomy",
        default=None,
        help="a shipped taxonomy name or file the folder names are nodes of (default: the nested folders are the "
        "taxonomy, written as OUT_DIR/taxonomy.json)",
    )
    p.add_argument("--shard-size", type=int, default=1000, metavar="N", help="samples per shard (default 1000)")
    p.add_argument("--prefix", default="shard", help="shard file name prefix (default: shard)")
    order = p.add_mutually_exclusive_group()
    order.add_argument(
        "--shuffle-seed",
        type=int,
        default=0,
        metavar="SEED",
        help="the samples go in a random order drawn from SEED (default 0), so that every shard mixes the labels",
    )
    order.add_argument(
        "--keep-order",
        action="store_const",
        const=None,
        dest="shuffle_seed",
        help="write the samples in the folder's order instead (one or a few labels per shard, which the reader's "
        "shuffle buffer mixes only locally)",
    )
