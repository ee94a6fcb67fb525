"""kernels/mla_launch.h's MlaProblem as a ctypes structure, for tests that call a step's exported
functions directly rather than through the torch binding."""
import ctypes

MLA_FLOAT32, MLA_BFLOAT16 = 0, 1  # MlaDtype


class MlaProblem(ctypes.Structure):
    _fields_ = [*((name, ctypes.c_void_p) for name in ("hidden", "w_down", "w_up_k", "w_up_v", "out")),
                *((name, ctypes.c_int64) for name in ("tokens", "d_model", "rank", "heads", "head_dim")),
                ("dtype", ctypes.c_int), ("workspace", ctypes.c_void_p)]
