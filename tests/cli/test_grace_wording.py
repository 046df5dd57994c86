"""A wrong ``--grace`` is one plain line naming the flag and the rule, the same wherever the
text came from (the flag, ``ANDON_GRACE``, andon.toml) and for ``andon bench`` too (docs/ci.md,
Settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.support import env, run, script

CASES = {
    "-1,2": "--grace: TERM must be a number of seconds >= 0 (got -1)",
    "2,-3": "--grace: KILL must be a number of seconds >= 0 (got -3)",
    "1": "--grace takes TERM,KILL in seconds, e.g. 2,3 (got '1')",
    "1,x": "--grace: KILL must be a number of seconds (got 'x')",
    "1,9999": "--grace: KILL must be a number of seconds from 0 to 3600 (got 9999)",
}


def _line(result: object) -> str:
    stderr: str = result.stderr  # type: ignore[attr-defined]
    assert result.returncode == 2, stderr  # type: ignore[attr-defined]
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "GracePolicy" not in stderr and "term_after" not in stderr
    return stderr.strip()


@pytest.mark.parametrize("text", sorted(CASES))
def test_every_source_words_a_bad_grace_alike(tmp_path: Path, text: str) -> None:
    ok = script(tmp_path / "ok.yaml", [{"text": "ok"}])
    home = str(tmp_path / "home")
    flag = run(
        "run", "--model", ok, f"--grace={text}", "x", cwd=tmp_path, environ=env(ANDON_HOME=home)
    )
    assert _line(flag) == f"andon: {CASES[text]}"
    var = run(
        "run", "--model", ok, "x", cwd=tmp_path, environ=env(ANDON_HOME=home, ANDON_GRACE=text)
    )
    assert _line(var) == f"andon: {CASES[text]} (from ANDON_GRACE)"
    (tmp_path / "andon.toml").write_text(f'grace = "{text}"\n')
    toml = run("run", "--model", ok, "x", cwd=tmp_path, environ=env(ANDON_HOME=home))
    assert _line(toml) == f"andon: {CASES[text]} (from andon.toml)"


def test_bench_words_a_bad_grace_alike(tmp_path: Path) -> None:
    result = run("bench", "--grace=-1,2", cwd=tmp_path, environ=env(ANDON_HOME=str(tmp_path / "h")))
    assert _line(result) == f"andon bench: {CASES['-1,2']}"
