"""``andon resume DIR --model X "PROMPT"``: a follow-up after the options is the prompt, as it is
after ``andon run``'s options (argparse alone called it an unrecognized argument)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.support import env, records, run, script

pytestmark = pytest.mark.timeout(60)


def test_a_prompt_after_the_options_of_resume_is_its_follow_up(tmp_path: Path) -> None:
    model = script(tmp_path / "s.json", [{"text": "Done."}])
    session = tmp_path / "s"
    environ = env(ANDON_HOME=str(tmp_path / "home"))
    first = run(
        "run", "--model", model, "--session", str(session), "hi", cwd=tmp_path, environ=environ
    )
    assert first.returncode == 0, first.stderr
    again = run("resume", str(session), "--model", model, "again", cwd=tmp_path, environ=environ)
    assert again.returncode == 0, again.stderr
    said = [
        r["data"]["message"]["content"] for r in records(session) if r["type"] == "user/message"
    ]
    assert said == ["hi", "again"]


def test_words_beyond_the_prompt_are_still_refused(tmp_path: Path) -> None:
    done = run("resume", str(tmp_path), "--model", "script:x", "a", "b", cwd=tmp_path)
    assert done.returncode == 2 and "unrecognized arguments: a b" in done.stderr, done.stderr
