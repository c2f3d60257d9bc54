"""The ``sheetplane`` command as a user meets it: ``--version``, plain help for every
option, the benchmark list, and expected failures as one line on stderr, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sheetplane
from sheetplane.cli import bench_names, build_parser, main

ROOT = Path(__file__).resolve().parents[1]
SHEETPLANE = [sys.executable, "-c", "import sys; from sheetplane.cli import main; sys.exit(main())"]
TOKENS = "tok-cli-5d6e7f80=acme"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SHEETPLANE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env if env is not None else os.environ.copy(),
    )


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"sheetplane {sheetplane.__version__}"


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    parser = build_parser()
    found = [("sheetplane", parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.extend((f"sheetplane {name}", sub) for name, sub in action.choices.items())
    return found


def test_every_option_has_plain_help_text() -> None:
    names = []
    for name, parser in _parsers():
        names.append(name)
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{name} {'/'.join(action.option_strings) or action.dest}"
        text = parser.format_help()
        for markup in ("``", "**", ":class:", ":func:", ":mod:"):
            assert markup not in text, f"{name} --help shows {markup!r}"
    assert {"sheetplane demo", "sheetplane serve", "sheetplane conformance"} <= set(names)


def test_bench_with_no_name_lists_the_benchmarks_and_the_readme_lists_the_same(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench"]) == 0
    listed = re.findall(r"^  (\w+)\s", capsys.readouterr().out, re.M)
    assert listed == bench_names()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    paragraph = readme[readme.index("- **Benchmarks**") :].split("\n- ", 1)[0]
    runs_one = paragraph[paragraph.index("runs one:") : paragraph.index("(`sheetplane bench NAME")]
    assert sorted(re.findall(r"`(\w+)`", runs_one)) == bench_names()


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_serve_on_a_taken_port_says_so_in_one_line_before_starting_postgres() -> None:
    env = {
        **{k: v for k, v in os.environ.items() if k != "SHEETPLANE_DATABASE_URL"},
        "SHEETPLANE_GATEWAY_TOKENS": TOKENS,
    }
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = run("serve", "--port", str(port), env=env)
    assert done.returncode == 1
    assert _one_line(done) == (
        f"sheetplane serve: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert time.monotonic() - started < 15  # no embedded Postgres was started


def test_serve_with_a_database_it_cannot_reach_says_so_in_one_line() -> None:
    for url in ("postgresql://u:sekret-pw@no-such-host.invalid/db",):
        env = {
            **os.environ,
            "SHEETPLANE_DATABASE_URL": url,
            "SHEETPLANE_GATEWAY_TOKENS": TOKENS,
        }
        done = run("serve", "--port", "0", env=env)
        assert done.returncode == 1
        line = _one_line(done)
        assert line.startswith("sheetplane serve: cannot reach the database: "), line
        assert "sekret-pw" not in done.stdout + done.stderr
        assert "listening" not in done.stdout  # it never listened


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def test_every_benchmark_option_has_plain_help_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sheetplane bench NAME --help`` explains every option of every benchmark."""

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    for name in bench_names():
        module = importlib.import_module(f"sheetplane.bench.{name}")
        with pytest.raises(_Parsed) as parsed:
            module.main([])
        for action in parsed.value.parser._actions:
            if action.help != argparse.SUPPRESS:
                assert action.help, f"bench {name} {'/'.join(action.option_strings)}"
        text = parsed.value.parser.format_help()
        assert "``" not in text and "**" not in text, f"bench {name} --help shows markup"
