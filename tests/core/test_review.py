"""The review views, against golden outputs reviewed by hand once.

One realistic pull request: edge-a and edge-b serve echo 1 (with an analysis), edge-a serves
ranker 3 (no analysis), edge-b serves tagger 1 and 2. The change bumps echo to 2 with two
instances (in place) and adds a server edge-c that gets it too; bumps ranker to 4 with a wider
input, a bigger batch and dynamic batching (an interface change and a full reload, still with
no analysis); and deletes the ModelDeployment of tagger (an unload). The plan refuses ranker's
interface change (the interface gate), unless the head sets spec.allowInterfaceChange on it.

If a golden differs after a deliberate change, read the new output as a reviewer would before
pasting it here.
"""

from __future__ import annotations

import json

import pytest

from reconciler.core.plan.planner import plan
from reconciler.core.review_diff import (
    Change,
    DesiredDiff,
    FieldChange,
    ModelDiff,
    ReviewWarning,
    WarningKind,
    diff,
)
from reconciler.core.spec.desired import load_desired_state
from reconciler.core.triton_config import merge
from reconciler.model.errors import ValidationError
from reconciler.model.history import Held, History
from reconciler.model.plan import Action, Plan, PlanProblem
from reconciler.model.problems import Problem
from reconciler.model.spec import DesiredState
from reconciler.views.render import plan_json
from reconciler.views.review import (
    diff_json,
    diff_markdown,
    diff_text,
    github_annotations,
    plan_markdown,
    problems_json,
)
from tests.core.fakes import FakeTriton, observe

BASE_REV = "1f2e3d4c5b6a79880716253443526170f9e8d7c6"
HEAD_REV = "9a8b7c6d5e4f30211203f4e5d6c7b8a990817263"

SERVERS = """\
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata: {name: edge-a, labels: {pool: edge}}
spec: {grpc: "10.0.0.1:8001", metrics: "http://10.0.0.1:8002/metrics", modelRepository: /models}
---
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata: {name: edge-b, labels: {pool: edge}}
spec: {grpc: "10.0.0.2:8001", metrics: "http://10.0.0.2:8002/metrics", modelRepository: /models}
"""
EDGE_C = """\
---
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata: {name: edge-c, labels: {pool: edge}}
spec: {grpc: "10.0.0.3:8001", metrics: "http://10.0.0.3:8002/metrics", modelRepository: /models}
"""


def echo(version: int, instances: int) -> str:
    return f"""\
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata: {{name: echo}}
spec:
  servers: {{matchLabels: {{pool: edge}}}}
  versions: [{version}]
  config:
    instance_group: [{{kind: KIND_CPU, count: {instances}}}]
  verify:
    smoke:
      - name: doubles
        inputs: {{INPUT0: {{datatype: FP32, shape: [1, 4], data: [1, 1, 1, 1]}}}}
    analysis:
      interval: 5s
      duration: 60s
      checks:
        - {{name: success-rate, successRate: {{min: 0.999}}}}
"""


def ranker(version: int, width: int, batch: int, dynamic: bool, allow: bool = False) -> str:
    batching = "    dynamic_batching: {max_queue_delay_microseconds: 500}\n" if dynamic else ""
    allowed = "  allowInterfaceChange: true\n" if allow else ""
    return f"""\
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata: {{name: ranker}}
spec:
  servers: {{names: [edge-a]}}
  versions: [{version}]
  config:
    max_batch_size: {batch}
{batching}    input: [{{name: QUERY, data_type: TYPE_FP32, dims: [{width}]}}]
    output: [{{name: SCORES, data_type: TYPE_FP32, dims: [1]}}]
  verify:
    smoke:
      - inputs: {{QUERY: {{datatype: FP32, shape: [1, {width}], data: {[0] * width}}}}}
{allowed}"""


TAGGER = """\
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata: {name: legacy-tagger}
spec:
  model: tagger
  servers: {names: [edge-b]}
  versions: [1, 2]
"""


def base_state() -> DesiredState:
    return load_desired_state(
        {
            "servers.yaml": SERVERS.encode(),
            "models/echo.yaml": echo(1, 1).encode(),
            "models/ranker.yaml": ranker(3, 16, 8, dynamic=False).encode(),
            "models/tagger.yaml": TAGGER.encode(),
        }
    )


def head_state(allow: bool = False) -> DesiredState:
    """The pull request's head; ``allow``: ranker's interface change is intended
    (spec.allowInterfaceChange), which the plan otherwise refuses."""
    return load_desired_state(
        {
            "servers.yaml": (SERVERS + EDGE_C).encode(),
            "models/echo.yaml": echo(2, 2).encode(),
            "models/ranker.yaml": ranker(4, 32, 16, dynamic=True, allow=allow).encode(),
        }
    )


def head_plan(allow: bool = False) -> Plan:
    """The plan of the head revision against servers that serve what base asked for."""
    base = base_state()
    ranker_pbtxt = {
        "name": "ranker",
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "QUERY", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "SCORES", "data_type": "TYPE_FP32", "dims": [1]}],
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    }
    repository = {"echo": range(1, 4), "ranker": range(1, 5), "tagger": range(1, 3)}
    fakes = {
        name: FakeTriton(name, repository, configs={"ranker": ranker_pbtxt})
        for name in ("edge-a", "edge-b", "edge-c")
    }
    for server, placements in base.placements.items():
        for model, placement in placements.items():
            d = placement.deployment
            fakes[server].serve(model, d.versions, merge(fakes[server].configs[model], d.config))
    history = History(
        revision=BASE_REV, managed={s: frozenset(p) for s, p in base.placements.items()}
    )
    serving = {name: observe(fake) for name, fake in fakes.items()}
    return plan(head_state(allow), serving, history, HEAD_REV)


DIFF_MARKDOWN = """\
<!-- triton-gitops diff -->
### triton-gitops diff `1f2e3d4c5b6a` → `9a8b7c6d5e4f`

**5 model changes on 3 servers, 1 newly placed, 1 unloaded, 1 server added, 1 ModelDeployment removed, 4 warnings**

#### Server `edge-a`

| model | from | to | what changes |
| --- | --- | --- | --- |
| `echo` | 1 | 2 | load 2, then unload 1; `instance_group` `[{"count": 1, "kind": "KIND_CPU"}]` → `[{"count": 2, "kind": "KIND_CPU"}]` |
| `ranker` | 3 | 4 | load 4, then unload 3; `dynamic_batching` `(absent)` → `{"max_queue_delay_microseconds": 500}`; `input` `[{"data_type": "TYPE_FP32", "dims": [16], "name": "QUERY"}]` → `[{"data_type": "TYPE_FP32", "dims": [32], "name": "QUERY"}]`; `max_batch_size` `8` → `16`; verify: smoke |

#### Server `edge-b`

| model | from | to | what changes |
| --- | --- | --- | --- |
| `echo` | 1 | 2 | load 2, then unload 1; `instance_group` `[{"count": 1, "kind": "KIND_CPU"}]` → `[{"count": 2, "kind": "KIND_CPU"}]` |
| `tagger` | 1, 2 | — | **unloaded: no ModelDeployment places it here any more** |

#### Server `edge-c` (new)

| model | from | to | what changes |
| --- | --- | --- | --- |
| `echo` | — | 2 | newly placed: load 2 |

ModelDeployments removed: `legacy-tagger`

#### Warnings

- **Unloads a model**: `tagger` on `edge-b` (ModelDeployment `legacy-tagger`): unloaded (serving 1, 2): no ModelDeployment places it there any more
- **Changes inputs or outputs**: `ranker` on `edge-a`: input QUERY FP32 [16] -> FP32 [32]
- **Reloads fully**: `ranker` on `edge-a`: a change of dynamic_batching, input, max_batch_size reloads every version fully (Triton applies only version_policy and instance_group in place): each is loaded again beside the serving instance, which costs memory and load time
- **No post-swap analysis**: `ranker` on `edge-a`: no spec.verify.analysis: new version(s) 4 are judged only by readiness and 1 smoke case; no metrics are watched once they take traffic

<details>
<summary>Full diff</summary>

```text
base 1f2e3d4c5b6a79880716253443526170f9e8d7c6
head 9a8b7c6d5e4f30211203f4e5d6c7b8a990817263
server edge-a
  model echo: 1 -> 2 (ModelDeployment echo)
    load 2, then unload 1
    config instance_group: [{"count": 1, "kind": "KIND_CPU"}] -> [{"count": 2, "kind": "KIND_CPU"}]
  model ranker: 3 -> 4 (ModelDeployment ranker)
    load 4, then unload 3
    config dynamic_batching: (absent) -> {"max_queue_delay_microseconds": 500}
    config input: [{"data_type": "TYPE_FP32", "dims": [16], "name": "QUERY"}] -> [{"data_type": "TYPE_FP32", "dims": [32], "name": "QUERY"}]
    config max_batch_size: 8 -> 16
    verify changed: smoke
server edge-b
  model echo: 1 -> 2 (ModelDeployment echo)
    load 2, then unload 1
    config instance_group: [{"count": 1, "kind": "KIND_CPU"}] -> [{"count": 2, "kind": "KIND_CPU"}]
  model tagger: 1, 2 -> removed (ModelDeployment legacy-tagger)
    unloaded: no ModelDeployment places it here any more
server edge-c: added
  model echo: not placed -> 2 (ModelDeployment echo)
    newly placed: load 2
ModelDeployments removed: legacy-tagger
warnings:
  unload: model tagger on edge-b: unloaded (serving 1, 2): no ModelDeployment places it there any more
  interface: model ranker on edge-a: input QUERY FP32 [16] -> FP32 [32]
  full-reload: model ranker on edge-a: a change of dynamic_batching, input, max_batch_size reloads every version fully (Triton applies only version_policy and instance_group in place): each is loaded again beside the serving instance, which costs memory and load time
  no-analysis: model ranker on edge-a: no spec.verify.analysis: new version(s) 4 are judged only by readiness and 1 smoke case; no metrics are watched once they take traffic
diff: 5 model changes on 3 servers, 1 newly placed, 1 unloaded, 1 server added, 1 ModelDeployment removed, 4 warnings
```

</details>
"""  # noqa: E501
DIFF_JSON = {
    "format_version": "1",
    "base": "1f2e3d4c5b6a79880716253443526170f9e8d7c6",
    "head": "9a8b7c6d5e4f30211203f4e5d6c7b8a990817263",
    "has_changes": True,
    "servers": [{"server": "edge-c", "change": "added", "fields": [], "models": ["echo"]}],
    "changes": [
        {
            "server": "edge-a",
            "model": "echo",
            "deployment": "echo",
            "change": "changed",
            "from": [1],
            "to": [2],
            "versions_added": [2],
            "versions_removed": [1],
            "config": [
                {
                    "key": "instance_group",
                    "old": [{"kind": "KIND_CPU", "count": 1}],
                    "new": [{"kind": "KIND_CPU", "count": 2}],
                }
            ],
            "verify": [],
        },
        {
            "server": "edge-a",
            "model": "ranker",
            "deployment": "ranker",
            "change": "changed",
            "from": [3],
            "to": [4],
            "versions_added": [4],
            "versions_removed": [3],
            "config": [
                {
                    "key": "dynamic_batching",
                    "old": None,
                    "new": {"max_queue_delay_microseconds": 500},
                },
                {
                    "key": "input",
                    "old": [{"name": "QUERY", "data_type": "TYPE_FP32", "dims": [16]}],
                    "new": [{"name": "QUERY", "data_type": "TYPE_FP32", "dims": [32]}],
                },
                {"key": "max_batch_size", "old": 8, "new": 16},
            ],
            "verify": ["smoke"],
        },
        {
            "server": "edge-b",
            "model": "echo",
            "deployment": "echo",
            "change": "changed",
            "from": [1],
            "to": [2],
            "versions_added": [2],
            "versions_removed": [1],
            "config": [
                {
                    "key": "instance_group",
                    "old": [{"kind": "KIND_CPU", "count": 1}],
                    "new": [{"kind": "KIND_CPU", "count": 2}],
                }
            ],
            "verify": [],
        },
        {
            "server": "edge-b",
            "model": "tagger",
            "deployment": "legacy-tagger",
            "change": "removed",
            "from": [1, 2],
            "to": [],
            "versions_added": [],
            "versions_removed": [1, 2],
            "config": [],
            "verify": [],
        },
        {
            "server": "edge-c",
            "model": "echo",
            "deployment": "echo",
            "change": "added",
            "from": [],
            "to": [2],
            "versions_added": [2],
            "versions_removed": [],
            "config": [],
            "verify": [],
        },
    ],
    "deployments_added": [],
    "deployments_removed": ["legacy-tagger"],
    "warnings": [
        {
            "kind": "unload",
            "model": "tagger",
            "deployment": "legacy-tagger",
            "servers": ["edge-b"],
            "message": "unloaded (serving 1, 2): no ModelDeployment places it there any more",
        },
        {
            "kind": "interface",
            "model": "ranker",
            "deployment": "ranker",
            "servers": ["edge-a"],
            "message": "input QUERY FP32 [16] -> FP32 [32]",
        },
        {
            "kind": "full-reload",
            "model": "ranker",
            "deployment": "ranker",
            "servers": ["edge-a"],
            "message": "a change of dynamic_batching, input, max_batch_size reloads every "
            "version fully (Triton applies only version_policy and "
            "instance_group in place): each is loaded again beside the serving "
            "instance, which costs memory and load time",
        },
        {
            "kind": "no-analysis",
            "model": "ranker",
            "deployment": "ranker",
            "servers": ["edge-a"],
            "message": "no spec.verify.analysis: new version(s) 4 are judged only by "
            "readiness and 1 smoke case; no metrics are watched once they take "
            "traffic",
        },
    ],
}

# The pull request as it is: ranker's wider input is refused before anything loads (the
# interface gate), its version 3 serving as before.
PLAN_MARKDOWN = """\
<!-- triton-gitops plan -->
### triton-gitops plan at `9a8b7c6d5e4f`

**4 model changes in 12 steps on 3 servers, 0 in sync, 0 held, 1 problem, 1 warning**

#### Server `edge-a`

| model | from | to | steps |
| --- | --- | --- | --- |
| `echo` | 1 | 2 | load 1, 2 → verify 2 (1 smoke case on 2) → analyze 2 for 60s → unload 1 |

#### Server `edge-b`

| model | from | to | steps |
| --- | --- | --- | --- |
| `echo` | 1 | 2 | load 1, 2 → verify 2 (1 smoke case on 2) → analyze 2 for 60s → unload 1 |
| `tagger` | 1, 2 | — | unload the model |

#### Server `edge-c`

| model | from | to | steps |
| --- | --- | --- | --- |
| `echo` | — | 2 | load 2 → verify 2 (1 smoke case on 2) → analyze 2 for 60s |

#### Problems

- server edge-a, model ranker: version 4 changes the model's interface: input QUERY shape [-1, 16] -> [-1, 32]; refused before anything is loaded (Triton applies a config to the whole model, so version(s) 3 would answer with it too; set spec.allowInterfaceChange: true to accept)

#### Warnings

- **Unloads a model**: `tagger` on `edge-b`: unloaded (serving 1, 2): no ModelDeployment places it there any more

<details>
<summary>Full plan</summary>

```text
revision 9a8b7c6d5e4f30211203f4e5d6c7b8a990817263
server edge-a
  model echo: 1 -> 2
    1. load         1, 2           serve new version(s) 2; config changed (instance_group); beside 1 which keep serving
    2. verify       2              2 READY; 1 smoke case(s) against 2; inputs and outputs as the old versions'
    3. analyze      2              watch 2 for 60s, every 5s: success-rate; probes at most 20/s from the smoke cases; old versions stay loaded
    4. unload 1     keep 2         drop old version(s) 1 once the new ones are verified
server edge-b
  model echo: 1 -> 2
    1. load         1, 2           serve new version(s) 2; config changed (instance_group); beside 1 which keep serving
    2. verify       2              2 READY; 1 smoke case(s) against 2; inputs and outputs as the old versions'
    3. analyze      2              watch 2 for 60s, every 5s: success-rate; probes at most 20/s from the smoke cases; old versions stay loaded
    4. unload 1     keep 2         drop old version(s) 1 once the new ones are verified
  model tagger: 1, 2 -> removed
    1. unload       the model      no ModelDeployment places this model on this server any more
server edge-c
  model echo: none -> 2
    1. load         2              serve new version(s) 2
    2. verify       2              2 READY; 1 smoke case(s) against 2
    3. analyze      2              watch 2 for 60s, every 5s: success-rate; probes at most 20/s from the smoke cases; old versions stay loaded
problems:
  server edge-a, model ranker: version 4 changes the model's interface: input QUERY shape [-1, 16] -> [-1, 32]; refused before anything is loaded (Triton applies a config to the whole model, so version(s) 3 would answer with it too; set spec.allowInterfaceChange: true to accept)
plan: 4 model(s) to change in 12 step(s), 0 in sync, 0 held, 1 problem(s)
```

</details>
"""  # noqa: E501

# The same with spec.allowInterfaceChange on ranker: the change is planned, and the reviewer
# is warned of it.
PLAN_MARKDOWN_ALLOWED = """\
<!-- triton-gitops plan -->
### triton-gitops plan at `9a8b7c6d5e4f`

**5 model changes in 15 steps on 3 servers, 0 in sync, 0 held, 0 problems, 4 warnings**

#### Server `edge-a`

| model | from | to | steps |
| --- | --- | --- | --- |
| `echo` | 1 | 2 | load 1, 2 → verify 2 (1 smoke case on 2) → analyze 2 for 60s → unload 1 |
| `ranker` | 3 | 4 | load 3, 4 → verify 4 (1 smoke case on 4) → unload 3 |

#### Server `edge-b`

| model | from | to | steps |
| --- | --- | --- | --- |
| `echo` | 1 | 2 | load 1, 2 → verify 2 (1 smoke case on 2) → analyze 2 for 60s → unload 1 |
| `tagger` | 1, 2 | — | unload the model |

#### Server `edge-c`

| model | from | to | steps |
| --- | --- | --- | --- |
| `echo` | — | 2 | load 2 → verify 2 (1 smoke case on 2) → analyze 2 for 60s |

#### Warnings

- **Unloads a model**: `tagger` on `edge-b`: unloaded (serving 1, 2): no ModelDeployment places it there any more
- **Changes inputs or outputs**: `ranker` on `edge-a`: input QUERY FP32 [16] -> FP32 [32]
- **Reloads fully**: `ranker` on `edge-a`: a change of dynamic_batching, input, max_batch_size reloads every version fully (Triton applies only version_policy and instance_group in place): each is loaded again beside the serving instance, which costs memory and load time
- **No post-swap analysis**: `ranker` on `edge-a`: no spec.verify.analysis: new version(s) 4 are judged only by readiness and 1 smoke case; no metrics are watched once they take traffic

<details>
<summary>Full plan</summary>

```text
revision 9a8b7c6d5e4f30211203f4e5d6c7b8a990817263
server edge-a
  model echo: 1 -> 2
    1. load         1, 2           serve new version(s) 2; config changed (instance_group); beside 1 which keep serving
    2. verify       2              2 READY; 1 smoke case(s) against 2; inputs and outputs as the old versions'
    3. analyze      2              watch 2 for 60s, every 5s: success-rate; probes at most 20/s from the smoke cases; old versions stay loaded
    4. unload 1     keep 2         drop old version(s) 1 once the new ones are verified
  model ranker: 3 -> 4
    1. load         3, 4           serve new version(s) 4; config changed (dynamic_batching, input, max_batch_size); beside 3 which keep serving
    2. verify       4              4 READY; 1 smoke case(s) against 4
    3. unload 3     keep 4         drop old version(s) 3 once the new ones are verified
server edge-b
  model echo: 1 -> 2
    1. load         1, 2           serve new version(s) 2; config changed (instance_group); beside 1 which keep serving
    2. verify       2              2 READY; 1 smoke case(s) against 2; inputs and outputs as the old versions'
    3. analyze      2              watch 2 for 60s, every 5s: success-rate; probes at most 20/s from the smoke cases; old versions stay loaded
    4. unload 1     keep 2         drop old version(s) 1 once the new ones are verified
  model tagger: 1, 2 -> removed
    1. unload       the model      no ModelDeployment places this model on this server any more
server edge-c
  model echo: none -> 2
    1. load         2              serve new version(s) 2
    2. verify       2              2 READY; 1 smoke case(s) against 2
    3. analyze      2              watch 2 for 60s, every 5s: success-rate; probes at most 20/s from the smoke cases; old versions stay loaded
plan: 5 model(s) to change in 15 step(s), 0 in sync, 0 held, 0 problem(s)
```

</details>
"""  # noqa: E501


def test_diff_markdown_golden() -> None:
    d = diff(base_state(), head_state())
    assert diff_markdown(d, BASE_REV, HEAD_REV) == DIFF_MARKDOWN


def test_diff_json_golden() -> None:
    d = diff(base_state(), head_state())
    data = diff_json(d, BASE_REV, HEAD_REV)
    assert data == DIFF_JSON
    assert json.loads(json.dumps(data)) == data  # plain JSON values only


def test_plan_markdown_golden() -> None:
    assert plan_markdown(head_plan()) == PLAN_MARKDOWN
    assert plan_markdown(head_plan(allow=True)) == PLAN_MARKDOWN_ALLOWED


def test_text_diff_is_the_details_block_of_the_markdown() -> None:
    d = diff(base_state(), head_state())
    text = diff_text(d, BASE_REV, HEAD_REV)
    assert f"```text\n{text}\n```" in diff_markdown(d, BASE_REV, HEAD_REV)
    assert text.splitlines()[-1] == (
        "diff: 5 model changes on 3 servers, 1 newly placed, 1 unloaded, 1 server added, "
        "1 ModelDeployment removed, 4 warnings"
    )


def test_no_change_renders_briefly() -> None:
    state = base_state()
    d = diff(state, state)
    assert diff_markdown(d, BASE_REV, BASE_REV).splitlines()[:4] == [
        "<!-- triton-gitops diff -->",
        "### triton-gitops diff `1f2e3d4c5b6a` → `1f2e3d4c5b6a`",
        "",
        "**No change to the desired state**",
    ]
    assert diff_json(d, BASE_REV, BASE_REV)["has_changes"] is False
    markdown = plan_markdown(Plan(HEAD_REV, in_sync=(("edge-a", "echo"),)))
    assert "\nNothing to do: every server serves what the manifests ask for.\n" in markdown
    assert "#### Warnings" not in markdown


def test_plan_markdown_lists_holds_and_problems() -> None:
    held = Held(
        "edge-a", "echo", "echo", BASE_REV, "analysis failed: success-rate=0.91 (min 0.999)\n", (1,)
    )
    p = Plan(
        HEAD_REV,
        problems=(
            PlanProblem("edge-b", None, "did not answer"),
            PlanProblem(
                "edge-a", "ranker", "version(s) 4 not in the model repository (it holds 3)"
            ),
        ),
        held=(held,),
    )
    markdown = plan_markdown(p)
    assert (
        "#### Held\n\n- `echo` on `edge-a`: ModelDeployment `echo` kept at 1 since "
        "`1f2e3d4c5b6a`: analysis failed: success-rate=0.91 (min 0.999)\n"
    ) in markdown
    assert (
        "#### Problems\n\n"
        "- server edge-a, model ranker: version(s) 4 not in the model repository (it holds 3)\n"
        "- server edge-b: did not answer\n"
    ) in markdown


def test_markdown_keeps_odd_values_inert() -> None:
    d = DesiredDiff(
        models=(
            ModelDiff(
                "s1",
                "m",
                Change.CHANGED,
                "m",
                (1,),
                (1,),
                config=(FieldChange("parameters", None, {"sep": {"string_value": "a|`b`"}}),),
            ),
        ),
        warnings=(ReviewWarning(WarningKind.KEPT_CONFIG, "m", "m", ("s1",), "<b>x</b> `y` | z"),),
    )
    markdown = diff_markdown(d, BASE_REV, HEAD_REV)
    # In a table cell a pipe is escaped even inside code; a code span outlasts the backticks.
    assert '``{"sep": {"string_value": "a\\|`b`"}}``' in markdown
    assert ": &lt;b>x&lt;/b> \\`y\\` \\| z\n" in markdown


# -- validation problems ---------------------------------------------------------------------

BROKEN = {
    "servers.yaml": SERVERS.encode(),
    "models/ranker.yaml": b"""\
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata: {name: ranker}
spec:
  servers: {names: [edge-a, edge-z]}
  versions: [4]
  config:
    name: scorer
""",
    "models/echo.yaml": b"""\
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata: {name: echo}
spec:
  servers: {matchLabels: {pool: edge}}
  versions: [2]
  verify:
    timeout: 2 minutes
""",
    "models/tagger,v2.yaml": b"""\
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata: {name: tagger
""",
}

ANNOTATIONS = """\
::error file=models/echo.yaml,line=8::spec.verify.timeout: '2 minutes' is not a duration (e.g. 500ms, 30s, 1m30s, 2h)
::error file=models/ranker.yaml,line=5::ModelDeployment 'ranker' names unknown TritonServer 'edge-z'
::error file=models/ranker.yaml,line=8::config.name 'scorer' must equal the model name 'ranker'
::error file=models/tagger%2Cv2.yaml,line=4::invalid YAML: expected ',' or '}', but got '<stream end>'\
"""  # noqa: E501


def broken_problems() -> list[Problem]:
    with pytest.raises(ValidationError) as raised:
        load_desired_state(BROKEN)
    return raised.value.problems


def test_github_annotations_golden() -> None:
    assert github_annotations(broken_problems()) == ANNOTATIONS


def test_github_annotations_escape_data_and_properties() -> None:
    problems = [
        Problem("C:/repo/a,b.yaml", 3, "100% sure:\r\nsecond line"),
        Problem("models", 0, "no such directory"),
    ]
    assert github_annotations(reversed(problems)).splitlines() == [
        "::error file=C%3A/repo/a%2Cb.yaml,line=3::100%25 sure:%0D%0Asecond line",
        "::error file=models::no such directory",
    ]
    assert github_annotations([]) == ""


def test_problems_json() -> None:
    assert problems_json(broken_problems()) == {
        "format_version": "1",
        "valid": False,
        "problems": [
            {
                "file": "models/echo.yaml",
                "line": 8,
                "message": "spec.verify.timeout: '2 minutes' is not a duration "
                "(e.g. 500ms, 30s, 1m30s, 2h)",
            },
            {
                "file": "models/ranker.yaml",
                "line": 5,
                "message": "ModelDeployment 'ranker' names unknown TritonServer 'edge-z'",
            },
            {
                "file": "models/ranker.yaml",
                "line": 8,
                "message": "config.name 'scorer' must equal the model name 'ranker'",
            },
            {
                "file": "models/tagger,v2.yaml",
                "line": 4,
                "message": "invalid YAML: expected ',' or '}', but got '<stream end>'",
            },
        ],
    }
    assert problems_json([]) == {"format_version": "1", "valid": True, "problems": []}


def test_plan_json_gives_the_config_each_load_sends() -> None:
    """Issue 45, point 5: docs/troubleshooting.md sends the reader to `plan --output json`
    for the config a load sends (config.pbtxt merged with spec.config, version_policy set
    by the reconciler); each load step carries it, and no other step does."""
    planned = head_plan()
    steps = plan_json(planned)["steps"]
    loads = [s for s in steps if s["action"] == "load"]
    assert loads, [s["action"] for s in steps]
    sources = [s for s in planned.steps if s.action is Action.LOAD]
    for step, source in zip(loads, sources, strict=True):
        assert step["config"] == source.config, step
        assert step["config"]["version_policy"] == {"specific": {"versions": step["versions"]}}, (
            step
        )
    assert all("config" not in s for s in steps if s["action"] != "load"), steps
