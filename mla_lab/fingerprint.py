"""What the measured numbers depend on, as digests that follow the code and not its comments.

A results file records, beside its numbers, a digest of each step's code (its .cu and the course
headers it includes, without comments or layout, and the flags it is built with) and one of the
measuring code (the binding and the Python that checks and times: comments and docstrings left
out). Renaming or moving a file, or rewording a comment, changes none of them; a change to what
runs does. The README's results table compares them with this checkout and names the rows a
change has made stale. `python -m mla_lab sass --against REV` goes further for a kernel edit that
should change nothing: it compares each step's machine code.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

from . import build, steps

PACKAGE_DIR = Path(__file__).resolve().parent
# The Python and C++ that build, call, check and time the kernels (not the reports made afterwards).
MEASURING_CODE = ("abi.py", "bench.py", "build.py", "check.py", "layout.py", "problem.py", "steps.py",
                  "csrc/binding.cpp")
# The rules that pick the step mla_lab.project runs: only project's rows depend on them.
DISPATCHER_CODE = "dispatch.py"

_C_TOKENS = re.compile(r'"(?:\\.|[^"\\])*"' r"|'(?:\\.|[^'\\])*'" r"|//[^\n]*|/\*.*?\*/|\S+", re.S)
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def c_code(text: str) -> str:
    """C/C++/CUDA source without comments, one space between what is left (string literals kept)."""
    return " ".join(token for token in _C_TOKENS.findall(text) if not token.startswith(("//", "/*")))


def python_code(text: str) -> str:
    """Python source as its syntax tree, without docstrings (comments are not in the tree)."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return _tree_text(tree)


def _tree_text(node) -> str:
    """A syntax tree written out the same way by every Python version: `ast.dump` changed between
    3.11, 3.12 and 3.13 (new empty fields, and fields left out when empty), so it is not used, and
    3.12 parses some f-strings with an extra empty piece, which is left out."""
    if isinstance(node, ast.AST):
        fields = [f"{name}={_tree_text(value)}" for name, value in ast.iter_fields(node)
                  if value is not None and value != []]
        if isinstance(node, ast.JoinedStr):
            pieces = [v for v in node.values if not (isinstance(v, ast.Constant) and v.value == "")]
            fields = [f"values={_tree_text(pieces)}"] if pieces else []
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return f"[{','.join(_tree_text(item) for item in node)}]"
    return repr(node)


def _digest(parts: list[str]) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def _with_headers(source: Path, seen: set[Path] | None = None) -> list[Path]:
    """The file and, depth first, every course header it includes (from its folder or kernels/)."""
    seen = set() if seen is None else seen
    files = [source]
    seen.add(source)
    for name in _INCLUDE.findall(source.read_text()):
        for folder in (source.parent, steps.KERNELS_DIR):
            header = (folder / name).resolve()
            if header.exists():
                if header not in seen:
                    files += _with_headers(header, seen)
                break
    return files


def step_code(step: steps.Step) -> str:
    files = _with_headers(step.source("solution"))
    flags = [*build.STEP_CUDA_FLAGS, *step.arch_flags, *(f"-D{d}" for d in step.defines)]
    return _digest([" ".join(flags), *(c_code(path.read_text()) for path in files)])


def measuring_code() -> str:
    parts = []
    for name in MEASURING_CODE:
        text = (PACKAGE_DIR / name).read_text()
        parts.append(python_code(text) if name.endswith(".py") else c_code(text))
    return _digest(parts)


def dispatcher_code() -> str:
    return _digest([python_code((PACKAGE_DIR / DISPATCHER_CODE).read_text())])


def current() -> dict:
    """{"measuring": digest, "dispatcher": digest, "steps": {"1": digest, ...}} for this checkout."""
    return {"measuring": measuring_code(), "dispatcher": dispatcher_code(),
            "steps": {str(s.number): step_code(s) for s in steps.STEPS}}


def short(fingerprint: dict) -> str:
    """One digest for a whole fingerprint (what a notebook's stamp records)."""
    return _digest([json.dumps(fingerprint, sort_keys=True)])


def stale_steps(recorded: dict | None) -> list[int] | None:
    """The steps whose code changed since `recorded` was measured, or None where the measuring
    code changed (or nothing was recorded), which makes every number stale."""
    here = current()
    if not recorded or recorded.get("measuring") != here["measuring"]:
        return None
    return [int(n) for n, digest in here["steps"].items() if recorded.get("steps", {}).get(n) != digest]


def dispatcher_stale(recorded: dict | None) -> bool:
    """Whether mla_lab.project's rules changed since `recorded` was measured (a sweep from before
    they had a digest of their own counts as changed)."""
    return not recorded or recorded.get("dispatcher") != dispatcher_code()
