"""Adapters: the only modules that talk to Git, Triton, the filesystem and the state store."""

from __future__ import annotations
