"""A read-only install with no writable home (a container's non-root user): compiled code cannot cache and must
still run (issue 29, finding 5)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hiercls
from hiercls.decode import decode
from hiercls.taxonomy import Taxonomy

RULES = ("argmax_leaf", "bayes_node", "optimal_hf1")
PROBS = [[1.0, 0.7, 0.3, 0.4, 0.3]]  # nodes r, a, x, y, b
SCRIPT = """
RULES, PROBS = {rules!r}, {probs!r}
import numpy as np, torch
from hiercls.decode import decode
from hiercls.losses.semantic import SemanticSoftmaxLoss
from hiercls.taxonomy import Taxonomy
import hiercls
assert hiercls.__file__.startswith({root!r}), hiercls.__file__
tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
p = np.array(PROBS)
print("decode", [decode(p, tax, rule).astype(int).tolist() for rule in RULES])
loss = SemanticSoftmaxLoss(tax, label_smoothing=0.0)(torch.zeros(1, 4), torch.tensor([2]))
print("loss", round(float(loss), 6))
"""


READ_ONLY_MOUNTS = (
    'for d in "$R" "$H"; do mount --bind "$d" "$d" && mount -o remount,bind,ro "$d" || exit 97; done; exec "$@"'
)


def _read_only(paths: list[Path]) -> list[str]:
    """The command prefix that runs a child with ``paths`` read-only.

    A normal user: the paths' write bits are removed. Root writes through mode bits, so there the child runs
    in a private mount namespace with the paths bind-mounted read-only (skipped where that is not allowed).
    """
    if os.geteuid() != 0:
        for top in paths:
            for d, dirs, files in os.walk(top):
                for name in [*dirs, *files]:
                    (Path(d) / name).chmod((Path(d) / name).stat().st_mode & ~0o222)
            top.chmod(top.stat().st_mode & ~0o222)
        return []
    if shutil.which("unshare") is None:
        pytest.skip("root without unshare: cannot make a read-only directory")
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"root without mount namespaces ({probe.stderr.decode().strip()[:100]})")
    return ["unshare", "--mount", "sh", "-c", READ_ONLY_MOUNTS, "sh"]


def _writable_again(paths: list[Path]) -> None:
    for top in paths:
        for d, dirs, _files in os.walk(top):
            for name in dirs:
                (Path(d) / name).chmod(0o755)
        top.chmod(0o755)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions and mounts")
def test_decode_and_semantic_loss_run_from_a_read_only_install(tmp_path: Path) -> None:
    root, home = tmp_path / "site", tmp_path / "home"
    shutil.copytree(Path(hiercls.__file__).parent, root / "hiercls", ignore=shutil.ignore_patterns("__pycache__"))
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "XDG_", "PYTHONPYCACHE"))}
    env.update(PYTHONPATH=str(root), HOME=str(home), PYTHONDONTWRITEBYTECODE="1", R=str(root), H=str(home))
    script = SCRIPT.format(root=str(root), rules=RULES, probs=PROBS)
    probe = "import pathlib, sys; pathlib.Path(sys.argv[1], 'probe').write_text('x')"
    try:
        prefix = _read_only([root, home])
        for target in (root / "hiercls", home):  # the child really cannot write there
            check = subprocess.run([*prefix, sys.executable, "-c", probe, str(target)], env=env, capture_output=True)
            assert check.returncode != 0 and b"Error" in check.stderr, check
        run = subprocess.run(
            [*prefix, sys.executable, "-c", script], env=env, cwd=str(home), capture_output=True, text=True, timeout=600
        )
    finally:
        _writable_again([root, home])
    assert run.returncode == 0, run.stderr[-3000:]
    # the answers of this (cached, writable) install; by hand: argmax_leaf is y (id 3), bayes_node a (id 1, mass
    # 0.7 > 1/2); the loss of uniform logits is w0 log 2 + w1 log 2 with weights [1, 2] (3 log 2)
    tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    want = [decode(np.array(PROBS), tax, rule).astype(int).tolist() for rule in RULES]
    assert want[:2] == [[3], [1]]
    lines = dict(line.split(" ", 1) for line in run.stdout.strip().splitlines())
    assert lines["decode"] == str(want)
    assert lines["loss"] == f"{3 * math.log(2):.6f}"
