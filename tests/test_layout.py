"""The layout rules `make lint` enforces, and the protocols' production users."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import check_sizes

from connectors.local import LocalFolderConnector, sample_space_dir
from pipeline.protocols import SourceConnector


def test_size_check_names_long_modules_and_functions(tmp_path: Path) -> None:
    pkg = tmp_path / "pipeline"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(check_sizes.MAX_FUNCTION_LINES))
    (pkg / "long_function.py").write_text(
        f"def too_long():\n{body}\n    return 0\n\n\ndef short():\n    return 1\n"
    )
    (pkg / "big.py").write_text("\n".join(f"y{i} = {i}" for i in range(check_sizes.MAX_MODULE_LINES + 5)))
    (pkg / "fine.py").write_text("def ok():\n    return 1\n")
    found = check_sizes.problems(tmp_path)
    assert any(p.startswith("pipeline/long_function.py:1: too_long is") for p in found)
    assert any(p.startswith("pipeline/big.py:") and "lines (max" in p for p in found)
    assert not any("fine.py" in p or "short" in p for p in found)


def test_the_repository_passes_its_own_size_check() -> None:
    assert check_sizes.problems(Path(__file__).resolve().parent.parent) == []


def test_the_folder_connector_is_a_source_connector() -> None:
    assert isinstance(LocalFolderConnector([sample_space_dir()]), SourceConnector)
