"""The syntax of promql analysis checks, checked with the manifests (no Prometheus)."""

from __future__ import annotations

import pytest

from reconciler.core.spec.desired import load_desired_state
from reconciler.core.spec.promql import promql_syntax_error
from reconciler.model.errors import ValidationError

SERVER = """\
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata: {name: edge-a}
spec: {grpc: "127.0.0.1:8001", metrics: "http://127.0.0.1:8002/metrics"}
"""

DEPLOYMENT = """\
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata: {name: echo}
spec:
  servers: {names: [edge-a]}
  versions: [1]
  config: {backend: python}
  verify:
    analysis:
      checks:
        - name: kpi
          promql: {query}
          min: 1
"""


@pytest.mark.parametrize(
    "query",
    [
        "sum(rate(my_kpi_total[1m]))",
        'sum by (le) (rate(a_bucket{job="x", code=~"2.."}[5m])) / on() group_left sum(b)',
        "histogram_quantile(0.99, sum(rate(a_bucket[5m])) by (le)) > bool 0.25",
        "max_over_time(up[10m:1m] offset 1h)",
        "holt_winters(x[10m], 0.5, 0.5)",  # Prometheus 2
        "double_exponential_smoothing(x[10m], 0.5, 0.5)",  # its Prometheus 3 name
    ],
)
def test_promql_that_parses(query: str) -> None:
    assert promql_syntax_error(query) is None


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("sum(rate(my_kpi_total[1m])", "unclosed left parenthesis"),
        ("rate(my_kpi_total)", "expected type matrix"),
        ("sum(rate(x[1m])) by", ""),
        ("no_such_function(up)", "unknown function"),
        ("", "no expression"),
    ],
)
def test_promql_that_does_not_parse_says_why(query: str, said: str) -> None:
    error = promql_syntax_error(query)
    assert error is not None and said in error


def test_a_manifest_with_invalid_promql_is_refused_at_its_line() -> None:
    files = {
        "servers.yaml": SERVER.encode(),
        "echo.yaml": DEPLOYMENT.replace("{query}", "'sum(rate(x[1m])'").encode(),
    }
    with pytest.raises(ValidationError) as raised:
        load_desired_state(files)
    assert [str(p) for p in raised.value.problems] == [
        "echo.yaml:12: check kpi: promql is not valid PromQL: unclosed left parenthesis"
    ]
    files["echo.yaml"] = DEPLOYMENT.replace("{query}", "'sum(rate(x[1m]))'").encode()
    assert load_desired_state(files).deployments["echo"].analysis is not None
