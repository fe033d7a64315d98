"""Data of the default and paper profiles: synthetic arithmetic, multi-hop QA (synthetic and real), math."""
