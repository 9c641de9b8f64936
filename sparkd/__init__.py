"""sparkd: keeps a multi-node vLLM-on-Ray deployment alive over SSH."""

__version__ = "0.1.0"
