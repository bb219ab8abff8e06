"""The layering the code relies on: engines never import methods (issue #14).

Methods and the pipeline build on the engines (``contamray.engines.wire`` holds the wire types
``Sampling``, ``Request``, ``Output``); an engine module that imported ``contamray.methods`` would tie
every engine (and the Ray Serve deployment that hosts it) to every method's dependencies. Imports are
read with ``ast`` (module-level and lazy ones inside functions, absolute and relative), and checked
once more at run time in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINES = REPO / "contamray" / "engines"
FORBIDDEN = "contamray.methods"


def module_name(path: Path) -> str:
    """``contamray/engines/hf.py`` -> ``contamray.engines.hf`` (a package's ``__init__`` -> the package)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the text of ``module``) may import, anywhere in the file.

    ``from a import b`` counts as ``a`` and ``a.b`` (``b`` may be a submodule); relative imports are
    resolved against ``module``'s package.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def is_forbidden(name: str) -> bool:
    return name == FORBIDDEN or name.startswith(FORBIDDEN + ".")


def test_the_import_reader_catches_every_form_of_importing_methods():
    source = (
        "import os\n"
        "from contamray.engines.wire import Sampling\n"
        "def lazy():\n"
        "    from ..methods.base import Request\n"
    )
    found = imported_modules(source, "contamray.engines.x")
    assert {"os", "contamray.engines.wire", "contamray.methods.base"} <= found
    assert {m for m in found if is_forbidden(m)} == {"contamray.methods.base", "contamray.methods.base.Request"}
    for bad in ("import contamray.methods.base as b", "from contamray import methods", "from .. import methods",
                "from contamray.methods.closed import min_k"):
        assert any(is_forbidden(m) for m in imported_modules(bad, "contamray.engines.x")), bad
    for fine in ("from contamray import engines", "import contamray.methodsx", "from . import wire"):
        assert not any(is_forbidden(m) for m in imported_modules(fine, "contamray.engines.x")), fine


@pytest.mark.parametrize("path", sorted(ENGINES.rglob("*.py")), ids=lambda p: p.name)
def test_no_engine_module_imports_methods(path: Path):
    module = module_name(path)
    found = imported_modules(path.read_text(), module, is_package=path.name == "__init__.py")
    assert not sorted(m for m in found if is_forbidden(m)), f"{module} imports {FORBIDDEN}"


def test_importing_the_engines_loads_no_method_module():
    code = (
        "import sys\n"
        "import contamray.engines, contamray.engines.wire, contamray.engines.hf, contamray.engines.vllm\n"
        f"print(sorted(m for m in sys.modules if m == {FORBIDDEN!r} or m.startswith({FORBIDDEN + '.'!r})))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_methods_base_re_exports_the_wire_types():
    from contamray.engines import wire
    from contamray.methods import base

    assert (base.Sampling, base.Request, base.Output) == (wire.Sampling, wire.Request, wire.Output)
    request = wire.Request(key="k", record_ids=("a", "b"), kind="generate", text="t",
                           sampling=wire.Sampling(stop=("\n",)), chat=True)
    assert wire.Request.from_row(request.to_row()) == request
    output = wire.Output(key="k", token_logprobs=[-1.5], num_tokens=1, truncated=3)
    assert wire.Output.from_row(output.to_row()) == output
