"""Example Python-backend model: OUTPUT0 = INPUT0 * version, so answers show the version.

The same file serves every version folder. Two versions are bad releases on purpose:
version 3 fails to initialize (Triton cannot load it, so it never replaces the one that
serves), and version 4 loads and passes its smoke case but fails a third of its requests
(the post-swap analysis catches it and the old version serves again).
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])
        if self.version == 3:
            raise RuntimeError("version 3 cannot find its weights (a deliberately bad release)")
        self.count = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.count += 1
            if self.version == 4 and self.count % 3 == 0:
                raise RuntimeError("version 4 lost its connection to the feature store")
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            output = pb_utils.Tensor("OUTPUT0", (data * self.version).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
