"""Process identity lives in one module: ``andon.procs`` is the only code that reads
``/proc/<pid>/stat`` or sends a signal to a process found by a number. Anything else that did would
be a second, unchecked way to touch a stranger."""

from __future__ import annotations

import re
from pathlib import Path

import andon

SRC = Path(andon.__file__).parent
HOME = SRC / "procs.py"

FORBIDDEN = {
    "reads /proc/<pid>/stat": re.compile(r"/stat\b"),
    "pidfd_send_signal": re.compile(r"pidfd_send_signal"),
    "os.kill / os.killpg": re.compile(r"\bos\.kill(pg)?\("),
    "psutil.Process": re.compile(r"psutil\.Process\("),
}
# ``Popen.send_signal``/``kill``/``terminate`` stay allowed: they only ever signal the caller's
# own child while it is unreaped, whose pid cannot have been reused.


def test_only_procs_names_and_signals_processes() -> None:
    offences = []
    benchmarks = SRC.parent.parent / "benchmarks"
    for path in sorted([*SRC.rglob("*.py"), *benchmarks.glob("*.py")]):
        if path == HOME:
            continue
        rel = path.relative_to(SRC if SRC in path.parents else benchmarks.parent).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            for what, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    offences.append(f"{rel}:{n}: {what}: {line.strip()}")
    assert offences == []


def test_the_check_sees_an_offence() -> None:
    assert FORBIDDEN["os.kill / os.killpg"].search("    os.killpg(pgid, signal.SIGKILL)")
    assert FORBIDDEN["reads /proc/<pid>/stat"].search('open(f"/proc/{pid}/stat")')
    assert HOME.is_file() and "def stat(" in HOME.read_text()


# -- outside bytes become text in one place (docs/log-format.md, Text) ------------------------

TEXT_HOME = SRC / "base" / "_text.py"
DECODING = re.compile(
    r"""\.decode\([^)]*["'](replace|ignore|surrogateescape|surrogatepass|backslashreplace)["']"""
    r"""|\berrors=["'](?!strict)|\bfsdecode\("""
)
# Each other use, and why it is not a second rule for outside text.
DECODING_ALLOWED = {
    # A file's bytes held as escapes on purpose: read_file and grep pass each line through
    # clean_text; edit_file writes the bytes it did not edit back exactly.
    "workers/_builtins.py": 3,
    # A model's JSON text: its \u escapes are UTF-16 code units, not bytes (split pairs joined).
    "llm/_wire.py": 1,
}


def decoding_sites(root: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if path == TEXT_HOME:
            continue
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if DECODING.search(line):
                found.setdefault(path.relative_to(root).as_posix(), []).append(f"{n}: {line}")
    return found


def test_outside_bytes_are_decoded_only_by_the_text_rule() -> None:
    found = decoding_sites(SRC)
    offences = [
        f"{rel}:{site}"
        for rel, sites in found.items()
        if len(sites) != DECODING_ALLOWED.get(rel, 0)
        for site in sites
    ]
    assert offences == [], "use andon.base.clean_text / name_path, or say why here"


def test_the_decoding_check_sees_an_offence() -> None:
    assert DECODING.search('text = data.decode("utf-8", "replace")')
    assert DECODING.search("open(path, errors='surrogateescape')")
    assert DECODING.search("name = os.fsdecode(raw)")
    assert not DECODING.search("shutil.rmtree(path, ignore_errors=True)")
    assert not DECODING.search('line.decode("utf-8")')  # strict: a corrupt log is refused
    assert "def clean_text(" in TEXT_HOME.read_text()
