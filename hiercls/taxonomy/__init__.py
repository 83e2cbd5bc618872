"""Taxonomies: the validated hierarchy every head, decoder and metric is built on."""

from hiercls.taxonomy.core import DistanceKind, Taxonomy, TaxonomyError, TreeStrategy

__all__ = ["DistanceKind", "Taxonomy", "TaxonomyError", "TreeStrategy"]
