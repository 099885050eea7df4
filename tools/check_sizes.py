"""Fail when a module or function outgrows what one reader holds in mind.

Limits (the style guide's): a module at most ``MAX_MODULE_LINES`` lines, a function or method at most
``MAX_FUNCTION_LINES`` lines (decorators and docstring included). Tests, benchmarks and generated data are
not checked. Run by ``make lint``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50
PACKAGES = ("pipeline", "bot", "connectors", "evident")


def problems(root: Path) -> list[str]:
    out: list[str] = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            rel = path.relative_to(root)
            lines = text.count("\n") + 1
            if lines > MAX_MODULE_LINES:
                out.append(f"{rel}: {lines} lines (max {MAX_MODULE_LINES})")
            for node in ast.walk(ast.parse(text, filename=str(rel))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    length = (node.end_lineno or node.lineno) - first + 1
                    if length > MAX_FUNCTION_LINES:
                        out.append(
                            f"{rel}:{node.lineno}: {node.name} is {length} lines (max {MAX_FUNCTION_LINES})"
                        )
    return out


def main() -> int:
    found = problems(Path(__file__).resolve().parent.parent)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
