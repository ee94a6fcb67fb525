"""MLA's low-rank KV projection as a KernelBench-format problem file, loadable by path.

`Model`, `get_inputs()` and `get_init_inputs()` are the problem (toy size, fp32); `ModelNew` runs
one course step, chosen by the environment variable MLA_LAB_STEP (a step number or name; default
shared_latent). Evaluate any candidate file against it with
    python -m mla_lab kernelbench path/to/candidate.py
"""

import os

from mla_lab.kernelbench import Model, get_init_inputs, get_inputs, model_new

ModelNew = model_new(os.environ.get("MLA_LAB_STEP", "shared_latent"))

__all__ = ["Model", "ModelNew", "get_init_inputs", "get_inputs"]
