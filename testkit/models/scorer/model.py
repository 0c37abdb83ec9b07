"""Test model for the pre-merge gate: OUTPUT0 = INPUT0 * 2, each request taking about 3 ms
(a sleep, so that its latency stands well above the client's own overhead and the ratios the
gate judges are the model's, not the machine's noise).

The input and output names are the ones the config declares, as in echo. Versions:
  1, 2  good, alike
  3     three times slower (about 9 ms a request)
  4     loads, and fails every request (raises: Triton counts the failures)
  5     holds a 256 MiB buffer from load on (touched, so resident)
  6     good, alike 1 and 2 (the head of a change that renames the output in its config)
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

SLOW, FAILING, HEAVY = 3, 4, 5
BASE_SECONDS = 0.003


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])
        config = json.loads(args["model_config"])
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]
        self.seconds = BASE_SECONDS * (3 if self.version == SLOW else 1)
        self.buffer = np.ones(256 << 20, dtype=np.uint8) if self.version == HEAVY else None

    def execute(self, requests):
        responses = []
        for request in requests:
            if self.version == FAILING:
                raise pb_utils.TritonModelException("version 4 fails every request")
            data = pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
            time.sleep(self.seconds)
            output = pb_utils.Tensor(self.output_name, (data * 2).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
