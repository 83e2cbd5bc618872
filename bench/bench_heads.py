"""Node probabilities of the chained-softmax heads against a flat softmax over the same logits (21K classes).

``cases(quick)`` registers, for ``bench/run_all.py``: ``head.node_probs(logits)`` of the semantic softmax and the
conditional softmax heads on ``imagenet21k_winter21`` (10,451 nodes) at batch 256 against
``torch.softmax(logits, 1)`` on the same logits, target <= 4x; and, without a target, references for the passes
they are made of: the column gather that puts the semantic head's logits into the chained softmax's padded
``[B, P]`` layout (what its log-softmaxes make), and the transpose of the logits (``ChainedSoftmax.probs`` makes
two, in and out, around row gathers and one softmax per bucket of groups).

Usage: ``python bench/bench_heads.py [--quick]`` (prints the same JSON records as ``run_all``).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import Case


@functools.lru_cache(maxsize=1)
def tree_21k():
    from hiercls.taxonomy import load_taxonomy

    return load_taxonomy("imagenet21k_winter21")


def _node_probs_setup(head_name: str, batch: int):
    def setup():
        from hiercls.heads import create_head

        head = create_head(head_name, tree_21k(), 16)
        gen = torch.Generator().manual_seed(0)
        logits = 3.0 * torch.randn(batch, head.num_outputs, generator=gen)

        @torch.no_grad()
        def candidate():
            return head.node_probs(logits)

        @torch.no_grad()
        def baseline():
            return torch.softmax(logits, 1)

        return candidate, baseline

    return setup


def cases(quick: bool) -> list[Case]:
    out = []
    for head_name, short in (("semantic_softmax", "semantic"), ("conditional_softmax", "conditional")):
        out.append(
            Case(
                f"heads/node_probs_{short}_21k_b256",
                4.0,
                setup=_node_probs_setup(head_name, 256),
                min_time=0.1,
                note=f"{head_name}.node_probs vs torch.softmax over the same [256, C] logits",
            )
        )
    out.append(
        Case(
            "heads/floor_node_order_gather_21k_b256",
            None,
            setup=_node_order_gather_setup(256),
            min_time=0.1,
            note="reference, no target: the column gather that puts the semantic head's logits into the padded "
            "layout of the chained softmax vs torch.softmax over the same [256, C] logits",
        )
    )
    out.append(
        Case(
            "heads/floor_transpose_21k_b256",
            None,
            setup=_transpose_setup(256),
            min_time=0.1,
            note="reference, no target: the transpose of the [256, C] logits into slot-major [C, 256] "
            "(ChainedSoftmax.probs makes two, in and out, around row gathers) vs torch.softmax over them",
        )
    )
    return out


def _transpose_setup(batch: int):
    def setup():
        logits = 3.0 * torch.randn(batch, tree_21k().num_nodes - 1, generator=torch.Generator().manual_seed(0))
        return (lambda: logits.t().contiguous()), (lambda: torch.softmax(logits, 1))

    return setup


def _node_order_gather_setup(batch: int):
    def setup():
        from hiercls.heads import create_head

        chained = create_head("semantic_softmax", tree_21k(), 16).node_softmax
        logits = 3.0 * torch.randn(batch, chained.num_inputs, generator=torch.Generator().manual_seed(0))
        return (lambda: logits.index_select(1, chained.slot_input)), (lambda: torch.softmax(logits, 1))

    return setup


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from run_all import run_case

    print(json.dumps([run_case(case, args.quick, None) for case in cases(args.quick)], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
