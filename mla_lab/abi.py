"""kernels/mla_launch.h's MlaProblem as a ctypes structure, to ask a step's library questions
(`mla_takes`, `mla_workspace_bytes`) without launching anything."""

from __future__ import annotations

import ctypes

MLA_FLOAT32, MLA_BFLOAT16 = 0, 1  # MlaDtype


class MlaProblem(ctypes.Structure):
    _fields_ = [*((name, ctypes.c_void_p) for name in ("hidden", "w_down", "w_up_k", "w_up_v", "out")),
                *((name, ctypes.c_int64) for name in ("tokens", "d_model", "rank", "heads", "head_dim")),
                ("dtype", ctypes.c_int), ("workspace", ctypes.c_void_p), ("prepared", ctypes.c_void_p)]


def problem_of(hidden, w_down, w_up_k, w_up_v, heads: int, out=None) -> MlaProblem:
    """The problem the binding would pass for these tensors (out: its address, or none yet)."""
    width = w_up_k.shape[-1]
    dtype = MLA_FLOAT32 if str(hidden.dtype) == "torch.float32" else MLA_BFLOAT16
    return MlaProblem(hidden.data_ptr(), w_down.data_ptr(), w_up_k.data_ptr(), w_up_v.data_ptr(),
                      out.data_ptr() if out is not None else None, hidden.numel() // max(hidden.shape[-1], 1),
                      hidden.shape[-1], w_down.shape[-1], heads, width // heads, dtype, None, None)
