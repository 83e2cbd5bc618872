"""First use: what a fresh process waits for on its first decoder or loss call, and the CLI's answer time.

Every case here is a ``measure`` case (:class:`_timing.Case`): its ratio is a time in seconds divided by one
second, so ``target=3`` reads "at most 3 s" and ``target=1`` "at most 1 s". Absolute times, unlike the other
benches' ratios, move with the machine's load; each case therefore takes the median over several fresh processes
in the full run.

* ``firstuse/decode_<rule>`` for every rule of :data:`hiercls.decode.RULES`: a fresh Python process with empty
  compile caches (``NUMBA_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` set to a new temporary
  folder) imports ``hiercls.decode``, builds node probabilities ``[16, 40]`` (float32) on a 40-node tree, and
  times the first ``decode(probs, tax, rule)``. Target 3 s.
* ``firstuse/loss_<head>`` for the loss of every registered head but flat (semantic softmax, conditional softmax,
  HXE, soft labels, nested sigmoid, multilabel): the same fresh process builds the head on 16 features and times
  building it plus its first ``head.loss(head(x), y).backward()`` on 8 samples. A flat head's step runs first,
  untimed, so that torch's own first-op costs are not charged to the loss. Target 3 s.

  Both report beside the verdict the child's import time (``import_s``: ``import hiercls...`` and torch/numpy,
  not part of the verdict) and its second call (``second_s``), as references.
* ``firstuse/cli_help``, ``firstuse/cli_<command>_help`` and ``firstuse/cli_argument_error``: the wall time of the
  subprocess ``python -m hiercls [<command>] --help`` and of ``hiercls decode ... --cost nope`` (Python's start
  included). Target 1 s.

``--quick`` runs one process per first-use case and three per CLI case; the full run three and five.

Usage::

    python bench/run_all.py --quick --modules bench_firstuse
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import Case

#: Target seconds of a first decoder or loss call, and of a CLI answer.
FIRST_USE_TARGET_S = 3.0
CLI_TARGET_S = 1.0
#: Options a rule cannot run without.
OPTIONS: dict[str, dict[str, Any]] = {"bayes_node": {"cost": "lca_height"}}

# The child process. It prints one JSON line: import_s, first_s (what the verdict is on), second_s.
_TREE = """
import time
t0 = time.perf_counter()
{imports}
from hiercls.taxonomy import Taxonomy
import_s = time.perf_counter() - t0
edges = [("r", f"a{{i}}") for i in range(3)]
edges += [(f"a{{i}}", f"b{{i}}{{j}}") for i in range(3) for j in range(3)]
edges += [(f"b{{i}}{{j}}", f"c{{i}}{{j}}{{k}}") for i in range(3) for j in range(3) for k in range(3)]
tax = Taxonomy(edges)
"""
_DECODE = (
    _TREE.format(imports="import json, sys\nimport numpy as np\nfrom hiercls.decode import decode")
    + """
rule, options = sys.argv[1], json.loads(sys.argv[2])
rng = np.random.default_rng(0)
leaf = rng.dirichlet(np.full(tax.num_leaves, 0.3), size=16)
probs = np.zeros((16, tax.num_nodes))
for j, n in enumerate(tax.leaves):  # every node's probability is the mass of the leaves under it
    probs[:, tax.path(n)] += leaf[:, j : j + 1]
probs = probs.astype(np.float32)
times = []
for _ in range(2):
    t = time.perf_counter()
    decode(probs, tax, rule, **options)
    times.append(time.perf_counter() - t)
print(json.dumps({"import_s": import_s, "first_s": times[0], "second_s": times[1]}))
"""
)
_LOSS = (
    _TREE.format(imports="import json, sys\nimport torch\nfrom hiercls.heads import create_head")
    + """
name = sys.argv[1]
torch.manual_seed(0)
x = torch.randn(8, 16)
y = torch.as_tensor([tax.leaves[i % tax.num_leaves] for i in range(8)])
flat = create_head("flat", tax, 16)
flat.loss(flat(x), y).backward()  # torch's own first use, not the loss's
times = []
t = time.perf_counter()
head = create_head(name, tax, 16)
for _ in range(2):
    head.loss(head(x), y).backward()
    times.append(time.perf_counter() - t)
    t = time.perf_counter()
print(json.dumps({"import_s": import_s, "first_s": times[0], "second_s": times[1]}))
"""
)


def _env(cache_dir: str | None = None) -> dict[str, str]:
    """The child's environment: this process's hiercls first on the path, one thread, and empty compile caches."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    spec = importlib.util.find_spec("hiercls")
    if spec is not None and spec.origin is not None:
        root = str(Path(spec.origin).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    if cache_dir is not None:
        for key in ("NUMBA_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
            env[key] = cache_dir
    return env


def first_use(script: str, *args: str) -> dict[str, float]:
    """One fresh process with empty compile caches running ``script``: its ``import_s``, ``first_s``, ``second_s``."""
    with tempfile.TemporaryDirectory(prefix="hiercls-firstuse-") as cache:
        done = subprocess.run(
            [sys.executable, "-c", script, *args], env=_env(cache), capture_output=True, text=True, timeout=300
        )
    if done.returncode != 0:
        raise RuntimeError(f"first-use child {args} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cli_seconds(argv: list[str], status: int) -> float:
    """Wall seconds of ``python -m hiercls *argv``, which must exit with ``status``."""
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hiercls", *argv], env=_env(), capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if done.returncode != status:
        raise RuntimeError(f"hiercls {' '.join(argv)} exited {done.returncode}, not {status}:\n{done.stderr[-2000:]}")
    return seconds


def _first_use_measure(extra: dict[str, Any], runs: int, script: str, *args: str) -> Callable[[], float]:
    def measure() -> float:
        res = [first_use(script, *args) for _ in range(runs)]
        for key in ("import_s", "second_s"):
            extra[key] = round(statistics.median(r[key] for r in res), 4)
        extra["first_s"] = [round(r["first_s"], 4) for r in res]
        return statistics.median(r["first_s"] for r in res)

    return measure


def _cli_measure(extra: dict[str, Any], runs: int, argv: list[str], status: int) -> Callable[[], float]:
    def measure() -> float:
        seconds = [cli_seconds(argv, status) for _ in range(runs)]
        extra["seconds_each"] = [round(s, 3) for s in seconds]
        return statistics.median(seconds)

    return measure


def _case(name: str, target: float, note: str, make: Callable[[dict[str, Any]], Callable[[], float]]) -> Case:
    extra: dict[str, Any] = {}
    return Case(name=name, target=target, measure=make(extra), note=note, extra=extra)


def cases(quick: bool) -> list[Case]:
    """Every decoder's and loss's first call in a fresh process, and every command's ``--help``."""
    from hiercls.cli import ARGUMENTS
    from hiercls.decode import RULES
    from hiercls.heads import list_heads

    runs, cli_runs = (1, 3) if quick else (3, 5)
    out = []
    for rule in RULES:
        options = json.dumps(OPTIONS.get(rule, {}))
        note = f"s / 1 s: first decode(probs, tax, {rule!r}) in a fresh process, empty compile caches"
        out.append(
            _case(
                f"firstuse/decode_{rule}",
                FIRST_USE_TARGET_S,
                note,
                lambda extra, rule=rule, options=options: _first_use_measure(extra, runs, _DECODE, rule, options),
            )
        )
    for head in list_heads():
        if head == "flat":
            continue
        note = f"s / 1 s: build + first loss forward/backward of head {head!r}, fresh process, empty compile caches"
        out.append(
            _case(
                f"firstuse/loss_{head}",
                FIRST_USE_TARGET_S,
                note,
                lambda extra, head=head: _first_use_measure(extra, runs, _LOSS, head),
            )
        )
    calls = [("cli_help", ["--help"], 0)]
    calls += [(f"cli_{cmd}_help", [cmd, "--help"], 0) for cmd in ARGUMENTS]
    calls.append(("cli_argument_error", ["decode", "--probs", "p.npy", "--taxonomy", "t", "--cost", "nope"], 2))
    for name, argv, status in calls:
        note = f"s / 1 s: wall time of 'python -m hiercls {' '.join(argv)}' (exit {status})"
        out.append(
            _case(
                f"firstuse/{name}",
                CLI_TARGET_S,
                note,
                lambda extra, argv=argv, status=status: _cli_measure(extra, cli_runs, argv, status),
            )
        )
    return out
