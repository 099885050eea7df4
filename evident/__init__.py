"""The ``evident`` command line: the composition root that wires settings, connectors and pipeline."""
