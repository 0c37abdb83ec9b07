"""Test model: OUTPUT0 = INPUT0 * version, so every answer tells which version served it.

The fixture copies this file into every version folder. Version 9 fails in initialize, a real
version that Triton refuses to load.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

BROKEN_VERSIONS = {9}


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])
        if self.version in BROKEN_VERSIONS:
            raise RuntimeError(f"version {self.version} is broken on purpose")

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            output = pb_utils.Tensor("OUTPUT0", (data * self.version).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
