"""`mp completion bash|zsh|fish`: the bash script, sourced, completes `mp fl<TAB>` to `flow`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MP_DIR = str(Path(sys.executable).parent)


def complete(words: str, cword: int, env: dict[str, str]) -> list[str]:
    script = (
        "source <(mp completion bash)\n"
        f"COMP_WORDS=({words})\n"
        f"COMP_CWORD={cword}\n"
        "_mp_completion mp\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**env, "PATH": MP_DIR + os.pathsep + env.get("PATH", "")}
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_commands_and_subcommands(cli_env: dict[str, str]) -> None:
    assert complete("mp fl", 1, cli_env) == ["flow"]
    assert complete("mp flow st", 2, cli_env) == ["start", "stop"]
    assert complete("mp c", 1, cli_env) == ["completion", "config"]
    assert "--watch" in complete("mp stats --w", 2, cli_env)


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_each_shell_gets_its_script(shell: str, cli_env: dict[str, str]) -> None:
    done = subprocess.run(
        [str(Path(MP_DIR) / "mp"), "completion", shell], env=cli_env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stderr == ""
    assert "_MP_COMPLETE" in done.stdout
    assert {"bash": "complete -o default -F", "zsh": "compdef", "fish": "complete --command mp"}[shell] in done.stdout
