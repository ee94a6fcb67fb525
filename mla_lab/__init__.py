"""MLA Lab: support code for the course (problem, layout, build, check, bench, grade)."""

from . import bench, build, check, layout, plots, problem, steps
from .build import gpu_ready, setup_report
from .grade import grade
from .problem import PRESETS, TOY, V2_LITE, V3, V3_TP8, Shape, make_inputs, oracle, preset, reference

__all__ = [
    "PRESETS", "TOY", "V2_LITE", "V3", "V3_TP8", "Shape", "bench", "build", "check", "grade",
    "gpu_ready", "layout", "make_inputs", "oracle", "plots", "preset", "problem", "reference",
    "setup_report", "steps",
]
