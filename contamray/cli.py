"""``contamray``: the command line.

- ``contamray run [+exp=NAME] [overrides...]``: the same as ``python -m contamray.run``;
- ``contamray methods``: registered detection methods, their family and parameters;
- ``contamray benchmarks``: benchmark adapters with their hub id, config, splits and task type.
"""

from __future__ import annotations

import dataclasses
import sys


def _methods() -> None:
    from contamray.methods.base import get_method, method_names

    for name in method_names():
        method = get_method(name)
        params = ", ".join(
            f"{f.name}={f.default!r}" if f.default is not dataclasses.MISSING else f.name
            for f in dataclasses.fields(method.Config)
        )
        doc = (sys.modules[type(method).__module__].__doc__ or "").strip().splitlines()
        print(f"{name} [{method.family}] {doc[0] if doc else ''}\n    {params}")


def _benchmarks() -> None:
    from contamray.benchmarks import adapter_names, get_adapter

    for name in adapter_names():
        print(get_adapter(name).describe())


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv else "help"
    if command == "run":
        from contamray import run

        sys.argv = ["contamray.run", *argv]
        run.main()
    elif command == "methods":
        _methods()
    elif command == "benchmarks":
        _benchmarks()
    else:
        print(__doc__)
        sys.exit(0 if command in ("help", "-h", "--help") else 2)


if __name__ == "__main__":
    main()
