"""Test model with the vLLM backend's inputs and outputs, so that standard LLM benchmark
clients (AIPerf's ``kserve_v2_infer`` endpoint, perf_analyzer ``--streaming``) can drive it:
``text_input`` (the prompt), ``stream`` (BOOL: one response per token, else one response
with the whole text), ``sampling_parameters`` (a JSON string: ``max_tokens``, default 16),
``exclude_input_in_output`` (BOOL); ``text_output``. A decoupled model, as the vLLM backend
always is, ending each request with Triton's final flag.

No language model: token i of a prompt is a word picked by (the prompt's byte sum + i), the
same for every good version, so a comparison of two versions' generations agrees. Config
parameter ``token_ms``: milliseconds between two tokens (default 0). Versions that misbehave
on purpose, as a real engine can:
  3  answers every request with an error
  5  sends its first token 300 ms late (a slow prefill)
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FAILING, SLOW_FIRST = 3, 5
WORDS = ("the", "model", "serves", "a", "stream", "of", "tokens", "to", "each", "client")


def _optional(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.token_delay = float(parameters.get("token_ms", {}).get("string_value") or 0) / 1000
        self.first_delay = 0.3 if self.version == SLOW_FIRST else 0.0

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            if self.version == FAILING:
                error = pb_utils.TritonError(f"version {self.version} fails every request")
                sender.send(
                    pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            prompt = _text(_optional(request, "text_input", b""))
            streaming = bool(_optional(request, "stream", False))
            exclude = bool(_optional(request, "exclude_input_in_output", False))
            sampling = json.loads(_text(_optional(request, "sampling_parameters", b"{}")) or "{}")
            count = int(sampling.get("max_tokens", 16))
            start = sum(prompt.encode())
            words = [WORDS[(start + i) % len(WORDS)] for i in range(count)]
            if streaming:
                for i, word in enumerate(words):
                    time.sleep(self.first_delay if i == 0 else self.token_delay)
                    piece = np.array([(" " if i else "") + word], dtype=np.object_)
                    output = pb_utils.Tensor("text_output", piece)
                    sender.send(pb_utils.InferenceResponse(output_tensors=[output]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            time.sleep(self.first_delay + self.token_delay * max(count - 1, 0))
            text = " ".join(words) if exclude else " ".join([prompt, *words]).strip()
            output = pb_utils.Tensor("text_output", np.array([text], dtype=np.object_))
            sender.send(
                pb_utils.InferenceResponse(output_tensors=[output]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
