"""The pure functions: manifests to DesiredState, (desired, serving, history) to
Plan, figures to verdicts, results to records. No I/O, no clock: values in, values out."""
