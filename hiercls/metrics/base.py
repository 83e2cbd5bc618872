"""The base of the stateful metrics (``update`` / ``compute`` / ``reset``): torchmetrics metrics whose states are
sums, so DDP results are exact.

Every state is a float64 torch tensor of sums on the metric's device: counts, weighted numerators and denominators,
per-node ``tp/fp/fn`` vectors. Sums commute, so adding the states of all ranks (one ``all_reduce(SUM)``)
gives the state a single process would have reached on the whole data, whatever the shard sizes; the final
ratios are computed only after the reduction. Integer-valued sums (unweighted counts) are exact in float64
up to 2**53; per-sample averages (``average="samples"``) are sums of floats, equal up to rounding order.

The classes follow torchmetrics' conventions: ``update(preds, target)`` (predictions first; the functions keep
scikit-learn's ``(y_true, y_pred)``) and one scalar tensor from ``compute()``. ``compute()`` (and ``results()``)
reduce across ranks when ``torch.distributed`` is initialised with more than one process (every rank must then call
it, as with any collective); the local state is left untouched, so they can be called repeatedly. ``sync()`` returns
the reduced state explicitly."""

from __future__ import annotations

import functools
import hashlib
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torchmetrics

from hiercls._checks import to_numpy

__all__ = [
    "LOWER_IS_BETTER",
    "NO_DIRECTION",
    "Metric",
    "all_reduce_states",
    "config_digest",
    "flatten_results",
    "output_direction",
    "refuse_old_keywords",
]


def _dist_world(group: Any = None) -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(group)
    return 1


def all_reduce_states(states: Sequence[dict[str, torch.Tensor]], group: Any = None) -> list[dict[str, torch.Tensor]]:
    """Sum state dicts over all ranks (``all_reduce(SUM)``); returns reduced copies.

    Without an initialised process group (or with one process) the copies are the local values.
    """
    out = [{k: v.clone() for k, v in s.items()} for s in states]
    if _dist_world(group) > 1:
        for s in out:
            for v in s.values():
                torch.distributed.all_reduce(v, op=torch.distributed.ReduceOp.SUM, group=group)
    return out


def flatten_results(results: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a ``compute()`` result as one flat ``{name: float}``, ready for a logger.

    Lists become one entry per position, numbered from 1 (``per_level_accuracy/1`` is depth 1, as in
    :func:`~hiercls.evaluation.format_results`); strings (``mistake_severity_distance``) are left out; NaN
    stays NaN. Lightning's ``self.log_dict`` takes the result (log it with ``sync_dist=False``: ``compute()``
    already summed the ranks).

    Example:
        >>> flatten_results({"accuracy": 0.5, "per_level_accuracy": [1.0, 0.25], "mistake_severity_distance": "x"})
        {'accuracy': 0.5, 'per_level_accuracy/1': 1.0, 'per_level_accuracy/2': 0.25}
    """
    out: dict[str, float] = {}
    for key, value in results.items():
        if isinstance(value, str):
            continue
        if isinstance(value, (list, tuple, np.ndarray)):
            for i, v in enumerate(value, start=1):
                out[f"{prefix}{key}/{i}"] = float(v)
        else:
            out[f"{prefix}{key}"] = float(value)
    return out


# Result names (before any "/<position>") that are lower-better, and those that are counts, not scores.
LOWER_IS_BETTER = frozenset(
    {"hamming_loss", "wu_palmer_loss", "zhao_loss", "mistake_severity", "error_rate", "mean_distance", "ece_per_level"}
)
NO_DIRECTION = frozenset({"per_level_support", "pairs_per_level"})


def output_direction(name: str) -> bool | None:
    """``higher_is_better`` of a result name: ``False`` for losses, ``None`` for counts, else ``True``.

    Example:
        >>> output_direction("hF1_micro"), output_direction("hdist@5"), output_direction("per_level_support/2")
        (True, False, None)
    """
    base = name.split("/", 1)[0]
    if base in NO_DIRECTION:
        return None
    return not (base in LOWER_IS_BETTER or base.startswith("hdist@"))


def refuse_old_keywords(metric: Metric, kwargs: Mapping[str, Any]) -> None:
    """Refuse the keywords of the old ``update(y_true, y_pred)`` with the torchmetrics order to use instead."""
    old = [k for k in metric.old_keywords if k in kwargs]
    if old:
        name = type(metric).__name__
        raise TypeError(
            f"{name}.update() got {', '.join(k + '=' for k in old)}: the stateful metrics take torchmetrics' "
            f"order and names, {name}.update(preds, target), predictions first ((y_true, y_pred) was the old "
            "order; the functions keep scikit-learn's (y_true, y_pred))"
        )


class Metric(torchmetrics.Metric):
    """Base class: a :class:`torchmetrics.Metric` whose every state is a float64 sum (``dist_reduce_fx="sum"``).

    It follows torchmetrics' conventions: ``update(preds, target, ...)`` (predictions first, as every
    torchmetrics metric; hiercls's functions keep scikit-learn's ``(y_true, y_pred)``), and ``compute()`` returns
    one scalar tensor (float64, on the metric's device): the result named by ``output`` (each class has a default,
    e.g. ``"fbeta"``; :meth:`output_names` lists the others). :meth:`results` returns every result at once as
    plain Python numbers and lists, :meth:`collection` one metric per result in a ``MetricCollection`` (whose
    members share one state through torchmetrics' compute groups). ``higher_is_better`` follows ``output``
    (losses, distances and mistake severities are lower-better; supports have no direction) and ``plot()`` is
    torchmetrics'.

    It is an ``nn.Module``: ``.to(device)`` moves it with the module that holds it, ``MetricCollection`` takes
    it, and ``state_dict``/``load_state_dict``/``merge_state``/``sync``/``unsync`` are torchmetrics's. The states
    live on the metric's device; the counts of a batch are computed on the host (from the host copy of the
    labels, see :func:`~hiercls.metrics._validation.to_labels`) and added with one host-to-device copy per
    update. Under ``torch.distributed`` torchmetrics sums the states over the ranks, so every rank gets the
    single-process result. ``compute()`` and ``results()`` raise (on every rank) when no rank has called
    ``update`` since the last reset.

    Subclasses declare states with :meth:`add_sum_state` in ``__init__``, end it with :meth:`set_config`,
    add to the states in ``update`` with :meth:`accumulate`, and turn a state dict into results in ``_compute``.
    Each call of a subclass's ``update`` adds one to the ``updates`` state.
    """

    is_differentiable = False
    full_state_update = False
    #: the result ``compute()`` returns unless ``output=`` names another (``None``: the first result)
    default_output: str | None = None
    #: keywords of the old ``update(y_true, y_pred)``, refused with a message giving the new order
    old_keywords: tuple[str, ...] = ("y_true", "y_pred")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        update = cls.__dict__.get("update")
        if update is not None:

            @functools.wraps(update)
            def counted(self: Metric, *args: Any, **kw: Any) -> None:
                refuse_old_keywords(self, kw)
                update(self, *args, **kw)
                self.updates.add_(1.0)  # summed over ranks: "never updated" is told apart from "updated with empty"

            cls.update = counted  # type: ignore[method-assign]

    def __init__(self, *, output: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("compute_with_cache", False)  # a cached result would outlive load_state_dict
        super().__init__(**kwargs)
        self.state_shapes: dict[str, tuple[int, ...]] = {}
        self.add_sum_state("updates")
        self.config_state: str | None = None
        self.sink: tuple[Metric, str] = (self, "")  # where accumulate adds (HierarchicalMetrics holds its parts')
        self.requested_output = output
        self.resolved_output: str | None = None
        self.register_load_state_dict_post_hook(_check_loaded_states)

    def to(self, *args: Any, **kwargs: Any) -> Metric:
        """``nn.Module.to``; a device torch cannot use here (``"cuda"`` without CUDA, ``"cuda:3"`` with one GPU) is
        refused naming the metric and the device, before torch's driver error."""
        device = kwargs.get("device", args[0] if args else None)
        if isinstance(device, (str, int, torch.device)):
            _check_device(type(self).__name__, device)
        return super().to(*args, **kwargs)

    def cuda(self, device: int | str | torch.device | None = None) -> Metric:
        """``nn.Module.cuda``, refused as :meth:`to` refuses when CUDA is not available."""
        _check_device(
            type(self).__name__, torch.device("cuda", device) if isinstance(device, int) else device or "cuda"
        )
        return super().cuda(device)

    def add_sum_state(self, name: str, shape: int | tuple[int, ...] = ()) -> None:
        """Declare a float64 sum state (zeros of ``shape``), saved in ``state_dict``."""
        self.state_shapes[name] = (shape,) if isinstance(shape, int) else tuple(shape)
        self.add_state(name, torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum", persistent=True)

    def set_config(self, **config: Any) -> None:
        """Record the settings that change what ``update`` adds or what ``compute`` returns (once, in ``__init__``).

        ``MetricCollection`` shares one state among metrics whose states are equal after the first batch;
        two metrics of the same class but another configuration (say, two distances of
        :class:`MistakeSeverity` on a batch without mistakes) would then be merged wrongly. A zero state
        whose name carries a digest of the configuration keeps them apart, and :meth:`merge` refuses
        metrics of another configuration.
        """
        tax = getattr(self, "taxonomy", None)
        # The family, not the class: HierarchicalPrecision and HierarchicalFBeta of one configuration share states.
        text = repr((self.family().__name__, None if tax is None else tax.fingerprint, sorted(config.items())))
        self.config_state = "config_" + hashlib.sha1(text.encode()).hexdigest()[:12]
        self.add_state(self.config_state, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum", persistent=False)
        if self.requested_output is not None:
            _ = self.output  # a wrong output= fails here, not at the end of an epoch

    @classmethod
    def family(cls) -> type[Metric]:
        """The class that declares the states (its subclasses only pick another default ``output``)."""
        return next(c for c in cls.__mro__ if "__init__" in c.__dict__)

    @property
    def output(self) -> str:
        """The name of the result ``compute()`` returns (a key of ``flatten_results(results())``)."""
        if self.resolved_output is None:
            names = self.output_names()
            want = self.requested_output or self.default_output or names[0]
            if want not in names:
                raise ValueError(f"output: {type(self).__name__} computes {names}; got {want!r}")
            self.resolved_output = want
        return self.resolved_output

    def output_names(self) -> list[str]:
        """The names ``output=`` takes: the keys of ``flatten_results(results())`` (lists numbered from 1)."""
        zeros = {k: np.zeros(tuple(v.shape)) for k, v in self.states().items()}
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")  # 0/0 of the empty states: only the names are wanted
            return list(flatten_results(self._compute(zeros)))

    @property
    def higher_is_better(self) -> bool | None:  # type: ignore[override]
        """``False`` for losses, distances, error rates and ECE, ``None`` for supports, else ``True``."""
        return output_direction(self.output)

    @property
    def plot_lower_bound(self) -> float | None:  # type: ignore[override]
        return 0.0 if self.higher_is_better is not None else None

    @property
    def plot_upper_bound(self) -> float | None:  # type: ignore[override]
        return 1.0 if self.higher_is_better else None

    def state_names(self) -> list[str]:
        """The names of the sum states (``updates`` included, the configuration marker left out)."""
        return [k for k in self.metric_state if k != self.config_state]

    def accumulate(self, **values: Any) -> None:
        """Add ``values`` (NumPy arrays or Python numbers of the states' shapes) to the states of the same names.

        The host values travel to the states' device as one float64 vector (one copy, whatever the number of
        states). The states are added to in place: torchmetrics copies them wherever it keeps a snapshot
        (``state_dict``, ``forward``, ``sync``), and ``reset`` gives fresh tensors.
        """
        owner, prefix = self.sink
        states = [getattr(owner, prefix + name) for name in values]
        flat = [np.asarray(to_numpy(v), dtype=np.float64).ravel() for v in values.values()]
        for name, cur, a in zip(values, states, flat, strict=True):
            if a.size != cur.numel():
                raise ValueError(f"state {name!r} has {cur.numel()} entries; got {a.size} to add")
        if not states:
            return
        moved = torch.from_numpy(np.concatenate(flat)).to(states[0].device)
        for cur, part in zip(states, torch.split(moved, [a.size for a in flat]), strict=True):
            cur.add_(part.view(cur.shape))

    def states(self) -> dict[str, torch.Tensor]:
        """The sum states by name (live tensors; :meth:`state_dict` gives copies)."""
        return {k: getattr(self, k) for k in self.state_names()}

    def update(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def compute(self) -> torch.Tensor:
        """The result named by ``output`` as a 0-d float64 tensor on the metric's device (states summed over all
        ranks with ``sync_on_compute``, the default)."""
        value = flatten_results(self.checked_results())[self.output]
        return torch.tensor(value, dtype=torch.float64, device=self.device)

    def results(self) -> dict[str, Any]:
        """Every result as plain Python numbers and lists (states summed over all ranks with ``sync_on_compute``).

        ``flatten_results(results())`` holds the values that :meth:`collection`'s ``compute()`` returns as
        tensors.
        """
        with self.sync_context(should_sync=self.sync_on_compute):
            return self.checked_results()

    def plot(self, val: Any = None, ax: Any = None) -> Any:
        """torchmetrics' plot of ``compute()`` (or of ``val``: one value or a list of ``forward`` values)."""
        return self._plot(val, ax)

    @classmethod
    def collection(
        cls, *args: Any, outputs: Iterable[str] | None = None, prefix: str | None = None, **kwargs: Any
    ) -> torchmetrics.MetricCollection:
        """A ``MetricCollection`` of one metric per result (``outputs``, default all :meth:`output_names`).

        The members share one configuration, so torchmetrics merges them into one compute group after the first
        ``update``: one update per batch for the whole collection. ``self.log_dict(collection)`` logs them all in
        Lightning.

        Example:
            >>> from hiercls.metrics import HierarchicalFBeta
            >>> from hiercls.taxonomy import Taxonomy
            >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
            >>> coll = HierarchicalFBeta.collection(tax, prefix="val/")
            >>> coll.update(["a"], ["x"])  # preds, target: the parent a predicted for its leaf x
            >>> {k: v.item() for k, v in coll.compute().items()}
            {'val/fbeta': 0.6666666666666666, 'val/precision': 1.0, 'val/recall': 0.5}
        """
        names = list(outputs) if outputs is not None else cls(*args, **kwargs).output_names()
        members = {name: cls(*args, output=name, **kwargs) for name in names}
        return torchmetrics.MetricCollection(members, prefix=prefix, compute_groups=True)

    def checked_results(self) -> dict[str, Any]:
        """:meth:`results` of the states as they are (no reduction); refuses a metric never updated."""
        if float(self.updates) == 0:  # after the reduction: the same answer on every rank
            if self.sync_on_compute and _dist_world(self.process_group) > 1:
                self.unsync()  # torchmetrics restores the local states only when compute returns
            raise RuntimeError(
                f"{type(self).__name__}.compute() was called before any update() since it was built or reset: "
                f"there is nothing to score; call {type(self).__name__}.update(preds, target) with a batch first"
            )
        return self._compute({k: v.detach().cpu().numpy() for k, v in self.states().items()})

    def _compute(self, state: dict[str, np.ndarray]) -> Any:
        raise NotImplementedError

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """torchmetrics's, plus: with ``strict``, a missing state or a key that is no state raises ``ValueError``
        naming it (inside a module's ``load_state_dict`` torchmetrics skips missing states; shapes are checked)."""
        if strict:
            extra = sorted(set(state_dict) - set(self.state_names()))
            missing = [k for k in self.state_dict() if k not in state_dict]
            if extra or missing:
                raise ValueError(
                    f"state_dict does not match {type(self).__name__}: missing {missing}, unexpected {extra} "
                    f"(expected the states {self.state_names()})"
                )
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def merge_state(self, incoming_state: dict[str, Any] | torchmetrics.Metric) -> None:
        """Add another metric's states (same class, taxonomy and configuration) or a dict of states."""
        if isinstance(incoming_state, torchmetrics.Metric):
            other = incoming_state
            if other.family() is not self.family():
                raise TypeError(f"cannot merge {type(other).__name__} into {type(self).__name__}")
            mine, theirs = getattr(self, "taxonomy", None), getattr(other, "taxonomy", None)
            if mine is not None and theirs is not None and mine != theirs:
                raise ValueError(f"cannot merge metrics of different taxonomies ({mine!r} vs {theirs!r})")
            if other.config_state != self.config_state:
                raise ValueError(f"cannot merge {type(self).__name__} metrics of different configurations")
            incoming_state = other.states()
        incoming = {}
        for k, want in self.states().items():
            if k not in incoming_state:
                raise ValueError(f"cannot merge: state {k!r} is missing")
            v = torch.as_tensor(incoming_state[k])
            if tuple(v.shape) != tuple(want.shape):
                raise ValueError(f"cannot merge: state {k!r} has shape {tuple(v.shape)}, expected {tuple(want.shape)}")
            incoming[k] = v.to(want.device, torch.float64)
        if self.config_state is not None:
            incoming[self.config_state] = torch.zeros((), dtype=torch.float64, device=self.updates.device)
        for k, v in incoming.items():  # every state is a sum: what Metric.merge_state (torchmetrics >= 1.6) does
            setattr(self, k, getattr(self, k) + v)

    def merge(self, other: Metric) -> Metric:
        """:meth:`merge_state` with another metric (e.g. from another worker); returns ``self``."""
        self.merge_state(other)
        return self


def _check_device(owner: str, device: str | int | torch.device) -> None:
    """Refuse a device whose backend torch has but cannot use here (no driver, no such index)."""
    dev = torch.device(device)
    backend = getattr(torch, dev.type, None)  # torch.cuda, torch.mps, torch.xpu, ...: each has is_available()
    if dev.type == "cpu" or not callable(getattr(backend, "is_available", None)):
        return  # cpu, meta, and backends torch does not name here: torch's own message applies
    name = "CUDA" if dev.type == "cuda" else dev.type.upper()
    if not backend.is_available():
        raise RuntimeError(
            f"{owner}: cannot move to device {str(dev)!r}: {name} is not available on this machine "
            f"(torch {torch.__version__}); keep the metric on the CPU (its default) or on a device torch can use"
        )
    count = backend.device_count() if callable(getattr(backend, "device_count", None)) else None
    if dev.index is not None and count is not None and dev.index >= count:
        raise RuntimeError(
            f"{owner}: cannot move to device {str(dev)!r}: this machine has {count} {name} device(s), "
            f"numbered from 0; got index {dev.index}"
        )


def _check_loaded_states(module: Metric, incompatible_keys: Any) -> None:
    """``load_state_dict`` post-hook (nested loads too): every state of its shape, on the metric's device, float64."""
    for k, shape in module.state_shapes.items():
        v = getattr(module, k)
        if tuple(v.shape) != shape:
            raise ValueError(
                f"state_dict[{k!r}] has shape {tuple(v.shape)}; {type(module).__name__} expects {shape} "
                "(another taxonomy or configuration?)"
            )
        setattr(module, k, v.detach().to(dtype=torch.float64, device=module.device).clone())


def config_digest(x: Any) -> str | None:
    """A short digest of an array-like setting (``None`` stays ``None``) for :meth:`Metric.set_config`."""
    if x is None:
        return None
    if isinstance(x, np.ndarray) or type(x).__module__.startswith("torch"):
        a = np.ascontiguousarray(to_numpy(x))
        body = a.tobytes() if a.dtype != object else repr(a.tolist()).encode()
        payload = repr((a.dtype.str, a.shape)).encode() + body
    else:
        payload = repr(x).encode()
    return hashlib.sha1(payload).hexdigest()[:12]
