"""An embedded index's files copied as they are: for backups and restores, under the directory's lease."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

LEASE_FILES = ("lease.*", ".lease.*")


def copy_sparse(src: str, dst: str) -> None:
    """Copy only a file's data extents. Qdrant Edge preallocates large sparse files; a plain copy would
    write (and hash) hundreds of MB of zeros for a small index."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fin.fileno(), pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left (or SEEK_DATA unsupported: copy the rest)
                if pos == 0:
                    fin.seek(0)
                    shutil.copyfileobj(fin, fout)
                break
            end = os.lseek(fin.fileno(), start, os.SEEK_HOLE)
            fin.seek(start)
            fout.seek(start)
            remaining = end - start
            while remaining > 0:
                chunk = fin.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                fout.write(chunk)
                remaining -= len(chunk)
            pos = end
        fout.truncate(size)
    shutil.copystat(src, dst)


def copy_index_files(src: Path, dest: Path) -> list[Path]:
    """Copy the index directory ``src`` to ``dest`` (which must not exist), lease files left out; the files
    written, relative to ``dest``."""
    shutil.copytree(
        src, dest, symlinks=False, copy_function=copy_sparse, ignore=shutil.ignore_patterns(*LEASE_FILES)
    )
    return [p.relative_to(dest) for p in sorted(dest.rglob("*")) if p.is_file()]


def swap_in(src: Path, target: Path) -> None:
    """Replace the directory ``target`` with a copy of ``src``: staged beside it, then renamed into place."""
    staging = target.with_name(target.name + ".restoring")
    old = target.with_name(target.name + ".old")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(src, staging, copy_function=copy_sparse)
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
