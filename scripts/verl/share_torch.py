"""Gives a fresh virtualenv the torch of this one (and every package torch needs, CUDA's libraries
included) as hard links, so a second virtualenv with the same torch pin costs no second download,
unpack or byte-compile of ~4.7 GB. Run with the source virtualenv's python:

    .venv/bin/python scripts/verl/share_torch.py .venv-verl

Files inside site-packages are hard-linked (copied where the two trees are on different file
systems); the few scripts outside it (torchrun and the like) are copied with their `#!` line
pointed at the target's python. pip then sees the pins satisfied and never writes into the
source: it replaces a linked package by unlinking, and byte-compiles by rename.
"""

import os
import shutil
import sys
import sysconfig
from importlib.metadata import distribution
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name


def closure(root: str) -> list:
    """The distributions `root` needs here, with the extras its requirements ask for."""
    seen, todo = set(), [(root, "")]
    while todo:
        name, extra = todo.pop()
        name = canonicalize_name(name)
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for line in distribution(name).requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo.append((req.name, ""))
                todo.extend((req.name, e) for e in req.extras)
    return [distribution(n) for n in sorted({n for n, _ in seen})]


def link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() or dst.is_symlink():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: share_torch.py TARGET_VENV", file=sys.stderr)
        return 2
    target = Path(sys.argv[1]).resolve()
    target_python = target / "bin" / "python"
    if not target_python.exists():
        print(f"share_torch: {target} is not a virtualenv (no bin/python)", file=sys.stderr)
        return 2
    source_site = Path(sysconfig.get_paths()["purelib"]).resolve()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    target_site = target / "lib" / version / "site-packages"
    if not target_site.is_dir():
        print(f"share_torch: {target_site} is missing (a virtualenv of another python?)", file=sys.stderr)
        return 2
    source_python = str(Path(sys.prefix) / "bin" / "python")
    dists, files, size = closure("torch"), 0, 0
    for dist in dists:
        for entry in dist.files or []:
            src = Path(dist.locate_file(entry)).resolve()
            if not src.is_file():
                continue
            try:
                rel = src.relative_to(source_site)
            except ValueError:
                rel = None
            if rel is not None:
                link_or_copy(src, target_site / rel)
            else:
                # A console script in the virtualenv's bin/: its #! names the source's python.
                rel = src.relative_to(Path(sys.prefix).resolve())
                dst = target / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                text = src.read_bytes()
                if text.startswith(b"#!") and source_python.encode() in text.split(b"\n", 1)[0]:
                    first, rest = text.split(b"\n", 1)
                    text = first.replace(source_python.encode(), str(target_python).encode()) + b"\n" + rest
                dst.write_bytes(text)
                shutil.copymode(src, dst)
            files += 1
            size += src.stat().st_size
    torch = distribution("torch").version
    print(f"torch {torch} and the {len(dists) - 1} packages it needs ({size / 1e9:.1f} GB, "
          f"{files} files) linked from {sys.prefix} into {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
