"""Decoders: from node probabilities ``[B, N]`` to predicted nodes ``[B]`` or node sets ``[B, N]``.

One front door, :func:`decode`, one function per rule, and one spec parser, :func:`parse_decoder`
(``"optimal_hfbeta:beta=2"``). Rules register themselves with :func:`register_decoder`. See ``docs/decoding.md``
for the rules, their optimality, the tie rule (:data:`TIE_RTOL`) and where each runs.
"""

from hiercls.decode.api import RULES, SET_RULES, ProbabilityError, check_probabilities, decode, probability_checks
from hiercls.decode.bayes import COST_KINDS, bayes_node, crm, expected_cost, prediction_expected_cost
from hiercls.decode.checks import PROBABILITY_ATOL, probabilities_named
from hiercls.decode.hfbeta import expected_hfbeta, optimal_hfbeta
from hiercls.decode.inputs import TIE_RTOL
from hiercls.decode.registry import DecoderInfo, register_decoder
from hiercls.decode.rules import (
    argmax_leaf,
    calibrate_info_gain,
    hie,
    info_gain,
    majority,
    max_info,
    plurality,
    threshold,
    top_down,
)
from hiercls.decode.sets import chmcnn, threshold_set
from hiercls.decode.spec import DECODER_ALIASES, DecoderSpec, parse_decoder, rule_options

__all__ = [
    "COST_KINDS",
    "DECODER_ALIASES",
    "PROBABILITY_ATOL",
    "RULES",
    "SET_RULES",
    "TIE_RTOL",
    "DecoderInfo",
    "DecoderSpec",
    "ProbabilityError",
    "argmax_leaf",
    "bayes_node",
    "calibrate_info_gain",
    "check_probabilities",
    "chmcnn",
    "crm",
    "decode",
    "expected_cost",
    "expected_hfbeta",
    "hie",
    "info_gain",
    "majority",
    "max_info",
    "optimal_hfbeta",
    "parse_decoder",
    "plurality",
    "prediction_expected_cost",
    "probabilities_named",
    "probability_checks",
    "register_decoder",
    "rule_options",
    "threshold",
    "threshold_set",
    "top_down",
]
