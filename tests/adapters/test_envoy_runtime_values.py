"""How the Envoy adapter writes a mirror share into Envoy's runtime and reads one back, as
Envoy itself parses and applies a ``runtime_fraction``'s runtime value, and which route's
mirror policy is a target's (no Envoy needed: ``tests/adapters/test_envoy.py`` measures the
same against a real one)."""

from __future__ import annotations

import pytest

from reconciler.adapters.envoy import mirror_policies, mirror_share, mirror_value

DEFAULT = 7  # the route's default_value as a share: what Envoy uses for a value it cannot read


def test_a_share_is_written_as_a_fractional_percent_over_ten_thousand() -> None:
    assert mirror_value(2_000) == '{"numerator":2000,"denominator":"TEN_THOUSAND"}'
    assert mirror_value(5) == '{"numerator":5,"denominator":"TEN_THOUSAND"}'
    for share in (0, 1, 50, 2_000, 9_999, 10_000):
        assert mirror_share(mirror_value(share), DEFAULT) == share, share


@pytest.mark.parametrize(
    ("value", "share"),
    [
        # What the adapter writes now, and the same by hand (JSON or YAML, spaces or not).
        ('{"numerator":2000,"denominator":"TEN_THOUSAND"}', 2_000),
        ('{"numerator": 50, "denominator": "TEN_THOUSAND"}', 50),
        ("numerator: 2000\ndenominator: TEN_THOUSAND", 2_000),
        ('{"numerator":1500,"denominator":"MILLION"}', 15),
        ('{"numerator":"2000","denominator":1}', 2_000),  # proto JSON: a string, an enum number
        ('{"numerator":5}', 500),  # denominator HUNDRED when left out
        ('{"numerator":20000,"denominator":"TEN_THOUSAND"}', 10_000),  # at or above: all
        # A plain number (what the old code wrote: 2000 for 20%) is a percent, its
        # fraction dropped; above 100 Envoy mirrors every request.
        ("20", 2_000),
        (" 5 ", 500),
        ("20.7", 2_000),
        ("0", 0),
        ("100", 10_000),
        ("101", 10_000),
        ("2000", 10_000),
        # Unset or what Envoy cannot read as either: the route's default.
        (None, DEFAULT),
        ("", DEFAULT),
        ("true", DEFAULT),
        ("-3", DEFAULT),
        ("{bad", DEFAULT),
        ('{"numerator":1,"denominator":"THOUSAND"}', DEFAULT),
        ('{"numerator":1,"other":2}', DEFAULT),
        # urlencode's default '+' for a space, which Envoy's admin keeps as '+' (measured:
        # the first mirrored every request, the second none).
        ('{"numerator":+2000}', 10_000),
        ('{"numerator":+2000,+"denominator":+"TEN_THOUSAND"}', DEFAULT),
    ],
)
def test_a_runtime_value_is_read_back_as_the_share_envoy_mirrors(
    value: str | None, share: int
) -> None:
    assert mirror_share(value, DEFAULT) == share


def _route(*policies: tuple[str, str]) -> dict[str, object]:
    return {
        "weighted_clusters": {"runtime_key_prefix": "routing.triton", "clusters": []},
        "request_mirror_policies": [
            {
                "cluster": cluster,
                "runtime_fraction": {
                    "default_value": {"numerator": 0, "denominator": "TEN_THOUSAND"},
                    "runtime_key": key,
                },
            }
            for cluster, key in policies
        ],
    }


def test_the_sse_copies_mirror_policy_is_the_comparators_by_its_key() -> None:
    """The HTTP route mirrors to the comparator's HTTP cluster at the comparator's key: the
    comparator's share is found on whichever route comes first, and on an HTTP route
    alone (an Envoy that serves only SSE)."""
    grpc = _route(("stable", "mirror.triton.stable"), ("comparator", "mirror.triton.comparator"))
    sse = _route(("comparator_http", "mirror.triton.comparator"))
    other = _route(("comparator_http", "mirror.triton.comparator_http"))
    targets = ("stable", "canary", "comparator")
    expected = ("mirror.triton.comparator", 0, 10_000)
    for routes in ([grpc, sse], [sse, grpc], [sse]):
        assert mirror_policies(routes, targets, "mirror.triton")["comparator"] == expected
    assert "comparator" not in mirror_policies([other], targets, "mirror.triton")
