"""What one config read costs the reconciler's process (issue 46's cold one-shot pass): the
client CPU and wall time of Triton's ModelConfig call against one simulated Triton 2.51
instance (``bench.fleet``'s), made four ways side by side in one run:

- tritonclient's ``get_model_config`` (what ``adapters/triton.py`` calls), blocking;
- the raw gRPC stub, blocking;
- the raw stub's ``future()``, 100 in flight at a time;
- ``grpc.aio``, 100 gathered at a time;

and ``json_format.MessageToDict`` of the answer (the adapter's conversion to the config the
planner compares). CPU is this process's (``time.process_time``), so the simulated server's
own CPU is not in it.

    python -m bench.config_calls [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import grpc
import tritonclient.grpc as triton_grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2, service_pb2_grpc

from bench.fleet import Group, SimulatedFleet, fleet_addresses, model_names

MODELS = 100


def _line(name: str, cpu: float, wall: float | None, calls: int) -> None:
    text = f"{name}: {cpu / calls * 1e6:.0f} us CPU a call"
    if wall is not None:
        text += f", {wall / calls * 1e6:.0f} us wall"
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    calls = parser.parse_args(argv).calls
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
