"""Evaluation: decode node probabilities with decoder specs and score them with one vocabulary of metric names.

It sits above :mod:`hiercls.decode`, :mod:`hiercls.metrics` and :mod:`hiercls.models` and below :mod:`hiercls.train`
and the CLI.

* :class:`Evaluator` (``update`` / ``compute`` / ``reset``, exact under DDP) and :func:`evaluate_probabilities`;
* :func:`format_results`, the one result table;
* :func:`decoder_metric_table`, the decoder x metric table of Plaud et al. (ICML 2025);
* :func:`load_probabilities` / :func:`load_labels`, saved probabilities and labels from files;
* :func:`evaluate_model` (a model on a data loader), :func:`evaluate_run` (a trained run on its recipe's data) and
  :func:`run_probabilities` (its node probabilities and labels there, for :func:`decoder_metric_table`);
* :mod:`hiercls.evaluation.calibration`: temperature scaling and the ECE per level (:func:`format_calibration`).
"""

from hiercls.evaluation.calibration import (
    LevelCalibration,
    calibrate_outputs,
    expected_calibration_error,
    fit_temperature,
    format_calibration,
)
from hiercls.evaluation.evaluator import DEFAULT_DECODERS, Evaluator, evaluate_probabilities, to_plain
from hiercls.evaluation.files import load_labels, load_probabilities
from hiercls.evaluation.model import evaluate_model, evaluate_run, run_probabilities
from hiercls.evaluation.report import decoders_in, format_results, format_table
from hiercls.evaluation.table import TABLE_DECODERS, TABLE_METRICS, DecoderMetricTable, decoder_metric_table

__all__ = [
    "DEFAULT_DECODERS",
    "TABLE_DECODERS",
    "TABLE_METRICS",
    "DecoderMetricTable",
    "Evaluator",
    "LevelCalibration",
    "calibrate_outputs",
    "decoder_metric_table",
    "decoders_in",
    "evaluate_model",
    "evaluate_probabilities",
    "evaluate_run",
    "expected_calibration_error",
    "fit_temperature",
    "format_calibration",
    "format_results",
    "format_table",
    "load_labels",
    "load_probabilities",
    "run_probabilities",
    "to_plain",
]
