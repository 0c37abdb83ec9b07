"""Test sequence model: OUTPUT0 = running sum of INPUT0 within the sequence * version.

State is kept per sequence (Triton's CORRID control input) in this model instance, and reset
by the sequence's first request (START). A request of a sequence this version never saw start
(for instance one that moved to a newly loaded version mid-sequence) sums from zero, so the
client sees a wrong running sum: a broken sequence is detectable. The fixture copies this file
into versions 1 and 2.

Config parameters (string values; "version:value" entries name versions, "1:1,2:1"):
  scale       multiply by this instead of the version
  fail_later  "1": answer every request but a sequence's START with an error response (a
              version that breaks sequences midway; Triton 2.51 counts such an answer a
              success, so only its clients, and the probes' sequences, see it)
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


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
        self.sums = {}  # correlation ID -> running sum of INPUT0
        # The config parameter ``scale`` ("2", or by version "1:1,2:1") replaces the version
        # as the multiplier: versions that answer alike, for the shadow comparison's tests.
        parameters = json.loads(args["model_config"]).get("parameters", {})
        scale = _for_version(parameters.get("scale", {}).get("string_value"), self.version)
        self.scale = float(scale) if scale else float(self.version)
        fail = _for_version(parameters.get("fail_later", {}).get("string_value"), self.version)
        self.fail_later = fail == "1"

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            sequence = int(corrid.reshape(-1)[0])
            if float(start.reshape(-1)[0]):
                self.sums[sequence] = 0.0
            elif self.fail_later:
                error = pb_utils.TritonError(f"version {self.version} lost sequence {sequence}")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            self.sums[sequence] = self.sums.get(sequence, 0.0) + float(data.reshape(-1).sum())
            output = np.array([self.sums[sequence] * self.scale], dtype=np.float32)
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", output)])
            )
        return responses
