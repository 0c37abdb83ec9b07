"""Hostile webhook traffic against the real ``triton-gitops run``: replays (also after a
restart), oversized bodies (declared and chunked), malformed and smuggling-shaped framing,
wrong signatures and slowloris connections are refused, and passes, /healthz and honest
webhooks keep working meanwhile.

The connection caps are checked in-process (``Daemon.start_http``), where they can be set low;
the replay memory is checked with an injected clock.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import json
import re
import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.model.settings import RunSettings, Settings
from reconciler.model.source import Source
from reconciler.service.daemon import Daemon
from reconciler.service.framing import BadRequest, BodyTooLarge, read_chunked
from reconciler.service.webhooks import DeliveryMemory
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import ManifestRepo, deployment_doc
from testkit.service_process import Service, wait_until
from tests.integration.flows import ready_versions
from tests.integration.test_daemon import SECRET, echo_service

GITLAB_TOKEN = "gitlab-t0ken-value"
LIMIT = 1 << 20  # RunSettings.max_body_bytes, the default the service runs with
HEAD = b"POST /webhook/github HTTP/1.1\r\nHost: x\r\n"


def signed(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def exchange(port: int, request: bytes, timeout: float = 30.0) -> bytes:
    """Send ``request`` whole and read the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> int:
    """The status of a POST; waits as long as the server takes (it may queue a webhook)."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    answer = exchange(
        port,
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode()
        + body,
    )
    return int(answer.split(b" ", 2)[1])


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


def metric(service: Service, name: str, **labels: str) -> float:
    """One sample of the service's /metrics (0 when absent)."""
    _, text = service.get("/metrics")
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = "(?m)^" + re.escape(name + (f"{{{wanted}}}" if labels else "")) + r" (\S+)$"
    found = re.search(pattern.encode(), text)
    return float(found.group(1)) if found else 0.0


def webhook_requests(service: Service, source: str) -> int:
    """Passes a webhook of ``source`` asked for (logged before the webhook is answered)."""
    return sum(
        e.get("message") == "pass requested" and e.get("trigger") == f"webhook {source}"
        for e in service.events()
    )


@pytest.fixture
def hostile(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> Iterator[Service]:
    workdir = tmp_path / "service"
    workdir.mkdir()
    (workdir / "gitlab-token").write_text(GITLAB_TOKEN)
    extra = ("--gitlab-token-file", str(workdir / "gitlab-token"))
    with echo_service(manifests, triton, model_repository, workdir, extra) as running:
        wait_until(lambda: running.passes() >= 1, 30, "the first pass is logged")
        yield running


# -- the replay memory, with an injected clock ------------------------------------------------


def test_delivery_memory_refuses_within_the_window_and_forgets_after() -> None:
    now = [0.0]
    memory = DeliveryMemory(window=60, capacity=100, clock=lambda: now[0])
    assert memory.first_sighting(["sig:a", "id:1"])
    now[0] = 59
    assert not memory.first_sighting(["sig:a", "id:2"])  # same body, new id: a replay
    assert not memory.first_sighting(["sig:b", "id:1"])  # same id, new body: a replay
    assert memory.first_sighting(["sig:b", "id:2"])  # the refused ones were not remembered
    now[0] = 60.5
    assert memory.first_sighting(["sig:a", "id:1"])  # past the window: forgotten


def test_delivery_memory_is_bounded() -> None:
    memory = DeliveryMemory(window=3600, capacity=50, clock=lambda: 0.0)
    for n in range(1000):
        assert memory.first_sighting([f"id:{n}"])
    assert len(memory) == 50
    assert not memory.first_sighting(["id:999"])
    assert memory.first_sighting(["id:0"])  # the oldest were forgotten first


def test_chunked_bodies_are_decoded_and_capped_before_the_chunk_is_read() -> None:
    assert read_chunked(io.BytesIO(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n"), 5) == b"abcde"
    stream = io.BytesIO(b"4\r\nabcd\r\n400000\r\n" + b"z" * 100)
    with pytest.raises(BodyTooLarge):
        read_chunked(stream, 1000)
    assert stream.read() == b"z" * 100  # the oversized chunk itself was never read
    with pytest.raises(BadRequest):
        read_chunked(io.BytesIO(b"5\r\nab"), 1000)


# -- against the real service ------------------------------------------------------------


def test_replayed_deliveries_are_refused_also_after_a_restart(hostile: Service) -> None:
    port = hostile.port
    body = json.dumps({"ref": "refs/heads/main", "after": "1" * 40}).encode()
    headers = {"X-Hub-Signature-256": signed(body), "X-GitHub-Event": "push"}
    first = {**headers, "X-GitHub-Delivery": "d-1"}
    assert post(port, "/webhook/github", body, first) == 202
    assert post(port, "/webhook/github", body, first) == 409  # the same delivery again
    # A replayer can change the unsigned delivery id, not the signed body.
    assert post(port, "/webhook/github", body, {**headers, "X-GitHub-Delivery": "d-2"}) == 409
    # "pass requested" is logged before the answer: no later line can come from these.
    assert webhook_requests(hostile, "github") == 1
    assert metric(hostile, "triton_gitops_webhooks_total", source="github", result="replayed") == 2

    gitlab = {"X-Gitlab-Token": GITLAB_TOKEN, "X-Gitlab-Event": "Push Hook"}
    assert post(port, "/webhook/gitlab", b"{}", {**gitlab, "X-Gitlab-Event-UUID": "u-1"}) == 202
    assert post(port, "/webhook/gitlab", b"{}", {**gitlab, "X-Gitlab-Event-UUID": "u-1"}) == 409
    # GitLab's token does not sign the body, but the same body under a new UUID is the
    # same delivery replayed: caught by the body's digest.
    assert post(port, "/webhook/gitlab", b"{}", {**gitlab, "X-Gitlab-Event-UUID": "u-2"}) == 409
    assert post(port, "/webhook/gitlab", b"{ }", {**gitlab, "X-Gitlab-Event-UUID": "u-2"}) == 202
    assert webhook_requests(hostile, "gitlab") == 2
    refusals = [e for e in hostile.events() if e.get("reason") == "replayed"]
    assert len(refusals) == 4 and all(e["message"] == "webhook refused" for e in refusals)

    # The same state store, a new process: what the last one saw is refused still.
    hostile.stop()
    hostile.start()
    port = hostile.port
    assert post(port, "/webhook/github", body, first) == 409
    assert post(port, "/webhook/github", body, {**headers, "X-GitHub-Delivery": "d-3"}) == 409
    assert post(port, "/webhook/gitlab", b"{}", {**gitlab, "X-Gitlab-Event-UUID": "u-1"}) == 409
    assert post(port, "/webhook/gitlab", b"{ }", {**gitlab, "X-Gitlab-Event-UUID": "u-3"}) == 409
    other = body.replace(b"1", b"2")
    assert post(port, "/webhook/github", other, {"X-Hub-Signature-256": signed(other)}) == 202
    assert webhook_requests(hostile, "github") == 2 and webhook_requests(hostile, "gitlab") == 2


# A signed body, so that a request the server wrongly accepted would trigger a pass.
SIGNED_BODY = b'{"ref": "refs/heads/main", "after": "5555555555555555555555555555555555555555"}'
SIGNED = b"POST /webhook/github HTTP/1.1\r\nHost: x\r\nX-Hub-Signature-256: %s\r\n" % (
    signed(SIGNED_BODY).encode()
)
SIZE = b"%x" % len(SIGNED_BODY)
CHUNKED = SIZE + b"\r\n" + SIGNED_BODY + b"\r\n0\r\n\r\n"
LENGTH = b"%d" % len(SIGNED_BODY)
TE = b"Transfer-Encoding: chunked\r\n"
# A second request after the first: a server that framed the first differently from a proxy
# in front of it would answer this one too (a smuggled request).
SMUGGLED = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"

# (what, request, status): each is outside RFC 9112 or this server's bounds.
MALFORMED = [
    ("chunk size 0x..", SIGNED + TE + b"\r\n0x" + CHUNKED, 400),
    ("chunk size with _", SIGNED + TE + b"\r\n" + SIZE[:1] + b"_" + CHUNKED[1:], 400),
    ("chunk size with +", SIGNED + TE + b"\r\n+" + CHUNKED, 400),
    ("chunk size after a space", SIGNED + TE + b"\r\n " + CHUNKED, 400),
    ("chunk size of 18 digits", SIGNED + TE + b"\r\n" + b"0" * 16 + CHUNKED, 400),
    ("empty chunk extension", SIGNED + TE + b"\r\n" + SIZE + b";" + CHUNKED[len(SIZE) :], 400),
    ("chunk without its CRLF", SIGNED + TE + b"\r\n" + CHUNKED.replace(b"}\r\n0", b"}0"), 400),
    ("malformed trailer", SIGNED + TE + b"\r\n" + CHUNKED[:-2] + b"no colon\r\n\r\n", 400),
    ("33 trailers", SIGNED + TE + b"\r\n" + CHUNKED[:-2] + b"T: 1\r\n" * 33 + b"\r\n", 400),
    ("Content-Length +n", SIGNED + b"Content-Length: +" + LENGTH + b"\r\n\r\n" + SIGNED_BODY, 400),
    ("Content-Length 0x..", SIGNED + b"Content-Length: 0x%x\r\n\r\n" % len(SIGNED_BODY), 400),
    (
        "Content-Length twice",
        SIGNED
        + b"Content-Length: %s\r\nContent-Length: %s\r\n\r\n" % (LENGTH, LENGTH)
        + SIGNED_BODY,
        400,
    ),
    ("Content-Length n, n", SIGNED + b"Content-Length: %s, %s\r\n\r\n" % (LENGTH, LENGTH), 400),
    ("Content-Length and chunked", SIGNED + b"Content-Length: 4\r\n" + TE + b"\r\n" + CHUNKED, 400),
    ("chunked twice over", SIGNED + TE + b"Transfer-Encoding: identity\r\n\r\n" + CHUNKED, 501),
    ("gzip, chunked", SIGNED + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + CHUNKED, 501),
    ("chunked in HTTP/1.0", SIGNED.replace(b"1.1", b"1.0") + TE + b"\r\n" + CHUNKED, 400),
    ("folded Transfer-Encoding", SIGNED + b"Transfer-Encoding:\r\n chunked\r\n\r\n" + CHUNKED, 400),
    (
        "Content-Length behind a bare CR",
        SIGNED + b"X-Note: a\rContent-Length: " + LENGTH + b"\r\n\r\n" + SIGNED_BODY,
        400,
    ),
    ("space before the colon", SIGNED + b"Transfer-Encoding : chunked\r\n\r\n" + CHUNKED, 400),
    (
        "bare LF line ends",
        (SIGNED + b"Content-Length: " + LENGTH + b"\r\n\r\n").replace(b"\r\n", b"\n") + SIGNED_BODY,
        400,
    ),
    (
        "two spaces in the request line",
        SIGNED.replace(b"POST ", b"POST  ") + TE + b"\r\n" + CHUNKED,
        400,
    ),
    ("a GET with a body", b"GET /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\nGET /", 400),
]


def exchange_once(port: int, request: bytes) -> tuple[bytes, bool]:
    """Send ``request`` and read the answer: (answer, whether the server closed the connection
    within 3 s; its request deadline is 5 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as conn:
        conn.sendall(request)
        answer = b""
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except TimeoutError:
            return answer, False
    return answer, True


def test_malformed_and_smuggling_framing_is_refused_and_closed(hostile: Service) -> None:
    port = hostile.port
    wrong = []
    for what, request, status in MALFORMED:
        answer, closed = exchange_once(port, request + SMUGGLED)
        answers = len(re.findall(rb"(?m)^HTTP/1\.[01] \d{3} ", answer))
        if (status_of(answer), answers, closed) != (status, 1, True):
            wrong.append((what, answer[:60], closed))
    assert wrong == []
    assert webhook_requests(hostile, "github") == 0  # nothing triggered
    refused = metric(hostile, "triton_gitops_http_connections_refused_total", reason="malformed")
    refused += metric(hostile, "triton_gitops_webhooks_total", source="github", result="malformed")
    assert refused == len(MALFORMED)
    # Still serving, and the refused requests left no trace in the replay memory: the same
    # signed body, framed well (an upper-case size, a quoted chunk extension, a trailer), is
    # accepted once.
    framed = SIZE.upper() + b' ; name="a \\" b"\r\n' + SIGNED_BODY + b"\r\n0\r\nT: 1\r\n\r\n"
    answer, closed = exchange_once(port, SIGNED + b"Transfer-Encoding: Chunked\r\n\r\n" + framed)
    assert (status_of(answer), closed) == (202, True)
    assert webhook_requests(hostile, "github") == 1
    assert hostile.get("/healthz")[0] == 200


def test_wrongly_signed_webhooks_are_refused(hostile: Service) -> None:
    port = hostile.port
    body = b'{"ref": "refs/heads/main"}'
    for headers in (
        {"X-Hub-Signature-256": signed(body, "not-the-secret")},
        {"X-Hub-Signature-256": signed(body + b" ")},  # signed another body
        {"X-Hub-Signature-256": "sha1=" + hashlib.sha1(body).hexdigest()},
        {},
    ):
        assert post(port, "/webhook/github", body, headers) == 401
    assert post(port, "/webhook/gitlab", body, {"X-Gitlab-Token": "wrong"}) == 401
    assert post(port, "/reconcile", body, {"Authorization": "Bearer wrong"}) == 401
    # Unknown routes are not counted: a label per path would grow without bound.
    assert post(port, "/webhook/made-up", body, {}) == 404
    assert post(port, "/reconcile?token=x", body, {}) == 404
    assert b"made-up" not in hostile.get("/metrics")[1]
    assert webhook_requests(hostile, "github") + webhook_requests(hostile, "gitlab") == 0
    assert metric(hostile, "triton_gitops_webhooks_total", source="github", result="unauthorized")
    log = hostile.log.read_text()
    assert SECRET not in log and GITLAB_TOKEN not in log


class Dribbler:
    """Slow clients: each sends its start, then one byte every ``pause`` seconds, forever;
    records which ones the server has closed."""

    def __init__(self, port: int, starts: list[bytes], pause: float = 0.5) -> None:
        self.conns = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in starts]
        for conn, start in zip(self.conns, starts, strict=True):
            conn.sendall(start)
        self.closed: set[int] = set()
        self.pause = pause
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.pause):
            for n, conn in enumerate(self.conns):
                if n in self.closed:
                    continue
                try:
                    # poll, not select: select() takes no descriptor past 1,023, which a
                    # test process running many files side by side can reach (a CI run did).
                    poller = select.poll()
                    poller.register(conn, select.POLLIN)
                    readable = poller.poll(0)
                    if readable and not conn.recv(65536):
                        self.closed.add(n)  # the server closed it
                        continue
                    conn.sendall(b"x")
                except OSError:
                    self.closed.add(n)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for conn in self.conns:
            conn.close()


def test_slowloris_connections_are_cut_off_while_passes_and_health_go_on(
    hostile: Service, manifests: ManifestRepo, triton: LocalTriton
) -> None:
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
    manifests.commit("echo 2")
    # 20 slow bodies (more than the 16 webhook reads allowed at once) and 4 slow headers;
    # each sends a byte every half second, so no per-recv timeout would ever fire.
    slow = Dribbler(
        hostile.port,
        [HEAD + b"Content-Length: 100000\r\n\r\n"] * 20 + [HEAD + b"X-Slow: "] * 4,
    )
    try:
        assert hostile.get("/healthz")[0] == 200
        reads = metric(hostile, "triton_gitops_webhook_reads_in_progress")
        assert 0 < reads <= 16
        body = json.dumps({"ref": "refs/heads/main", "after": "2" * 40}).encode()
        # Queued behind the slow bodies until one is cut off, within its own deadline.
        assert post(hostile.port, "/webhook/github", body, {"X-Hub-Signature-256": signed(body)})
        wait_until(lambda: ready_versions(triton, "echo") == {2}, 60, "the pushed commit serves")
        wait_until(lambda: len(slow.closed) == 24, 60, "the server closes every slow client")
    finally:
        slow.close()
    assert webhook_requests(hostile, "github") == 1
    assert metric(hostile, "triton_gitops_http_connections_refused_total", reason="timeout") >= 4
    timeouts = metric(hostile, "triton_gitops_webhooks_total", source="github", result="timeout")
    busy = metric(hostile, "triton_gitops_webhooks_total", source="github", result="busy")
    assert timeouts + busy == 20
    assert hostile.get("/healthz")[0] == 200


# -- the caps, set low in-process -----------------------------------------------------------


@pytest.fixture
def capped(manifests: ManifestRepo, tmp_path: Path) -> Iterator[Daemon]:
    daemon = Daemon(
        Source(manifests.url),
        Settings(cache_dir=tmp_path / "cache", state_path=tmp_path / "state.db"),
        RunSettings(
            listen=f"127.0.0.1:{free_port()}",
            github_secret=SECRET,
            read_timeout=8.0,
            max_connections=6,
            max_webhook_reads=2,
        ),
    )
    with http_side(daemon):
        yield daemon


@contextlib.contextmanager
def http_side(daemon: Daemon) -> Iterator[int]:
    """Only the service's HTTP side, in this process, while the block runs: its port."""
    daemon.start_http()
    assert daemon.http is not None
    try:
        yield int(daemon.http.server_address[1])
    finally:
        daemon.http.shutdown()
        daemon.http.server_close()


def answer_unasked(port: int) -> bytes:
    """What the server says to a connection that sends nothing (it never reads one over
    the cap: it answers and closes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_webhook_reads_and_connections_are_capped(capped: Daemon) -> None:
    listener = capped.http
    assert listener is not None
    port = int(listener.server_address[1])
    registry = capped.metrics.registry

    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    def reading() -> float:
        return sample("triton_gitops_webhook_reads_in_progress")

    slow = Dribbler(port, [HEAD + b"Content-Length: 1000\r\n\r\n"] * 4)
    try:
        # Two bodies are read; the other two wait for a slot within their own deadline.
        wait_until(lambda: reading() == 2, 30, "two slow bodies are being read")
        # Six connections at once: the four slow ones and this one leave one free.
        assert status_of(exchange(port, b"GET /healthz HTTP/1.0\r\n\r\n")) == 200
        # Its thread gives its slot back just after the answer: on a busy machine, later
        # than the client has read it (then the first idle connection below was refused).
        wait_until(lambda: listener.connections_open == 4, 30, "the /healthz slot is free")
        idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2)]
        wait_until(lambda: listener.connections_open == 6, 30, "both idle ones hold a slot")
        try:
            # All six taken: the next connection is answered 503 at once, its request unread.
            assert status_of(answer_unasked(port)) == 503
            assert reading() == 2
        finally:
            for conn in idle:
                conn.close()
        wait_until(lambda: len(slow.closed) == 4, 60, "every slow client is cut off")
    finally:
        slow.close()
    assert reading() == 0
    assert sample("triton_gitops_http_connections_refused_total", reason="busy") >= 1
    timeouts = sample("triton_gitops_webhooks_total", source="github", result="timeout")
    busy = sample("triton_gitops_webhooks_total", source="github", result="busy")
    assert timeouts + busy == 4
    assert status_of(exchange(port, b"GET /healthz HTTP/1.0\r\n\r\n")) == 200
