"""The values: manifest kinds, serving state, plans, results, reports, errors.

Frozen dataclasses and enums that every layer passes around. Nothing here does I/O or imports
anything beyond the standard library."""
