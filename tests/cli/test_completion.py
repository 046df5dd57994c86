"""``andon completion bash|zsh|fish``: scripts generated from the parser, run in the real shells
(zsh and fish where installed: ``.ci/run`` installs them)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli.support import ANDON

pytestmark = pytest.mark.timeout(60)


def _script(shell: str, tmp_path: Path) -> Path:
    done = subprocess.run([ANDON, "completion", shell], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    path = tmp_path / f"andon.{shell}"
    path.write_text(done.stdout)
    return path


def _bash_offers(script: Path, *words: str) -> list[str]:
    """What bash's completion offers for the command line ``words`` (the last one is being
    typed), as bash calls the function."""
    quoted = " ".join(f"'{w}'" for w in words)
    program = (
        f"source '{script}'; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _andon; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completes_commands_options_and_choices(tmp_path: Path) -> None:
    script = _script("bash", tmp_path)
    assert _bash_offers(script, "andon", "re") == ["repair", "resume"]
    # An option added to the parser is offered without anyone listing it here.
    assert "--workers-in" in _bash_offers(script, "andon", "run", "--work")
    assert _bash_offers(script, "andon", "worker", "--containment", "") == [
        "auto",
        "cgroup",
        "subreaper",
        "pgroup",
    ]
    assert _bash_offers(script, "andon", "keys", "g") == ["generate"]
    assert _bash_offers(script, "andon", "completion", "f") == ["fish"]
    # A value of the user's (a prompt, a path) falls back to files.
    (tmp_path / "notes.txt").write_text("x")
    assert _bash_offers(script, "andon", "log", str(tmp_path / "no")) == [
        str(tmp_path / "notes.txt")
    ]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completes_commands_options_and_choices(tmp_path: Path) -> None:
    script = _script("fish", tmp_path)

    def offers(line: str) -> list[str]:
        done = subprocess.run(
            ["fish", "--no-config", "-c", f"source '{script}'; complete -C '{line}'"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return [row.split("\t")[0] for row in done.stdout.splitlines()]

    assert offers("andon ru") == ["run"]
    assert "--workers-in" in offers("andon run --workers-i")
    assert sorted(offers("andon worker --containment ")) == [
        "auto",
        "cgroup",
        "pgroup",
        "subreaper",
    ]
    assert offers("andon keys ") == ["generate"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_loads_the_script_and_runs_its_completion(tmp_path: Path) -> None:
    script = _script("zsh", tmp_path)
    program = (
        "autoload -U compinit && compinit -u -D; "
        f"source '{script}'; emulate -L sh; "
        "COMP_WORDS=(andon worker --containment ''); COMP_CWORD=3; _andon; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["zsh", "-f", "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.split() == ["auto", "cgroup", "subreaper", "pgroup"]


def test_an_unknown_shell_is_a_usage_error() -> None:
    done = subprocess.run([ANDON, "completion", "tcsh"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "invalid choice: 'tcsh'" in done.stderr, done.stderr
