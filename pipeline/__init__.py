"""evident's retrieval-augmented QA engine: parsing, evidence, indexing, retrieval, answers, attribution.

This package never imports ``bot`` or ``connectors``: they depend on it, not the other way round.
"""
