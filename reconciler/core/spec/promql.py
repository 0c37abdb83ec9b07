"""The syntax of a ``promql`` analysis check, checked where manifests are read (``validate``,
and every pass before anything is applied), with no Prometheus: by promql-parser, the Python
binding of the Rust PromQL parser that GreptimeDB uses.

Syntax only: whether the metrics exist, or the query returns one number, only the
Prometheus the reconciler reads at run time can tell (a query that returns nothing is a
``no-data`` evaluation then, never a pass). Functions are Prometheus 3's, and
``holt_winters``, Prometheus 2's name for ``double_exponential_smoothing``, so a query
written for either parses.
"""

from __future__ import annotations

import promql_parser

_VALUE = promql_parser.ValueType
# Process-wide in the parser: registered once, when this module is first imported.
promql_parser.register_extra_functions(
    [
        promql_parser.Function(
            "holt_winters", [_VALUE.Matrix, _VALUE.Scalar, _VALUE.Scalar], _VALUE.Vector
        )
    ]
)


def promql_syntax_error(query: str) -> str | None:
    """Why ``query`` is not PromQL (the parser's own words), or None when it parses."""
    try:
        promql_parser.parse(query)
    except ValueError as exc:
        return str(exc) or "invalid PromQL"
    return None
