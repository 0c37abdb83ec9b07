"""Test model: OUTPUT0 = INPUT0 * version, so every answer tells which version served it.

The input and output names are the ones the model's config declares (INPUT0 and OUTPUT0 in
config.pbtxt), so a load whose config renames the output serves a different interface, and the
ensemble ``chain`` can feed one echo-like model into another.

The fixture copies this file into every version folder. Some versions misbehave on purpose,
each in a way the reconciler must catch:
  3  loads and answers, x3 (wrong for a smoke case that expects x2)
  4  fails 40% of its requests
  5  answers correctly but 25 ms late (several times slower), or as many milliseconds late
     as the config's parameter ``slow_ms`` says
  6  keeps 8 MB of memory per request, up to 1.5 GB (a leak)
  7  takes 3 s to initialize (a slow load), or as many seconds as the config's parameter
     ``init_seconds`` says (a load that outlasts the reconciler's load timeout)
  9  fails in initialize: Triton refuses to load it
 10  answers every request with an error response (Triton 2.51 counts those successes)
 11  answers 1% of its requests with an error response
 12, 13  good, but answer an all-zero input with an error response (a model that rejects
     the probes' synthesized requests, old and new alike)

Any version also reads these config parameters (string values), for the shadow tests, where
old and new versions must answer alike:
  scale       multiply by this instead of the version
  skew_every  N: an input whose CRC-32 is a multiple of N is answered 5% off (a wrong answer
              on 1/N of the inputs, the same inputs every time)
  noise       answer each element times (1 + u), u uniform in [-noise, noise], drawn anew
              per request (a nondeterministic kernel)
  flip_every  N: an input whose CRC-32 is a multiple of N is answered with its two highest
              values swapped in each row (the top class flipped, on 1/N of the inputs)
  delay_ms    answer this many milliseconds late
A value may name versions, "1:10,2:20", so that one config makes versions differ (a change
of config reloads every version of the model on a server).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

BROKEN_VERSIONS = {9}
FAILING, SLOW, LEAKING, SLOW_LOAD = 4, 5, 6, 7
ERROR_RESPONSES, RARE_ERROR_RESPONSES, ZEROS_REJECTED = 10, 11, {12, 13}


def _for_version(value, version):
    """A parameter's value for ``version``: the value itself, or its "version:value" entry."""
    if not value or ":" not in value:
        return value
    for entry in value.split(","):
        named, _, given = entry.partition(":")
        if int(named) == version:
            return given
    return None


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])
        config = json.loads(args["model_config"])
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]
        if self.version == SLOW_LOAD:
            import time

            seconds = config.get("parameters", {}).get("init_seconds", {}).get("string_value")
            time.sleep(float(seconds or 3))
        if self.version in BROKEN_VERSIONS:
            raise RuntimeError(f"version {self.version} is broken on purpose")
        self.slow_seconds = 0.025
        if self.version == SLOW:
            slow_ms = config.get("parameters", {}).get("slow_ms", {}).get("string_value")
            self.slow_seconds = float(slow_ms) / 1000 if slow_ms else 0.025
        self.count = 0
        self.kept = []
        parameters = {
            k: _for_version(v.get("string_value"), self.version)
            for k, v in config.get("parameters", {}).items()
        }
        self.scale = float(parameters.get("scale") or self.version)
        self.skew_every = int(parameters.get("skew_every") or 0)
        self.flip_every = int(parameters.get("flip_every") or 0)
        self.noise = float(parameters.get("noise") or 0)
        self.delay = float(parameters.get("delay_ms") or 0) / 1000
        self.random = np.random.default_rng()

    def execute(self, requests):
        responses = []
        for request in requests:
            self.count += 1
            data = pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
            error = None
            if self.version == ERROR_RESPONSES:
                error = f"version 10 answers request {self.count} with an error"
            elif self.version == RARE_ERROR_RESPONSES and self.count % 100 == 7:
                error = f"version 11 answers request {self.count} with an error"
            elif self.version in ZEROS_REJECTED and not data.any():
                error = "an all-zero input is not a valid request"
            if error is not None:
                # The documented per-request error: the client gets it, Triton's counters
                # call the request a success.
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(error)))
                continue
            if self.version == FAILING and self.count % 5 in (1, 3):
                # Raising counts in nv_inference_request_failure; an error response does not
                # (Triton 2.51 counts a Python-backend response carrying an error a success).
                raise RuntimeError(f"version 4 failed request {self.count}")
            if self.version == SLOW:
                import time

                time.sleep(self.slow_seconds)
            if self.version == LEAKING and len(self.kept) < 192:
                self.kept.append(np.full(8 << 20, 1, dtype=np.uint8))  # touched, so resident
            if self.delay:
                import time

                time.sleep(self.delay)
            answer = data * self.scale
            if self.skew_every:
                import zlib

                if zlib.crc32(data.astype(np.float32).tobytes()) % self.skew_every == 0:
                    answer = answer * 1.05
            if self.flip_every and answer.ndim and answer.shape[-1] > 1:
                import zlib

                if zlib.crc32(data.astype(np.float32).tobytes()) % self.flip_every == 0:
                    rows = answer.reshape(-1, answer.shape[-1]).copy()
                    for row in rows:
                        top, second = np.argsort(-row)[:2]
                        row[[top, second]] = row[[second, top]]
                    answer = rows.reshape(answer.shape)
            if self.noise:
                answer = answer * (1 + self.random.uniform(-self.noise, self.noise, data.shape))
            output = pb_utils.Tensor(self.output_name, answer.astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
