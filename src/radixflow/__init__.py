"""radixflow: hybrid prefix caching with state-ready round scheduling."""

__version__ = "0.1.0"
