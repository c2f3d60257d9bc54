"""Build the seed's runtime for node: extract it, lay the stand-ins beside it, bundle.

The seed file (``002_c27eafc2708e3093.txt`` in the ``seeds`` folder of a
``shared`` folder, looked for in each ancestor of the repository root in turn;
CI keeps ``shared`` beside the clone) is a diff adding one file, the runtime's
``runtime-api.ts``. :func:`extract_runtime` takes that file out verbatim: every
line after the ``@@ -0,0 +1,N @@`` header is an added line, and its leading
``+`` is dropped. The repository never holds a copy of it; it is written at
test time under ``build/tmp/seed-runtime/`` (ignored by git).

The stand-ins for the modules it imports (``play-runtime/*.ts``,
``plays/*.ts``, written here from its call sites) are laid out beside it as
the runtime's own tree has them, with the interop driver, and esbuild (from
npm) strips the types and bundles the driver with ``pg`` and ``jose`` into one
CommonJS file node 20 runs. The npm packages are installed once per lock file
into ``build/tmp/seed-runtime/npm-<digest>/`` and reused by later runs; a file
lock keeps two pytest workers from installing or bundling at once.

Run it by hand to get the bundle's path: ``python tests/seed_runtime/prepare.py``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
SEED_NAME = "002_c27eafc2708e3093.txt"
SEED_PATH_LINE = "package/dist/repo/shared_libs/play-runtime/runtime-api.ts"
WORK_ROOT = REPO_ROOT / "build" / "tmp" / "seed-runtime"
#: The stand-ins, by their path under ``shared_libs/`` (the runtime's own layout).
STAND_INS = (
    "play-runtime/runtime-pg-driver.ts",
    "play-runtime/static-pipeline-types.ts",
    "play-runtime/db-session.ts",
    "play-runtime/db-session-crypto.ts",
    "play-runtime/dataset-id.ts",
    "plays/dataset.ts",
    "plays/row-identity.ts",
    "play-runtime/interop-driver.ts",
)
NPM_TIMEOUT_S = 300


class SeedUnavailable(Exception):
    """What the interop test needs is not on this machine (the reason is the message)."""


def find_seed(start: Path = REPO_ROOT, name: str = SEED_NAME) -> Path:
    """The seed file ``name`` in the ``seeds`` folder of the ``shared`` folder of the
    first ancestor of ``start`` that has one."""
    for folder in start.parents:
        seeds = folder / "shared" / "seeds"
        if seeds.is_dir():
            seed = seeds / name
            if not seed.is_file():
                raise SeedUnavailable(f"{seeds} has no {name}")
            return seed
    raise SeedUnavailable(f"no parent folder of {start} has a shared seeds folder")


_HUNK = re.compile(r"^@@ -0,0 \+1,(\d+) @@")


def extract_runtime(seed_text: str) -> str:
    """``runtime-api.ts`` exactly as the seed's diff adds it (``ValueError`` if the
    diff is not one added file of the declared length)."""
    lines = seed_text.split("\n")
    if SEED_PATH_LINE not in lines:
        raise ValueError(f"the seed does not add {SEED_PATH_LINE}")
    header = next((i for i, line in enumerate(lines) if line.startswith("@@")), None)
    match = None if header is None else _HUNK.match(lines[header])
    if header is None or match is None:
        raise ValueError("the seed has no '@@ -0,0 +1,N @@' hunk adding one file")
    body = lines[header + 1 :]
    if body and body[-1] == "":
        body.pop()  # the newline that ends the last line
    if any(not line.startswith("+") for line in body):
        raise ValueError("the seed's hunk has a line that is not an added line")
    if len(body) != int(match.group(1)):
        raise ValueError(f"the hunk declares {match.group(1)} lines and holds {len(body)}")
    return "".join(line[1:] + "\n" for line in body)


def node_executable() -> str:
    """node's path (``SeedUnavailable`` when it is not installed)."""
    node = shutil.which("node")
    if node is None:
        raise SeedUnavailable("node is not installed (the seed's runtime runs on node 20)")
    return node


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _digest(*parts: bytes) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(len(part).to_bytes(8, "big"))
        hasher.update(part)
    return hasher.hexdigest()[:16]


def _npm_modules() -> Path:
    """``node_modules`` of the pinned packages, installed once per lock file."""
    lock = (HERE / "package-lock.json").read_bytes()
    folder = WORK_ROOT / f"npm-{_digest((HERE / 'package.json').read_bytes(), lock)}"
    done = folder / ".installed"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        shutil.copy(HERE / "package.json", folder)
        shutil.copy(HERE / "package-lock.json", folder)
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is not installed beside node")
        result = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"npm ci failed: {result.stderr[-2000:]}")
        done.write_text("ok\n")
    return folder / "node_modules"


def build_bundle() -> Path:
    """The driver bundled with the extracted runtime and the stand-ins: a CommonJS
    file for ``node BUNDLE CONFIG.json``. Built once per input (seed, stand-ins,
    lock file); ``SeedUnavailable`` when the seed or node is absent."""
    seed = find_seed()
    node_executable()
    runtime = extract_runtime(seed.read_text(encoding="utf-8"))
    sources = {name: (HERE / name).read_bytes() for name in STAND_INS}
    lock = (HERE / "package-lock.json").read_bytes()
    digest = _digest(runtime.encode(), lock, *(n.encode() + b"\0" + s for n, s in sources.items()))
    bundle = WORK_ROOT / f"bundle-{digest}.cjs"
    with _locked(WORK_ROOT / ".lock"):
        if bundle.exists():
            return bundle
        modules = _npm_modules()
        tree = WORK_ROOT / f"src-{digest}" / "shared_libs"
        shutil.rmtree(tree.parent, ignore_errors=True)
        for name, text in sources.items():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_bytes(text)
        (tree / "play-runtime" / "runtime-api.ts").write_text(runtime, encoding="utf-8")
        partial = bundle.with_suffix(f".{os.getpid()}.tmp")
        result = subprocess.run(
            [
                str(modules / ".bin" / "esbuild"),
                str(tree / "play-runtime" / "interop-driver.ts"),
                "--bundle",
                "--platform=node",
                "--target=node20",
                "--format=cjs",
                "--external:pg-native",
                "--log-level=error",
                f"--outfile={partial}",
            ],
            cwd=modules.parent,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT_S,
            check=False,
            env={**os.environ, "NODE_PATH": str(modules)},
        )
        if result.returncode != 0:
            raise RuntimeError(f"esbuild failed: {result.stderr[-4000:]}")
        partial.rename(bundle)
        return bundle


if __name__ == "__main__":
    try:
        print(build_bundle())
    except SeedUnavailable as exc:
        sys.exit(f"skipped: {exc}")
