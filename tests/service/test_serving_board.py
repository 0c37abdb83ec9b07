"""The serving board (service/serving.py): what GET /serving answers, the metric, and when
the readiness publisher is called, from readings and apply's step events. The readings are
given as the watch hands them over; test_serving_truth.py (integration) reads a real Triton.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import ClassVar

import pytest

from reconciler.core.exchange import Reply
from reconciler.core.serving_truth import ServingTruth
from reconciler.model.errors import VerifyFailed
from reconciler.model.history import AlertEvent
from reconciler.model.plan import Action, Plan, Step
from reconciler.model.reports import PassReport
from reconciler.model.serving import ModelInterface, ModelState, ServerState, TensorSignature
from reconciler.model.spec import ModelDeployment, SmokeCase, StreamExpectation, Tensor
from reconciler.model.spec import ServingProbes as Spec
from reconciler.service import serving_probes
from reconciler.service.connections import ServerConnections
from reconciler.service.serving import DROPPED, ServingBoard
from reconciler.service.serving_probes import ServingProbes
from reconciler.service.telemetry import ReconcilerMetrics
from reconciler.service.unloading import RESEND, StuckUnloads

REPORT = PassReport(
    "abc",
    Plan("abc", in_sync=(("edge-a", "counter"),)),
    servers={"edge-a": "10.0.0.5:8001", "edge-b": "10.0.0.6:8001"},
    expected={"edge-a": {"counter": (1,)}},
)
SERVING = {"edge-a": {"counter": frozenset({1})}, "edge-b": {}}
CASE = SmokeCase("one", (Tensor("INPUT0", "FP32", (1, 4), (1.0, 1.0, 1.0, 1.0)),), ())
ANY_ERROR = "inference on counter version 1: Stub process is not healthy"


class Publisher:
    def __init__(self, problem: str | None = None) -> None:
        self.problem = problem
        self.calls: list[tuple[str, bool, str]] = []

    def publish(self, truth: ServingTruth, address: str) -> str | None:
        self.calls.append((truth.server, truth.serving, address))
        return self.problem


def gauge(metrics: ReconcilerMetrics, name: str, server: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"server": server})


def test_nothing_read_yet_is_not_serving() -> None:
    status, body = ServingBoard(ReconcilerMetrics()).answer(None)
    assert (status, body) == (503, {"servers": {}})


def test_a_drain_takes_its_model_out_until_the_pass_ends_and_publishes_each_change() -> None:
    metrics, publisher = ReconcilerMetrics(), Publisher()
    board = ServingBoard(metrics, publisher)
    board.read(REPORT, SERVING)
    assert board.answer("edge-a")[0] == 200 and board.answer(None)[0] == 200
    assert gauge(metrics, "triton_gitops_server_serving", "edge-a") == 1
    assert publisher.calls == [("edge-a", True, "10.0.0.5:8001"), ("edge-b", True, "10.0.0.6:8001")]

    board.read(REPORT, SERVING)  # the same truth: nothing published again
    assert len(publisher.calls) == 2

    board.started(Step("edge-a", "counter", Action.DRAIN, (1,), "sequence model"), False)
    status, body = board.answer("edge-a")
    assert status == 503 and body["serving"] is False
    assert body["reasons"] == [
        "model counter: drained for its swap (a sequence model: Triton restarts its sequence "
        "batcher)"
    ]
    assert board.answer(None)[0] == 503
    assert gauge(metrics, "triton_gitops_server_serving", "edge-a") == 0
    assert publisher.calls[-1] == ("edge-a", False, "10.0.0.5:8001")
    # Other steps take nothing out.
    board.started(Step("edge-b", "x", Action.LOAD, (1,), "load"), False)
    assert board.answer("edge-b")[0] == 200

    board.pass_ended()
    assert board.answer("edge-a")[0] == 200
    assert publisher.calls[-1] == ("edge-a", True, "10.0.0.5:8001")
    assert board.answer("edge-c") == (404, {"error": "no server edge-c in the last pass"})


def test_a_server_that_does_not_answer_is_out_and_a_failed_publish_is_tried_again() -> None:
    metrics, publisher = ReconcilerMetrics(), Publisher("no readiness gate declared")
    board = ServingBoard(metrics, publisher)
    board.read(REPORT, {**SERVING, "edge-a": "server edge-a unreachable"})
    status, body = board.answer("edge-a")
    assert status == 503 and body["reasons"] == ["unreachable: server edge-a unreachable"]
    errors = "triton_gitops_readiness_gate_errors_total"
    assert gauge(metrics, errors, "edge-a") == 1
    board.read(REPORT, {**SERVING, "edge-a": "server edge-a unreachable"})
    assert gauge(metrics, errors, "edge-a") == 2  # unpublished: tried at every reading
    # A server the next pass no longer has leaves the metric.
    board.read(PassReport("d", Plan("d"), servers={"edge-b": "x"}), {"edge-b": {}})
    assert gauge(metrics, "triton_gitops_server_serving", "edge-a") is None


class DeadStub:
    """A Triton client whose every inference fails as a dead Python stub's does; it
    records what it was asked."""

    calls: ClassVar[list[str]] = []

    def __init__(self, server: str, address: str) -> None:
        pass

    def __enter__(self) -> DeadStub:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def interface(self, model: str, version: int) -> ModelInterface:
        return ModelInterface((TensorSignature("INPUT0", "FP32", (-1, 4)),),
                              (TensorSignature("OUTPUT0", "FP32", (-1, 4)),))  # fmt: skip

    def observe(self, models: Iterable[str]) -> ServerState:
        # unary: its live config says nothing of streams
        return ServerState("edge-a", {model: ModelState(model) for model in models})

    def infer(self, model: str, version: int, *args: object) -> dict[str, object]:
        DeadStub.calls.append(f"{model} {version}")
        raise VerifyFailed(f"inference on {model} version {version}: Stub process is not healthy")


def test_probes_take_a_stopped_version_out_unless_its_deployment_opts_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(serving_probes, "watch_client", DeadStub)
    on = ModelDeployment("counter", "counter", (1,), smoke=(CASE,))
    off = replace(on, serving_probes=Spec(enabled=False))
    now = [1000.0]
    for deployment, calls in ((on, 3), (off, 0)):
        DeadStub.calls = []
        report = replace(REPORT, placed={("edge-a", "counter"): deployment})
        probes = ServingProbes(clock=lambda: now[0])
        for _ in range(3):
            probes.round(report, SERVING)
            now[0] += 10.0
        assert len(DeadStub.calls) == calls, deployment.serving_probes
        if calls:
            (reason,) = probes.out_of_service(report).values()
            assert reason.startswith("version 1 stopped answering (3 probes in a row: ")
            assert probes.reloads_wanted(report) == {("edge-a", "counter"): {1: ANY_ERROR}}
        else:
            assert probes.out_of_service(report) == {} and probes.reloads_wanted(report) == {}


class Timed(DeadStub):
    """A Triton client whose versions answer every probe; it records the deadline (and,
    for a stream, the cap on responses) each probe was sent with."""

    config: ClassVar[dict[str, object] | None] = None
    sent: ClassVar[list[tuple[float | None, int | None]]] = []

    def observe(self, models: Iterable[str]) -> ServerState:
        return ServerState(
            "edge-a", {model: ModelState(model, loaded_config=Timed.config) for model in models}
        )

    def infer(self, model: str, version: int, *args: object) -> dict[str, object]:
        Timed.sent.append((args[2], None))  # inputs, outputs, timeout
        return {}

    def stream(
        self,
        model: str,
        version: int,
        inputs: object,
        outputs: object,
        timeout: float | None,
        max_responses: int,
    ) -> Reply:
        Timed.sent.append((timeout, max_responses))
        return Reply((), (), streamed=True)


DECOUPLED = {"model_transaction_policy": {"decoupled": True}}


@pytest.mark.parametrize(
    ("smoke", "config", "sent"),
    [
        # The probe is the case the version must answer: its own time, not the probes' 2 s
        # (a model slow by design, given 20 s, was taken out and reloaded every 30 s).
        ((replace(CASE, timeout=20.0),), None, (20.0, None)),
        ((replace(CASE, stream=StreamExpectation(deadline=45.0, cap=64)),), DECOUPLED, (45.0, 64)),
        # A case without a time of its own, or no case (a request made up from the inputs):
        # the probes' own timeout.
        ((CASE,), None, (2.0, None)),
        ((), None, (2.0, None)),
    ],
    ids=["case-timeout", "stream-deadline", "case", "synthesized"],
)
def test_a_probe_is_sent_with_its_smoke_cases_own_time_else_the_probes_timeout(
    monkeypatch: pytest.MonkeyPatch,
    smoke: tuple[SmokeCase, ...],
    config: dict[str, object] | None,
    sent: tuple[float | None, int | None],
) -> None:
    monkeypatch.setattr(serving_probes, "watch_client", Timed)
    monkeypatch.setattr(Timed, "config", config)
    monkeypatch.setattr(Timed, "sent", [])
    deployment = ModelDeployment("counter", "counter", (1,), smoke=smoke)
    assert deployment.serving_probes.timeout == 2.0
    report = replace(REPORT, placed={("edge-a", "counter"): deployment})
    ServingProbes(clock=lambda: 1000.0).round(report, SERVING)
    assert Timed.sent == [sent]


class Hanging(DeadStub):
    """A dead stub whose every answer waits until ``released`` is set (a stub that hangs
    before it fails), and that can end a pass while a probe is out (``during``)."""

    released = threading.Event()
    during: ClassVar[Callable[[], None]] = staticmethod(lambda: None)

    def infer(self, model: str, version: int, *args: object) -> dict[str, object]:
        Hanging.during()
        assert Hanging.released.wait(10), "never released"
        return super().infer(model, version, *args)


def _out_at_one_failure() -> PassReport:
    """The pass that placed counter, whose smoke case's first failure takes it out."""
    deployment = ModelDeployment("counter", "counter", (1,), smoke=(CASE,),
                                 serving_probes=Spec(failures=1))  # fmt: skip
    return replace(REPORT, placed={("edge-a", "counter"): deployment})


def test_a_round_of_probes_runs_aside_and_says_when_it_took_a_version_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(serving_probes, "watch_client", Hanging)
    monkeypatch.setattr(Hanging, "released", threading.Event())
    report = _out_at_one_failure()
    found: list[str] = []
    probes = ServingProbes(clock=lambda: 1000.0)
    assert probes.round_aside(report, SERVING, lambda: found.append("found"))
    # The probe hangs: the watch's round goes on, and the next one does not start another.
    assert not probes.round_aside(report, SERVING, lambda: found.append("again"))
    assert probes.out_of_service(report) == {} and found == []
    Hanging.released.set()
    probes.wait_aside(10)
    assert found == ["found"], found
    assert list(probes.out_of_service(report)) == [("edge-a", "counter")]


def test_a_probe_out_when_a_pass_ended_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving_probes, "watch_client", Hanging)
    monkeypatch.setattr(Hanging, "released", threading.Event())
    Hanging.released.set()
    report = _out_at_one_failure()
    probes = ServingProbes(clock=lambda: 1000.0)
    # The pass may have reloaded or unloaded the version the probe asked: its failure says
    # nothing of the version serving now.
    monkeypatch.setattr(Hanging, "during", staticmethod(lambda: probes.reloaded(report)))
    probes.round(report, SERVING)
    assert probes.out_of_service(report) == {} and probes.reloads_wanted(report) == {}
    monkeypatch.setattr(Hanging, "during", staticmethod(lambda: None))
    probes.round(report, SERVING)
    assert probes.reloads_wanted(report) == {("edge-a", "counter"): {1: ANY_ERROR}}


class Sent:
    def __init__(self) -> None:
        self.events: list[AlertEvent] = []
        self.flushes = 0

    def send(self, event: AlertEvent) -> None:
        self.events.append(event)

    def flush(self) -> bool:
        self.flushes += 1
        return True


def test_a_version_stuck_unloading_is_alerted_again_while_it_lasts_and_resolved_when_gone() -> None:
    metrics, sent, now = ReconcilerMetrics(), Sent(), [0.0]
    stuck = StuckUnloads(60.0, sent, metrics, clock=lambda: now[0])
    key = ("edge-a", "echo", 4)
    for at in (0.0, 30.0):
        now[0] = at
        stuck.read([key], "abc")
    assert sent.events == []
    now[0] = 61.0
    stuck.read([key], "abc")
    (event,) = sent.events
    assert (event.kind, event.severity, event.model, event.server) == (
        "unload-stuck",
        "warning",
        "echo",
        "edge-a",
    )
    assert event.summary.startswith("echo version 4 on edge-a has been UNLOADING for 1 min")
    stuck_gauge = "triton_gitops_versions_stuck_unloading"
    labels = {"server": "edge-a", "model": "echo"}
    assert metrics.registry.get_sample_value(stuck_gauge, labels) == 1
    now[0] = 120.0
    stuck.read([key], "abc")
    assert len(sent.events) == 1  # sent again only after RESEND
    now[0] = 61.0 + RESEND
    stuck.read([key], "abc")
    assert len(sent.events) == 2
    now[0] += 1
    stuck.read([], "abc")
    assert (
        sent.events[-1].resolved
        and sent.events[-1].summary == "echo version 4 on edge-a is unloaded"
    )
    assert metrics.registry.get_sample_value(stuck_gauge, labels) is None


class Connection:
    """A kept connection to one server, as the client library reports it."""

    def __init__(self, server: str, address: str) -> None:
        self.address, self.up, self.closed = address, True, False
        self.dropped: list[Callable[[], None]] = []

    def version_states(self) -> dict[str, dict[int, str]]:
        return {}

    def connected(self) -> bool:
        return self.up

    def when_dropped(self, dropped: Callable[[], None]) -> None:
        self.dropped.append(dropped)

    def drop(self) -> None:
        self.up = False
        for dropped in self.dropped:
            dropped()

    def close(self) -> None:
        self.closed = True


class Connections:
    """``ServerConnections`` over ``Connection``s, keeping every one it opened."""

    def __init__(self) -> None:
        self.heard: list[str] = []
        self.opened: list[Connection] = []

        def connect(server: str, address: str) -> Connection:
            self.opened.append(Connection(server, address))
            return self.opened[-1]

        self.kept = ServerConnections(self.heard.append, connect)


def test_a_dropped_connection_is_out_until_a_reading_begun_after_the_drop() -> None:
    metrics, publisher, connections = ReconcilerMetrics(), Publisher(), Connections()
    board = ServingBoard(metrics, publisher, connections.kept)
    edge_a = connections.kept.to("edge-a", "10.0.0.5:8001")
    connections.kept.to("edge-b", "10.0.0.6:8001")
    began = time.monotonic()
    board.read(REPORT, SERVING, began=began)
    assert board.answer("edge-a")[0] == 200

    edge_a.drop()  # the server restarted: the library tells, from a thread of its own
    assert connections.heard == ["edge-a"]
    board.connection_dropped("edge-a")
    status, body = board.answer("edge-a")
    assert (status, body["reasons"]) == (503, [DROPPED]), f"{status} after the drop: {body}"
    assert gauge(metrics, "triton_gitops_server_serving", "edge-a") == 0
    assert publisher.calls[-1] == ("edge-a", False, "10.0.0.5:8001")
    assert board.answer("edge-b")[0] == 200  # the other server is unaffected

    # A reading begun before the drop read the old process, whatever it says.
    board.read(REPORT, SERVING, began=began)
    status, body = board.answer("edge-a")
    assert (status, body["reasons"]) == (503, [DROPPED]), (
        f"{status} from a reading begun before the drop: {body}"
    )
    # One begun after it says what the server holds now (the connection is up again).
    edge_a.up = True
    board.read(REPORT, {**SERVING, "edge-a": {}}, began=time.monotonic())
    status, body = board.answer("edge-a")
    assert (status, body["reasons"]) == (503, ["model counter: version(s) 1 not READY"]), body
    board.read(REPORT, SERVING, began=time.monotonic())
    assert board.answer("edge-a")[0] == 200
    assert gauge(metrics, "triton_gitops_server_serving", "edge-a") == 1


def test_an_answer_asks_the_connection_before_the_drop_is_heard() -> None:
    # The library's event comes milliseconds after the socket closed; a restarted Triton
    # answers, empty, tens of milliseconds after. The answer asks the connection itself.
    metrics, connections = ReconcilerMetrics(), Connections()
    board = ServingBoard(metrics, None, connections.kept)
    connections.kept.to("edge-a", "10.0.0.5:8001")
    connections.kept.to("edge-b", "10.0.0.6:8001")
    board.read(REPORT, SERVING, began=time.monotonic())
    connections.opened[0].up = False  # down, not yet told
    status, body = board.answer("edge-a")
    assert (status, body["reasons"]) == (503, [DROPPED]), (
        f"{status} while the connection its reading went over is down: {body}"
    )
    assert gauge(metrics, "triton_gitops_server_serving", "edge-a") == 0
    assert board.answer(None)[0] == 503 and board.answer("edge-b")[0] == 200


def test_the_watch_keeps_one_connection_per_server_and_hears_only_the_current_one() -> None:
    connections = Connections()
    kept = connections.kept
    first = kept.to("edge-a", "10.0.0.5:8001")
    assert kept.to("edge-a", "10.0.0.5:8001") is first and kept.up("edge-a")
    moved = kept.to("edge-a", "10.0.0.7:8001")  # another address: another connection
    assert moved is not first and first.closed and not moved.closed
    first.drop()  # the replaced connection's own end is not the server's
    assert connections.heard == []
    moved.drop()
    assert connections.heard == ["edge-a"] and not kept.up("edge-a")
    kept.to("edge-b", "10.0.0.6:8001")
    kept.keep_only(["edge-b"])  # edge-a left the pass
    assert moved.closed and not kept.up("edge-a") and kept.up("edge-b")
    assert [c.closed for c in connections.opened] == [True, True, False]
