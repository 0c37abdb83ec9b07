"""The gRPC channel options of the reconciler's clients to Triton (``adapters/triton.py``)."""

from __future__ import annotations

import tritonclient.grpc as triton_grpc

# tritonclient's own channel options (message sizes, keepalive), plus a bound on gRPC's
# reconnect backoff (1 s up to 120 s by default): a client kept from pass to pass must find a
# restarted server within a second, not minutes after it came back.
_KEEPALIVE = triton_grpc.KeepAliveOptions()
_CHANNEL = [
    ("grpc.max_send_message_length", triton_grpc.MAX_GRPC_MESSAGE_SIZE),
    ("grpc.max_receive_message_length", triton_grpc.MAX_GRPC_MESSAGE_SIZE),
    ("grpc.keepalive_time_ms", _KEEPALIVE.keepalive_time_ms),
    ("grpc.keepalive_timeout_ms", _KEEPALIVE.keepalive_timeout_ms),
    ("grpc.keepalive_permit_without_calls", _KEEPALIVE.keepalive_permit_without_calls),
    ("grpc.http2.max_pings_without_data", _KEEPALIVE.http2_max_pings_without_data),
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# A connection kept to notice a restart (``keep_connection``) must not be closed for want of
# calls: gRPC drops a channel's connection after 30 minutes without one, which would read
# as a restart during a long pass (the watch reads nothing while a pass runs). INT_MAX
# turns that timer off.
_KEPT_CHANNEL = [*_CHANNEL, ("grpc.client_idle_timeout_ms", 2**31 - 1)]


def channel_options(keep_connection: bool) -> list[tuple[str, object]]:
    """A kept client's (the service's, ``keep_connection``) or a one-shot client's."""
    return list(_KEPT_CHANNEL if keep_connection else _CHANNEL)
