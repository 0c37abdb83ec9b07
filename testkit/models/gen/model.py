"""Test model for streaming (decoupled) rollouts: a generator that answers a prompt with a
stream of tokens, one per response, then Triton's final flag.

Token i of a prompt is (sum of the prompt + i) % 1000, the same for every good version, so a
smoke case can expect the generated sequence. The config parameters (string values)
``tokens`` set how many (default 5), ``token_ms`` the milliseconds between two (default 0:
a long generation is many tokens slowly); a request's own parameter ``tokens`` (an integer)
sets how many for that request alone (a long generation among short ones). The fixture
copies this file into every version folder; some versions misbehave on purpose, each as a
real generator can:
  3  answers every request with an error inside the stream
  4  streams two tokens, then an error (a generation that fails midway)
  5  sends its first token 300 ms late, or as many milliseconds as the parameter
     ``first_ms`` says (a slow prefill), then the rest at the usual pace
  6  sends its first token at once and each next one ``slow_ms`` (default 50) later (a
     slow decode)
  7  sends its tokens and never the final flag (a backend that never ends its streams:
     the version stays UNLOADING once unloaded, server#7626)
  8  fails one stream in twenty after two tokens (5% of generations fail midway)
  9  fails in initialize: Triton refuses to load it
  10 generates as the good versions do, except on one prompt in fifty (prompts whose sum is
     a multiple of ``diverge_every``, default 50), whose tokens from position ``diverge_at``
     (default 20) on differ (a candidate that changed the generation a little)
The config parameter ``noise`` (a share, default 0) makes every version nondeterministic
alike, as batched generation is at temperature 0: that share of its streams has one token,
at a random position from 10 on, changed.
"""

import json
import random
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FAILING, FAILS_MIDWAY, SLOW_FIRST, SLOW_DECODE = 3, 4, 5, 6
UNENDING, SOMETIMES_FAILS, BROKEN, DIVERGES = 7, 8, 9, 10
EVERY = 20  # version 8 fails one stream in this many


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])
        if self.version == BROKEN:
            raise RuntimeError(f"version {self.version} is broken on purpose")
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.tokens = int(parameters.get("tokens", {}).get("string_value") or 5)
        self.token_delay = float(parameters.get("token_ms", {}).get("string_value") or 0) / 1000
        first_ms = parameters.get("first_ms", {}).get("string_value")
        self.first_delay = float(first_ms or 300) / 1000 if self.version == SLOW_FIRST else 0.0
        if self.version == SLOW_DECODE:
            slow_ms = parameters.get("slow_ms", {}).get("string_value")
            self.token_delay = float(slow_ms or 50) / 1000
        self.requests = 0
        self.noise = float(parameters.get("noise", {}).get("string_value") or 0)
        self.diverge_at = int(parameters.get("diverge_at", {}).get("string_value") or 20)
        self.diverge_every = int(parameters.get("diverge_every", {}).get("string_value") or 50)
        self.random = random.Random()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
            start = int(prompt.sum())
            tokens = int(json.loads(request.parameters() or "{}").get("tokens", self.tokens))
            if self.version == FAILING:
                error = pb_utils.TritonError(f"version {self.version} fails every request")
                sender.send(
                    pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            self.requests += 1
            midway = self.version == FAILS_MIDWAY or (
                self.version == SOMETIMES_FAILS and self.requests % EVERY == 0
            )
            diverges = (
                self.diverge_at
                if self.version == DIVERGES and start % self.diverge_every == 0
                else None
            )
            noisy = self.random.randrange(10, max(tokens, 11)) if self.noise else None
            if noisy is not None and self.random.random() >= self.noise:
                noisy = None
            for i in range(tokens):
                if i == 0 and self.first_delay:
                    time.sleep(self.first_delay)
                elif i and self.token_delay:
                    time.sleep(self.token_delay)
                if midway and i == 2:
                    error = pb_utils.TritonError(f"version {self.version} failed at token {i}")
                    sender.send(
                        pb_utils.InferenceResponse(error=error),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )
                    break
                value = (start + i) % 1000
                if (diverges is not None and i >= diverges) or i == noisy:
                    value = (value + 500) % 1000
                token = np.array([value], dtype=np.int32)
                output = pb_utils.Tensor("TOKEN", token)
                sender.send(pb_utils.InferenceResponse(output_tensors=[output]))
            else:
                if self.version != UNENDING:
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
