"""ringattn: ring attention for long contexts. `ringattn.torch` is the PyTorch op."""

__version__ = "0.1.0"
