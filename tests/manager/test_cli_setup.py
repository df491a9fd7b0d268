"""``mp-manager setup`` and ``reset-password`` run as real processes (interop.md 1.3, 7.1)."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from tests.helpers.manager import (
    ADMIN_PASSWORD,
    MANAGER_BIN,
    login,
    manager_env,
    running_manager,
    setup_super_admin,
)

pytestmark = pytest.mark.e2e


def cli(args: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MANAGER_BIN), *args],
        input=stdin,
        env=manager_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_setup_creates_the_first_super_admin_once(tmp_path: Path) -> None:
    data_dir = tmp_path / "new" / "manager"
    done = setup_super_admin(data_dir)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((data_dir / "manager.db").stat().st_mode) == 0o600
    again = setup_super_admin(data_dir, "another", "Another-passw0rd")
    assert again.returncode == 1
    assert "a user already exists" in again.stderr
    assert "Another-passw0rd" not in again.stderr + again.stdout


def test_setup_strips_crlf_and_the_user_can_log_in(tmp_path: Path) -> None:
    data_dir = tmp_path / "manager"
    done = cli(["setup", "--data-dir", str(data_dir), "--username", "ops", "--password-stdin"], "Crlf-passw0rd\r\n")
    assert done.returncode == 0, done.stderr
    with running_manager(tmp_path) as manager, manager.client() as c:
        r = login(c, "ops", "Crlf-passw0rd")
        assert r.status_code == 200
        assert r.json()["user"]["role"] == "super_admin"


@pytest.mark.parametrize(
    ("username", "password", "words"),
    [
        ("bad name", "Good-passw0rd", "username"),
        ("good", "short1A", "8-128"),
        ("good", "nouppercase1", "upper-case"),
    ],
)
def test_setup_applies_the_policy_without_echoing(tmp_path: Path, username: str, password: str, words: str) -> None:
    done = setup_super_admin(tmp_path / "manager", username, password)
    assert done.returncode == 2
    assert words in done.stderr
    assert password not in done.stderr + done.stdout
    assert not (tmp_path / "manager" / "manager.db").exists()


def test_password_stdin_needs_a_username(tmp_path: Path) -> None:
    done = cli(["setup", "--data-dir", str(tmp_path / "m"), "--password-stdin"], "Good-passw0rd\n")
    assert done.returncode == 2
    assert "--username" in done.stderr


def test_setup_prompts_for_the_username_without_flags(tmp_path: Path) -> None:
    # The username prompt reads stdin; the hidden password prompt needs a terminal, so it is
    # only exercised when there is none (click then reads stdin too, with a warning).
    done = cli(["setup", "--data-dir", str(tmp_path / "m")], "prompted\nPrompt-passw0rd\nPrompt-passw0rd\n")
    assert done.returncode == 0, done.stderr
    assert "created the super_admin prompted" in done.stdout
    assert "Prompt-passw0rd" not in done.stdout + done.stderr


def test_reset_password_sets_it_and_refuses_an_unknown_user(tmp_path: Path) -> None:
    data_dir = tmp_path / "manager"
    assert setup_super_admin(data_dir).returncode == 0
    unknown = cli(
        ["reset-password", "--data-dir", str(data_dir), "--username", "ghost", "--password-stdin"], "New-passw0rd1\n"
    )
    assert unknown.returncode == 1
    assert "no user has this username" in unknown.stderr
    done = cli(
        ["reset-password", "--data-dir", str(data_dir), "--username", "root", "--password-stdin"], "New-passw0rd1\n"
    )
    assert done.returncode == 0, done.stderr
    with running_manager(tmp_path) as manager, manager.client() as c:
        assert login(c, "root", ADMIN_PASSWORD).status_code == 401
        assert login(c, "root", "New-passw0rd1").status_code == 200


def test_reset_password_without_a_data_dir_exits_1(tmp_path: Path) -> None:
    done = cli(
        ["reset-password", "--data-dir", str(tmp_path / "none"), "--username", "root", "--password-stdin"],
        "New-passw0rd1\n",
    )
    assert done.returncode == 1
    assert "does not exist" in done.stderr


def test_an_unsupported_database_url_exits_2_without_echoing_it(tmp_path: Path) -> None:
    url = "mysql://user:Hunter2-secret@db/x"
    args = ["setup", "--data-dir", str(tmp_path / "m"), "--database-url", url, "--username", "u", "--password-stdin"]
    done = cli(args, "Good-passw0rd\n")
    assert done.returncode == 2
    assert "--database-url: unsupported database scheme" in done.stderr
    assert "Hunter2-secret" not in done.stderr + done.stdout
    env = manager_env(MEDIAPLANE_DATABASE_URL=url)
    served = subprocess.run(
        [str(MANAGER_BIN), "serve", "--data-dir", str(tmp_path / "s"), "--listen-addr", "127.0.0.1", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert served.returncode == 2
    assert "database" in served.stderr.lower()
    assert "Hunter2-secret" not in served.stderr + served.stdout
