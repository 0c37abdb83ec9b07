"""Test, benchmark and demo helpers that users do not need: not shipped in the
wheel."""
