"""The comparator that a router mirrors live requests to (issue 31): a gRPC server speaking
the KServe v2 inference protocol (``inference.GRPCInferenceService/ModelInfer`` and
``ModelStreamInfer``, the definitions tritonclient ships) and, where it is given an HTTP
address, an HTTP/1.1 listener for copies of Triton's ``generate_stream`` requests
(server-sent events: ``adapters/comparator_http.py``), run inside the reconciler's own
process while a traffic rollout's shadow phase lasts.

Why in the process and not a process of its own: what to compare (which model, which
versions, which servers) and what it found are the running rollout's, and its verdict is
an analysis check of that rollout; in the process they are a method call each way, with
nothing to start, find, version or keep alive beside the reconciler. It binds
``--comparator-listen`` (and ``--comparator-http-listen``) only while a shadow phase runs
(the router mirrors nothing to it otherwise), reaches the servers' gRPC ports (and, for the
SSE copies, their declared HTTP ports), and runs wherever the reconciler runs, the image
included.

Each mirrored request is answered at once with an empty response (the router discards
mirrored answers anyway), then, when sampled, compared on a worker thread of its own: the
serving version asked twice (primary and secondary: the noise) and the candidate once, each
pinned by version, in random order, one call after another so that their latencies are
measured alike (``core/comparison.py`` judges the answers). A copy of a gRPC stream asks
each side by a stream of its own, an SSE copy by a ``generate_stream`` of its own, each
read to its end and reassembled into one answer (``comparator_calls``): the same
comparison, counted in the same figures. Bounded as the probes are: at
most ``rate`` comparisons a second, a server kept busy at most ``maxShare`` of the time, a
short queue (a full queue drops, counted). Nothing here can reach a client: a request that
does not parse, an answer that cannot be compared, a candidate that times out are counted
and shown, never raised.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from reconciler.adapters.comparator_calls import Generation
from reconciler.adapters.comparator_http import GenerationListener, NotCompared
from reconciler.adapters.shadow_session import Channels, Observer, ShadowSession
from reconciler.model.shadow import ShadowTarget

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"


class ComparatorError(RuntimeError):
    """The comparator could not listen where it was told to."""


class LiveComparator:
    """The comparator at ``listen`` (host:port; port 0 picks one) and, with ``http_listen``,
    its HTTP listener for SSE copies there: it listens while at least one session is open
    (``begin``), and stops when the last one ends."""

    def __init__(
        self, listen: str, observer: Observer | None = None, http_listen: str | None = None
    ) -> None:
        self.listen, self.http_listen = listen, http_listen
        self._observer: Observer = observer or (lambda _deployment, _outcome: None)
        self._lock = threading.Lock()
        self._sessions: list[ShadowSession] = []
        self._server: grpc.Server | None = None
        self._http: GenerationListener | None = None
        self._channels = Channels()
        self.port: int | None = None

    def observe(self, observer: Observer) -> None:
        """Count every outcome with ``observer`` from the next session on."""
        self._observer = observer

    @property
    def address(self) -> str:
        host = self.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    @property
    def http_port(self) -> int | None:
        """The HTTP listener's port while it listens."""
        return self._http.port if self._http is not None else None

    def begin(self, target: ShadowTarget) -> ShadowSession:
        """Compare ``target`` from now on; ComparatorError when the comparator cannot
        listen (the address taken, not this host's)."""
        with self._lock:
            if self._server is None:
                self._server = self._start()  # first: a failure leaves no session behind
                try:
                    self._http = self._start_http()
                except ComparatorError:
                    self._server.stop(grace=None)
                    self._server = None
                    raise
            session = ShadowSession(target, self._channels, self._observer, self._ended)
            self._sessions.append(session)
        return session

    def _start(self) -> grpc.Server:
        server = grpc.server(
            ThreadPoolExecutor(max_workers=4, thread_name_prefix="comparator"),
            handlers=[
                grpc.method_handlers_generic_handler(
                    SERVICE,
                    {
                        "ModelInfer": grpc.unary_unary_rpc_method_handler(
                            self._mirrored,
                            request_deserializer=None,  # raw bytes: parsed here, counted
                            response_serializer=service_pb2.ModelInferResponse.SerializeToString,
                        ),
                        # Envoy mirrors a bidirectional gRPC stream too (measured, 1.40).
                        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
                            self._mirrored_stream,
                            request_deserializer=None,
                            response_serializer=(
                                service_pb2.ModelStreamInferResponse.SerializeToString
                            ),
                        ),
                    },
                )
            ],
        )
        try:
            port = server.add_insecure_port(self.listen)
        except RuntimeError as exc:
            raise ComparatorError(f"comparator: cannot listen on {self.listen}: {exc}") from None
        if not port:
            raise ComparatorError(f"comparator: cannot listen on {self.listen}")
        self.port = port
        server.start()
        log.info("comparator: listening on %s", self.address)
        return server

    def _start_http(self) -> GenerationListener | None:
        if self.http_listen is None:
            return None
        listener = GenerationListener(self.http_listen, self._offered_copy)
        try:
            listener.start()
        except (OSError, ValueError) as exc:
            raise ComparatorError(
                f"comparator: cannot listen on {self.http_listen} (HTTP): {exc}"
            ) from None
        log.info("comparator: listening on %s for SSE copies", listener.listen)
        return listener

    def _offered_copy(self, copy: Generation | NotCompared) -> None:
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            if isinstance(copy, Generation):
                session.offer_generation(copy)
            else:
                session.not_compared(copy)

    def _mirrored(self, raw: bytes, context: grpc.ServicerContext) -> Any:
        request = self._offered(raw, streamed=False)
        # The router discards a mirrored request's answer: an empty one, at once.
        if request is None:
            return service_pb2.ModelInferResponse()
        return service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)

    def _mirrored_stream(self, raws: Iterator[bytes], context: grpc.ServicerContext) -> Any:
        """A mirrored stream: each request in it offered, nothing answered (the router
        discards a mirror's answers); it ends when the client's side does."""
        for raw in raws:
            self._offered(raw, streamed=True)
        return iter(())

    def _offered(self, raw: bytes, streamed: bool) -> service_pb2.ModelInferRequest | None:
        with self._lock:
            sessions = list(self._sessions)
        try:
            request = service_pb2.ModelInferRequest.FromString(raw)
        except DecodeError as exc:
            for session in sessions:
                session.unparsable(f"not a ModelInferRequest ({len(raw)} bytes): {exc}")
            return None
        for session in sessions:
            session.offer(request, streamed)
        return request

    def _ended(self, session: ShadowSession) -> None:
        with self._lock:
            if session in self._sessions:
                self._sessions.remove(session)
            if self._sessions or self._server is None:
                return
            server, self._server = self._server, None
            http, self._http = self._http, None
        server.stop(grace=0.5).wait(2)
        if http is not None:
            http.stop()
        log.info("comparator: stopped listening on %s", self.address)

    def close(self) -> None:
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            session.end()
        self._channels.close()
