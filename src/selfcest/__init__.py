"""SELFCEST: a language model that learns to delegate sub-tasks to same-weight clones."""

__version__ = "0.1.0"
