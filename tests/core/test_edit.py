"""spec.edit: restoring a ModelDeployment's versions and config in a manifest file, keeping
everything a person wrote that the restore does not have to change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from reconciler.core.spec.desired import load_desired_state
from reconciler.core.spec.edit import restore_deployment
from reconciler.model.spec import DesiredState

SERVERS = """\
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata:
  name: local
  labels:
    pool: edge
spec:
  grpc: 127.0.0.1:8001
  modelRepository: /models
---
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata:
  name: gpu-a
spec:
  grpc: gpu-a:8001
  modelRepository: /models
---
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata:
  name: gpu-b
spec:
  grpc: gpu-b:8001
  modelRepository: /models
"""


def load(text: str) -> DesiredState:
    return load_desired_state({"servers.yaml": SERVERS.encode(), "models.yaml": text.encode()})


def fingerprint(text: str, name: str) -> str:
    """The fingerprint the failed rollout recorded: that of the spec as the file has it now."""
    return load(text).deployments[name].fingerprint


def restore(
    text: str,
    name: str,
    versions: tuple[int, ...],
    config: Mapping[str, Any] | None = None,
) -> str | None:
    return restore_deployment(text, name, fingerprint(text, name), versions, config)


# -- whole files -----------------------------------------------------------------------------

# The example manifest after a commit that moved it from version 1 to version 2.
ECHO = """\
# Which versions of the echo model the edge pool serves.
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
  name: echo
spec:
  model: echo              # the model's folder in Triton's model repository
  servers:
    matchLabels:
      pool: edge
  # Exactly these versions serve; any other loaded version is unloaded once these are verified.
  versions: [2]  # bumped by CI
  # Merged over the base config (config.pbtxt); version_policy is set by the reconciler.
  config:
    instance_group: [{kind: KIND_CPU, count: 1}]
  verify:
    timeout: 60s
    smoke:
      # echo multiplies its input by its version number: version 1 answers its input.
      - name: scales-by-version
        inputs:
          INPUT0: {datatype: FP32, shape: [1, 4], data: [1, 2, 3, 4]}
        expect:
          OUTPUT0: {data: [1, 2, 3, 4], tolerance: 0.0001}
    # After the swap the old versions stay loaded while the new ones are watched; a failed
    # check puts the old versions back at once.
    analysis:
      interval: 1s
      duration: 5s
      noTraffic: pass      # a first deployment may see no requests yet
      checks:
        - name: success-rate
          successRate: {min: 0.99}
        - name: business-kpi
          promql: 'sum(rate(echo_requests_total{job="triton", instance=~"edge-.*"}[1m])) by (instance) > bool 0'
          min: 1
"""  # noqa: E501 (a long line, to show that it is not wrapped)


def test_the_example_manifest_changes_only_in_its_versions() -> None:
    restored = restore(ECHO, "echo", (1,), {"instance_group": [{"kind": "KIND_CPU", "count": 1}]})

    assert restored == ECHO.replace("versions: [2]  # bumped", "versions: [1]  # bumped")


# Four-space indentation, block sequences without a dash offset, quoted scalars.
RESNET = """\
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
    name: resnet
spec:
    model: "resnet50"   # quoted on purpose
    servers:
        names: ['gpu-a', 'gpu-b']
    versions:
    - 3
    - 4  # the candidate
    config:
        max_batch_size: 8
        dynamic_batching:
            max_queue_delay_microseconds: 100
    verify:
        timeout: 90s
        analysis:
            interval: 5s
            duration: 60s
            checks:
            - name: success-rate
              successRate: {min: 0.999}
            - name: latency
              latency: {maxIncrease: 0.5}
"""

RESNET_RESTORED = """\
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
    name: resnet
spec:
    model: "resnet50"   # quoted on purpose
    servers:
        names: ['gpu-a', 'gpu-b']
    versions:
    - 3
    config:
        max_batch_size: 4
        instance_group:
        - kind: KIND_GPU
          gpus:
          - 0
          - 1
    verify:
        timeout: 90s
        analysis:
            interval: 5s
            duration: 60s
            checks:
            - name: success-rate
              successRate: {min: 0.999}
            - name: latency
              latency: {maxIncrease: 0.5}
"""


def test_a_four_space_file_keeps_its_layout_and_gets_the_old_config_back() -> None:
    config = {"max_batch_size": 4, "instance_group": [{"kind": "KIND_GPU", "gpus": [0, 1]}]}

    restored = restore(RESNET, "resnet", (3,), config)

    assert restored == RESNET_RESTORED
    deployment = load(RESNET_RESTORED).deployments["resnet"]
    assert (deployment.model, deployment.versions, deployment.config) == ("resnet50", (3,), config)


# Two deployments in one file, with an explicit start; only the second is restored.
TWO = """\
---
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
  name: detector
spec:
  model: detector
  servers:
    names:
      - gpu-a
  versions: [4]
  config: {max_batch_size: 16}
---
# The classifier follows the detector.
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
  name: classifier
spec:
  model: 'classifier'
  servers:
    names:
      - gpu-a
      - gpu-b
  versions:
    - 7
  verify:
    smoke:
      - name: ones
        inputs:
          INPUT0: {datatype: FP32, shape: [1], data: [1]}
"""


def test_the_right_document_of_a_multi_document_file_is_restored() -> None:
    restored = restore(TWO, "classifier", (5, 6), {})

    assert restored == TWO.replace("    - 7\n", "    - 5\n    - 6\n")
    state = load(restored)
    assert state.deployments["classifier"].versions == (5, 6)
    assert state.deployments["detector"].versions == (4,)
    assert state.deployments["detector"].config == {"max_batch_size": 16}


TWO_RESTORED = """\
---
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
  name: detector
spec:
  model: detector
  servers:
    names:
      - gpu-a
  versions: [2, 3]
---
# The classifier follows the detector.
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
  name: classifier
spec:
  model: 'classifier'
  servers:
    names:
      - gpu-a
      - gpu-b
  versions:
    - 6
  verify:
    smoke:
      - name: ones
        inputs:
          INPUT0: {datatype: FP32, shape: [1], data: [1]}
"""


def test_two_restores_in_one_file_each_edit_their_own_document() -> None:
    # As a revert write-back does when two ModelDeployments of one file failed.
    once = restore(TWO, "detector", (2, 3), {})
    assert once is not None

    assert restore(once, "classifier", (6,), {}) == TWO_RESTORED


# -- indentation -----------------------------------------------------------------------------

BLOCK = """\
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
{i}name: m
spec:
{i}servers:
{i}{i}names:
{seq}gpu-a
{seq}gpu-b
{i}versions:
{versions}{i}config:
{i}{i}max_batch_size: 8
"""


@pytest.mark.parametrize(
    ("indent", "dash"),
    [
        ("  ", "    - "),  # 2 spaces, dash offset 2
        ("  ", "  - "),  # 2 spaces, no dash offset
        ("    ", "    - "),  # 4 spaces, no dash offset
        ("    ", "      - "),  # 4 spaces, dash offset 2
        ("    ", "        - "),  # 4 spaces, dash offset 4
    ],
    ids=["2-offset-2", "2-no-offset", "4-no-offset", "4-offset-2", "4-offset-4"],
)
def test_block_sequences_keep_the_files_indentation(indent: str, dash: str) -> None:
    seq = indent + dash  # the servers' names sit one level deeper than versions

    def text(*versions: int) -> str:
        listed = "".join(f"{dash}{v}\n" for v in versions)
        return BLOCK.format(i=indent, seq=seq, versions=listed)

    assert restore(text(3), "m", (1, 2)) == text(1, 2)
    assert restore(text(1, 2, 3), "m", (2,)) == text(2)


def test_a_flow_list_stays_a_flow_list_and_long_lines_are_not_wrapped() -> None:
    text = ECHO.replace("versions: [2]  # bumped by CI", "versions: [2]")
    # The promql line is longer than any default width.
    assert max(len(line) for line in text.splitlines()) > 100

    restored = restore(text, "echo", (1, 2, 3))

    assert restored == text.replace("versions: [2]", "versions: [1, 2, 3]")


# -- what is and is not restored -------------------------------------------------------------


def test_config_none_leaves_spec_config_as_it_is() -> None:
    restored = restore(TWO, "detector", (3,), None)

    assert restored == TWO.replace("versions: [4]", "versions: [3]")


def test_an_empty_config_removes_spec_config() -> None:
    restored = restore(TWO, "detector", (3,), {})

    assert restored == TWO.replace(
        "  versions: [4]\n  config: {max_batch_size: 16}\n", "  versions: [3]\n"
    )
    assert load(restored).deployments["detector"].config == {}


def test_a_config_is_added_where_the_failed_spec_had_none() -> None:
    restored = restore(TWO, "classifier", (5,), {"max_batch_size": 2})

    assert restored is not None
    assert restored.startswith(TWO[: TWO.index("  versions:\n    - 7")])
    deployment = load(restored).deployments["classifier"]
    assert (deployment.versions, deployment.config) == ((5,), {"max_batch_size": 2})
    assert deployment.smoke[0].name == "ones"


def test_a_deployment_changed_meanwhile_is_left_alone() -> None:
    failed = fingerprint(TWO, "detector")
    changed_again = TWO.replace("versions: [4]", "versions: [5]")

    assert restore_deployment(changed_again, "detector", failed, (3,), None) is None
    # Key order and layout alone do not make a different spec.
    reordered = TWO.replace(
        "  versions: [4]\n  config: {max_batch_size: 16}\n",
        "  config:\n    max_batch_size: 16\n  versions:\n    - 4\n",
    )
    assert restore_deployment(reordered, "detector", failed, (3,), None) is not None


@pytest.mark.parametrize(
    ("text", "name"),
    [
        (TWO, "segmenter"),  # no such ModelDeployment
        (SERVERS, "gpu-a"),  # a TritonServer by that name is not a ModelDeployment
        ("", "detector"),
        ("# nothing here\n", "detector"),
    ],
    ids=["absent", "server-of-that-name", "empty", "only-a-comment"],
)
def test_a_file_without_the_deployment_gives_none(text: str, name: str) -> None:
    assert restore_deployment(text, name, fingerprint(TWO, "detector"), (1,), None) is None


# -- comments and layout around the edited values ----------------------------------------


def test_a_header_comment_before_the_document_start_is_kept() -> None:
    text = "# yaml-language-server: $schema=../schemas/model-deployment.schema.json\n" + TWO

    restored = restore(text, "detector", (3,))

    assert restored == text.replace("versions: [4]", "versions: [3]")


def test_a_comment_after_a_block_versions_list_is_kept() -> None:
    text = BLOCK.format(
        i="  ",
        seq="      - ",
        versions="    - 3\n  # Merged over the base config.\n",
    )

    restored = restore(text, "m", (1,))

    assert restored == text.replace("    - 3\n", "    - 1\n")


@pytest.mark.parametrize("config", [{}, {"max_batch_size": 4}], ids=["removed", "replaced"])
def test_a_comment_after_spec_config_is_kept(config: dict[str, Any]) -> None:
    text = RESNET.replace("    verify:\n", "    # How new versions are checked.\n    verify:\n")

    restored = restore(text, "resnet", (3,), config)

    assert restored is not None
    assert "    # How new versions are checked.\n    verify:\n" in restored


def test_a_restored_config_keeps_its_flow_style() -> None:
    text = ECHO.replace("count: 1}]", "count: 2}]")

    restored = restore(text, "echo", (1,), {"instance_group": [{"kind": "KIND_CPU", "count": 1}]})

    assert restored == ECHO.replace("versions: [2]", "versions: [1]")


def test_an_inline_comment_after_a_longer_flow_list_keeps_two_spaces() -> None:
    restored = restore(ECHO, "echo", (1, 2, 3))

    assert restored is not None
    assert "  versions: [1, 2, 3]  # bumped by CI\n" in restored
