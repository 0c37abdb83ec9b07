"""Example Python-backend model: OUTPUT0 = INPUT0 * version, so answers show the version.

The same file serves every version folder; version 3 fails to initialize on purpose, to show
that a version Triton cannot load never replaces the one that serves.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])
        if self.version == 3:
            raise RuntimeError("version 3 cannot find its weights (a deliberately bad release)")

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            output = pb_utils.Tensor("OUTPUT0", (data * self.version).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
