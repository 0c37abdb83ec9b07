"""What one config read costs the reconciler's process (issue 46's cold one-shot pass): the
client CPU and wall time of Triton's ModelConfig call against one simulated Triton 2.51
instance (``bench.fleet``'s), made four ways side by side in one run:

- tritonclient's ``get_model_config`` (what ``adapters/triton.py`` calls), blocking;
- the raw gRPC stub, blocking;
- the raw stub's ``future()``, 100 in flight at a time;
- ``grpc.aio``, 100 gathered at a time;

and ``json_format.MessageToDict`` of the answer (the adapter's conversion to the config the
planner compares). CPU is this process's (``time.process_time``), so the simulated server's
own CPU is not in it. Then the adapter's own reads (``adapters.triton_configs.read_configs``,
32 in flight to a server) of 100 configs from each of ``--servers`` simulated instances, on
8 threads as a pass observes them: what one config costs over many channels at once.

With ``--http``, whether a real tritonserver (2.51) answers HTTP/1.1 requests pipelined on
one connection (``GET /v2/models/echo/config`` twice, sent together): the one cheaper way
to ask for many configs that Triton's APIs leave, since neither API has a call for all of
a server's configs.

    python -m bench.config_calls [--calls 2000] [--servers 100] [--http]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import tritonclient.grpc as triton_grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2, service_pb2_grpc

from bench.fleet import Group, SimulatedFleet, fleet_addresses, model_names
from reconciler.adapters.triton_configs import read_configs

MODELS = 100


def _line(name: str, cpu: float, wall: float | None, calls: int) -> None:
    text = f"{name}: {cpu / calls * 1e6:.0f} us CPU a call"
    if wall is not None:
        text += f", {wall / calls * 1e6:.0f} us wall"
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--servers", type=int, default=100)
    parser.add_argument("--http", action="store_true")
    args = parser.parse_args(argv)
    calls = args.calls
    names = model_names(MODELS)
    requests = [service_pb2.ModelConfigRequest(name=n) for n in names]
    with tempfile.TemporaryDirectory(prefix="bench-config-calls-") as scratch:
        addresses = fleet_addresses(1, 13)
        fleet = SimulatedFleet([Group("pool", addresses, tuple(names))], 1, Path(scratch))
        fleet.start()
        try:
            target = f"{addresses[0]}:{fleet.port}"
            client = triton_grpc.InferenceServerClient(url=target)
            client.get_model_config(names[0])
            cpu, wall = time.process_time(), time.perf_counter()
            for i in range(calls):
                client.get_model_config(names[i % MODELS], client_timeout=10)
            _line("tritonclient get_model_config", time.process_time() - cpu,
                  time.perf_counter() - wall, calls)  # fmt: skip
            client.close()

            channel = grpc.insecure_channel(target)
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            answer = stub.ModelConfig(requests[0])
            cpu, wall = time.process_time(), time.perf_counter()
            for i in range(calls):
                stub.ModelConfig(requests[i % MODELS], timeout=10)
            _line("raw stub, blocking", time.process_time() - cpu,
                  time.perf_counter() - wall, calls)  # fmt: skip
            cpu, wall = time.process_time(), time.perf_counter()
            for start in range(0, calls, MODELS):
                futures = [
                    stub.ModelConfig.future(requests[i % MODELS], timeout=10)
                    for i in range(start, start + MODELS)
                ]
                for future in futures:
                    future.result()
            _line("raw stub, future() x100", time.process_time() - cpu,
                  time.perf_counter() - wall, calls)  # fmt: skip
            channel.close()

            async def gathered() -> None:
                async with grpc.aio.insecure_channel(target) as aio_channel:
                    aio = service_pb2_grpc.GRPCInferenceServiceStub(aio_channel)
                    await aio.ModelConfig(requests[0])
                    cpu, wall = time.process_time(), time.perf_counter()
                    for start in range(0, calls, MODELS):
                        await asyncio.gather(*[
                            aio.ModelConfig(requests[i % MODELS], timeout=10)
                            for i in range(start, start + MODELS)
                        ])  # fmt: skip
                    _line("grpc.aio, gather x100", time.process_time() - cpu,
                          time.perf_counter() - wall, calls)  # fmt: skip

            asyncio.run(gathered())
            cpu = time.process_time()
            for _ in range(calls):
                json_format.MessageToDict(answer.config, preserving_proto_field_name=True)
            _line("MessageToDict of the answer", time.process_time() - cpu, None, calls)
        finally:
            fleet.stop()
    _across_servers(args.servers, names)
    if args.http:
        _pipelined_http()
    return 0


def _across_servers(servers: int, names: list[str]) -> None:
    """The adapter's ``read_configs`` over ``servers`` instances, 8 at a time."""
    with tempfile.TemporaryDirectory(prefix="bench-config-calls-") as scratch:
        addresses = fleet_addresses(servers, 13)
        fleet = SimulatedFleet([Group("pool", addresses, tuple(names))], 1, Path(scratch))
        fleet.start()
        channels = [grpc.insecure_channel(f"{a}:{fleet.port}") for a in addresses]
        try:
            stubs = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in channels]
            for stub in stubs:  # connected before the clock starts, as a pass's clients are
                stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), timeout=10)
            fleet_cpu = fleet.cpu_seconds()
            cpu, wall = time.process_time(), time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                read = list(pool.map(lambda stub: read_configs(stub, names, 10.0), stubs))
            total = servers * len(names)
            used, took = time.process_time() - cpu, time.perf_counter() - wall
            _line(f"read_configs, {servers} servers x {len(names)}, 8 threads", used, took, total)
            served = (fleet.cpu_seconds() - fleet_cpu) / total
            print(f"  the simulated servers' CPU: {served * 1e6:.0f} us a call", flush=True)
            failed = sum(isinstance(v, Exception) for answers in read for v in answers.values())
            assert not failed, f"{failed} config read(s) failed"
        finally:
            for channel in channels:
                channel.close()
            fleet.stop()


def _pipelined_http() -> None:
    """Two config requests sent together on one connection to a real tritonserver: how many
    answers come back within 5 s."""
    from testkit.local_triton import LocalTriton
    from testkit.manifests import write_model_repository

    with tempfile.TemporaryDirectory(prefix="bench-config-calls-") as scratch:
        repository = write_model_repository(Path(scratch) / "models")
        server = LocalTriton(repository, log_file=Path(scratch) / "triton.log").start()
        try:
            with triton_grpc.InferenceServerClient(server.grpc_address) as client:
                client.load_model("echo")
            host, port = server.http_address.rsplit(":", 1)
            request = b"GET /v2/models/echo/config HTTP/1.1\r\nHost: triton\r\n\r\n"
            with socket.create_connection((host, int(port)), timeout=5) as connection:
                connection.sendall(request * 2)
                received = b""
                try:
                    while received.count(b"HTTP/1.1 200") < 2:
                        chunk = connection.recv(1 << 16)
                        if not chunk:
                            break
                        received += chunk
                except TimeoutError:
                    pass
            answered = received.count(b"HTTP/1.1 200")
            print(f"HTTP/1.1 pipelining, 2 config requests on one connection: {answered} "
                  "answered within 5 s", flush=True)  # fmt: skip
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
