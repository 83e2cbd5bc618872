"""``hiercls data``: the work, once the arguments parsed (:mod:`hiercls.cli.data_args`)."""

from __future__ import annotations

import argparse

from hiercls.data.shards import write_shards
from hiercls.taxonomy import load_taxonomy

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    taxonomy = load_taxonomy(args.taxonomy) if args.taxonomy else None
    written = write_shards(
        args.src, args.out, taxonomy, shard_size=args.shard_size, prefix=args.prefix, shuffle_seed=args.shuffle_seed
    )
    print(f"wrote {len(written)} shard(s) to {args.out}: {written[0].name} .. {written[-1].name}")
    return 0
