"""``parse_decoder``: one decoder spec for recipes, the CLI and the Python API."""

from __future__ import annotations

import numpy as np
import pytest

from hiercls.decode import DECODER_ALIASES, RULES, SET_RULES, DecoderSpec, decode, optimal_hfbeta, parse_decoder
from hiercls.taxonomy import Taxonomy

TAX = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
P = np.array([[1.0, 0.6, 0.3, 0.3, 0.4], [1.0, 0.9, 0.8, 0.1, 0.1]])


def test_every_rule_parses_to_itself() -> None:
    for rule in RULES:
        spec = parse_decoder(rule)
        assert (spec.rule, spec.options, spec.label) == (rule, {}, rule)
        assert spec.is_set == (rule in SET_RULES)
        assert RULES[rule] is RULES.get(rule)


def test_aliases_and_spellings_of_one_decoder_share_a_label() -> None:
    spellings = [
        "optimal_hf1",
        "optimal_hfbeta1",
        "optimal_hfbeta:beta=1",
        "optimal_hfbeta:beta=1.0",
        " optimal_hfbeta : beta = 1 ",
    ]
    specs = {parse_decoder(s) for s in spellings} | {parse_decoder("optimal_hfbeta", beta=1)}
    assert specs == {DecoderSpec("optimal_hfbeta", {"beta": 1.0}, "optimal_hf1")}
    assert set(DECODER_ALIASES) == {"optimal_hf1", "optimal_hfbeta1"}
    two = parse_decoder("optimal_hfbeta:beta=2")
    assert two.label == "optimal_hfbeta:beta=2" and two.beta == 2.0 and two.judged_on == "hF2_samples"
    assert parse_decoder("optimal_hfbeta").beta == 1.0 and parse_decoder("crm").beta is None
    assert parse_decoder("crm").judged_on == "hF1_micro"
    # options are sorted in the label; the spec string is accepted back
    spec = parse_decoder("optimal_hfbeta:include_root=true,beta=0.5")
    assert spec.label == "optimal_hfbeta:beta=0.5,include_root=True"
    assert parse_decoder(spec.label) == spec


def test_typed_values() -> None:
    assert parse_decoder("threshold:threshold=0.6").options == {"threshold": 0.6}
    assert parse_decoder("threshold:threshold=1").options == {"threshold": 1.0}
    assert isinstance(parse_decoder("threshold:threshold=1").options["threshold"], float)
    assert parse_decoder("hie:level=2").options == {"level": 2}
    assert parse_decoder("crm:cost=wu_palmer").options == {"cost": "wu_palmer"}
    assert parse_decoder("optimal_hfbeta:include_root=false").options == {"include_root": False}
    with pytest.raises(ValueError, match="include_root must be true or false; got 'maybe'"):
        parse_decoder("optimal_hfbeta:include_root=maybe")
    with pytest.raises(ValueError, match="threshold must be a finite number; got 'high'"):
        parse_decoder("threshold:threshold=high")


def test_typos_get_did_you_mean() -> None:
    with pytest.raises(ValueError, match=r"unknown decoder 'argmax_leef' \(did you mean 'argmax_leaf'\?\)"):
        parse_decoder("argmax_leef")
    with pytest.raises(ValueError, match=r"unknown decoder 'optimal_hf2'.*did you mean .*optimal_hf1"):
        parse_decoder("optimal_hf2")
    with pytest.raises(ValueError, match=r"unknown option 'bta' of rule 'optimal_hfbeta' \(did you mean 'beta'\?\)"):
        parse_decoder("optimal_hfbeta:bta=2")
    with pytest.raises(ValueError, match=r"unknown option 'threshold' of rule 'crm'.*valid options: cost"):
        parse_decoder("crm:threshold=0.5")
    with pytest.raises(ValueError, match="options must be key=value"):
        parse_decoder("threshold:0.5")
    with pytest.raises(ValueError, match="decoder must be a rule name"):
        parse_decoder("")
    with pytest.raises(ValueError, match="unknown option 'leaf_probs'"):
        parse_decoder("argmax_leaf:leaf_probs=true")  # a property of the data, not of the decoder


@pytest.mark.parametrize("bad", ["-1", "-0.5", "0", "inf", "nan", "true", "two"])
def test_beta_is_checked_once(bad: str) -> None:
    with pytest.raises(ValueError, match="beta must be a finite number > 0"):
        parse_decoder(f"optimal_hfbeta:beta={bad}")
    with pytest.raises(ValueError, match="beta must be a finite number > 0"):
        decode(P, TAX, "optimal_hfbeta", beta=-2)


def test_beta_zero_is_refused() -> None:
    """beta = 0 drops recall: the decoder would answer the root for every sample (issue 28)."""
    with pytest.raises(ValueError, match="beta = 0 would score precision alone"):
        decode(P, TAX, "optimal_hfbeta", beta=0)


def test_decode_takes_specs_and_aliases() -> None:
    want = optimal_hfbeta(P, TAX, beta=2.0)
    np.testing.assert_array_equal(decode(P, TAX, "optimal_hfbeta:beta=2"), want)
    np.testing.assert_array_equal(decode(P, TAX, "optimal_hfbeta", beta=2.0), want)
    np.testing.assert_array_equal(decode(P, TAX, parse_decoder("optimal_hfbeta:beta=2")), want)
    np.testing.assert_array_equal(decode(P, TAX, "optimal_hf1"), optimal_hfbeta(P, TAX, beta=1.0))
    np.testing.assert_array_equal(parse_decoder("crm:cost=zhao")(P, TAX), decode(P, TAX, "crm", cost="zhao"))
    leaf = P[:, TAX.leaves]
    np.testing.assert_array_equal(decode(leaf, TAX, "argmax_leaf", leaf_probs=True), decode(P, TAX))


def test_a_repeated_option_is_refused() -> None:
    with pytest.raises(ValueError, match=r"decoder 'optimal_hfbeta:beta=1,beta=2': option 'beta' is given twice"):
        parse_decoder("optimal_hfbeta:beta=1,beta=2")


def test_rules_register_where_they_are_defined() -> None:
    """The side tables are views of the registry: a rule registered by a plug-in appears in them, and goes."""
    from hiercls.decode import DECODER_ALIASES, RULES, SET_RULES
    from hiercls.decode.registry import DECODERS, MULTILABEL_RULES, register_decoder, unregister_decoder

    assert set(SET_RULES) == {"optimal_hfbeta", "threshold_set", "chmcnn"}
    assert set(MULTILABEL_RULES) == {"threshold_set", "chmcnn"}
    assert DECODER_ALIASES["optimal_hf1"] == ("optimal_hfbeta", {"beta": 1.0})
    assert all(DECODERS[r].fn is RULES[r] for r in RULES)

    @register_decoder("first_leaf_set", returns="set", aliases={"first_leaf_set_t": {"threshold": 0.2}})
    def first_leaf_set(probs: object, taxonomy: object, *, threshold: float = 0.5) -> object:
        raise NotImplementedError

    try:
        assert "first_leaf_set" in SET_RULES and parse_decoder("first_leaf_set_t").options == {"threshold": 0.2}
        assert parse_decoder("first_leaf_set").judged_on == "hF1_micro"
        with pytest.raises(ValueError, match="already registered"):
            register_decoder("other", aliases={"first_leaf_set_t": {}})(first_leaf_set)
    finally:
        unregister_decoder("first_leaf_set")
    assert "first_leaf_set" not in SET_RULES and "first_leaf_set_t" not in DECODER_ALIASES
