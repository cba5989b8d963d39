"""tape: train and evaluate positional encodings in transformer language models."""

__version__ = "0.1.0"
