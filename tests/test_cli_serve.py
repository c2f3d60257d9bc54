"""``sheetplane serve`` as a subprocess: first line, configuration sources, a clean stop."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
import trio

from _serve_helpers import SHEETPLANE, post_action, serving
from sheetplane.cli import build_parser
from sheetplane.gateway.server._command import ConfigurationError, _gateway_config, _worker_argv

TOKEN = "tok-cli-3e4f5a6b"
ENV_TOKEN = "tok-cli-env-7c8d9e0f"
FILE_TOKEN = "tok-cli-file-1a2b3c4d"
SUMMARY = {"tableNamespace": "n"}


async def test_serve_prints_its_address_answers_and_stops(
    database_url: str, tmp_path: Path
) -> None:
    async with serving(
        "--database-url",
        database_url,
        "--token",
        f"{TOKEN}=acme",
        tmp_path=tmp_path,
        env={"SHEETPLANE_GATEWAY_TOKENS": f"{ENV_TOKEN}=globex"},
    ) as served:
        assert served.line.startswith("listening on http://127.0.0.1:")
        assert served.port > 0
        for token in (TOKEN, ENV_TOKEN):
            response = await post_action(served.base_url, token, "runtime_sheet_summary", SUMMARY)
            assert response.status_code == 200
            assert response.json()["total"] == 0
        unknown = await post_action(served.base_url, "tok-x", "runtime_sheet_summary", SUMMARY)
        assert unknown.status_code == 401


async def test_serve_honours_test_faults_only_with_the_flag(
    database_url: str, tmp_path: Path
) -> None:
    for flag, expected in ((), 200), (("--allow-test-faults",), 503):
        async with serving(
            "--database-url", database_url, "--token", f"{TOKEN}=acme", *flag, tmp_path=tmp_path
        ) as served:
            response = await post_action(
                served.base_url,
                TOKEN,
                "runtime_sheet_summary",
                SUMMARY,
                **{"x-sheetplane-test-fault": "runtime_sheet_summary=503"},
            )
            assert response.status_code == expected


async def test_serve_without_a_url_starts_an_embedded_postgres(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SHEETPLANE_DATABASE_URL", raising=False)
    async with serving("--token", f"{TOKEN}=acme", tmp_path=tmp_path) as served:
        assert served.line.startswith("listening on http://")
        response = await post_action(served.base_url, TOKEN, "runtime_sheet_summary", SUMMARY)
        assert response.status_code == 200


async def test_serve_refuses_a_malformed_token_without_echoing_it() -> None:
    result = await trio.run_process(
        [*SHEETPLANE, "serve", "--token", "secret-without-org"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 2
    assert b"TOKEN=ORG" in result.stderr
    assert b"secret-without-org" not in result.stderr + result.stdout


def _password(database_url: str) -> str:
    password = psycopg.conninfo.conninfo_to_dict(database_url).get("password")
    assert password, "the test database URL carries a password"
    return str(password)


async def test_secrets_from_files_stay_out_of_the_process_list(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHEETPLANE_DATABASE_URL", raising=False)
    url_file = tmp_path / "database-url"
    url_file.write_text(f"{database_url}\n")
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"# executor tokens\n\n{FILE_TOKEN}=acme\n  {TOKEN}=globex  \n")
    async with serving(
        "--database-url-file", str(url_file), "--tokens-file", str(tokens_file), tmp_path=tmp_path
    ) as served:
        for token in (FILE_TOKEN, TOKEN):
            response = await post_action(served.base_url, token, "runtime_sheet_summary", SUMMARY)
            assert response.status_code == 200
        # What ps shows: the whole command line of the running gateway.
        cmdline = (await trio.Path(f"/proc/{served.process.pid}/cmdline").read_bytes()).decode()
        for secret in (_password(database_url), FILE_TOKEN, TOKEN):
            assert secret not in cmdline
        assert "warning" not in served.stderr()


async def test_secrets_on_the_command_line_are_warned_about_without_echoing(
    database_url: str, tmp_path: Path
) -> None:
    async with serving(
        "--database-url", database_url, "--token", f"{TOKEN}=acme", tmp_path=tmp_path
    ) as served:
        stderr = served.stderr()
    assert "warning: --token puts executor tokens in the process list" in stderr
    assert "warning: --database-url puts a password in the process list" in stderr
    for secret in (_password(database_url), TOKEN):
        assert secret not in stderr


async def test_serve_help_lists_every_configuration_source() -> None:
    result = await trio.run_process(
        [*SHEETPLANE, "serve", "--help"], capture_stdout=True, check=True
    )
    text = result.stdout.decode()
    for name in (
        "--database-url ",
        "--database-url-file",
        "--token ",
        "--tokens-file",
        "SHEETPLANE_DATABASE_URL",
        "SHEETPLANE_GATEWAY_TOKENS",
    ):
        assert name in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--database-url", "postgresql://x", "--database-url-file", "/nonexistent"), b"not both"),
        (("--database-url-file", "/nonexistent/url"), b"--database-url-file: cannot read"),
        (("--tokens-file", "/nonexistent/tokens"), b"--tokens-file: cannot read"),
    ],
)
async def test_serve_refuses_a_bad_configuration_source(
    args: tuple[str, ...], message: bytes
) -> None:
    result = await trio.run_process(
        [*SHEETPLANE, "serve", *args], capture_stdout=True, capture_stderr=True, check=False
    )
    assert result.returncode == 2
    assert message in result.stderr


async def test_a_malformed_tokens_file_line_is_named_by_number_only(tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("tok-fine=acme\nsecret-without-org\n")
    result = await trio.run_process(
        [*SHEETPLANE, "serve", "--tokens-file", str(tokens_file)],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 2
    assert b"--tokens-file line #2 must have the form TOKEN=ORG" in result.stderr
    assert b"secret-without-org" not in result.stderr


def test_org_db_connections_reaches_the_config_and_every_worker_and_must_be_positive() -> None:
    """``--org-db-connections N`` sets the org connection budget (default: derived)."""
    secrets = {"tokens": {}, "database_url": "postgresql://gw@127.0.0.1/db", "metrics_token": None}
    default = build_parser().parse_args(["serve"])
    assert _gateway_config(default, secrets, ()).session_max_connections_per_org is None
    args = build_parser().parse_args(["serve", "--org-db-connections", "7"])
    assert _gateway_config(args, secrets, ()).session_max_connections_per_org == 7
    argv = _worker_argv(args, 3)
    assert argv[argv.index("--org-db-connections") + 1] == "7"
    zero = build_parser().parse_args(["serve", "--org-db-connections", "0"])
    with pytest.raises(ConfigurationError, match="session_max_connections_per_org"):
        _gateway_config(zero, secrets, ())
