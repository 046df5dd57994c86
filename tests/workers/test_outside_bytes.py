"""Bytes from outside in the built-in file tools and Python tool results (docs/workers.md, Tools;
docs/log-format.md, Text): a file name that is not valid UTF-8 is shown with a reversible escape
and can be named back; a Python tool's text with surrogate escapes is U+FFFD, not ``INTERNAL``; a
2 MiB error message is the tool's error, cut and saying so. Real worker and call processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from andon.base import AbortController, ErrorCode
from andon.supervisor import ToolCallRequest, ToolExecutor, ToolOutcome
from andon.workers._pycall import CONTENT_CAP
from tests.workers.pytools import bytes_tools
from tests.workers.support import running_pool

LATIN1 = b"caf\xe9.txt"  # what a Latin-1 system wrote: not valid UTF-8


async def _call(
    executor: ToolExecutor, root: Path, n: int, name: str, **args: object
) -> ToolOutcome:
    request = ToolCallRequest(f"c1-1-{n}", name, json.dumps(args), str(root))
    return await executor.execute(request, AbortController().signal)


async def test_a_latin_1_file_name_is_listed_grepped_and_read_back(tmp_path: Path) -> None:
    root = tmp_path
    os.makedirs(os.fsencode(root) + b"/d\xff", exist_ok=True)
    with open(os.fsencode(root) + b"/d\xff/" + LATIN1, "wb") as f:
        f.write(b"needle one\nline caf\xe9\n")
    # An ordinary name that merely looks like an escape: never taken for the byte.
    (root / "look\\xe9.txt").write_text("needle two\n")
    async with running_pool("subreaper", registry=bytes_tools()) as (_, executor):
        listed = await _call(executor, root, 1, "list_files", path=".")
        grepped = await _call(executor, root, 2, "grep", pattern="needle|line")
        read = await _call(executor, root, 3, "read_file", path="d\\xff/caf\\xe9.txt")
        look = await _call(executor, root, 4, "read_file", path="look\\\\xe9.txt")
        edit = await _call(
            executor, root, 5, "edit_file", path="d\\xff/caf\\xe9.txt", old="one", new="1"
        )
        wrote = await _call(executor, root, 6, "write_file", path="new\\xfe.txt", content="hi\n")
        in_folder = await _call(executor, root, 7, "list_files", path="d\\xff", pattern="*.txt")
    for outcome in (listed, grepped, read, look, edit, wrote, in_folder):
        assert not outcome.is_error, outcome.content
    assert listed.content.splitlines() == ["look\\\\xe9.txt", "d\\xff/caf\\xe9.txt"]
    assert grepped.content.splitlines() == [
        "d\\xff/caf\\xe9.txt:1: needle one",
        "d\\xff/caf\\xe9.txt:2: line caf\ufffd",
        "look\\\\xe9.txt:1: needle two",
    ]
    assert read.content == "needle one\nline caf\ufffd\n"
    assert look.content == "needle two\n"
    assert in_folder.content == "caf\\xe9.txt"
    with open(os.fsencode(root) + b"/d\xff/" + LATIN1, "rb") as f:
        assert f.read() == b"needle 1\nline caf\xe9\n"
    assert os.path.exists(os.fsencode(root) + b"/new\xfe.txt")


async def test_a_python_tool_s_escaped_text_is_u_fffd_not_internal(tmp_path: Path) -> None:
    async with running_pool("subreaper", registry=bytes_tools()) as (_, executor):
        returned = await _call(executor, tmp_path, 1, "returns_escaped")
        raised = await _call(executor, tmp_path, 2, "raises_escaped")
    assert not returned.is_error, returned.content
    assert returned.content == "found caf\ufffd and \ufffd"
    assert raised.error is not None and raised.error.code is ErrorCode.TOOL_ERROR
    assert raised.error.message == "FileNotFoundError: no caf\ufffd here"
    assert raised.content == "Error: FileNotFoundError: no caf\ufffd here"


async def test_a_2_mib_error_message_is_the_tool_s_error_cut_and_saying_so(tmp_path: Path) -> None:
    size = 2 * 1024 * 1024 + 100 * 1024  # ~2 MiB: the result and the message are 4.2 MiB
    async with running_pool("subreaper", registry=bytes_tools()) as (_, executor):
        small = await _call(executor, tmp_path, 1, "fails_at_length", size=size)
        huge = await _call(executor, tmp_path, 2, "fails_at_length", size=CONTENT_CAP + 10)
    assert small.error is not None and small.error.code is ErrorCode.TOOL_ERROR, small.content
    assert small.error.message == "RuntimeError: " + "x" * size
    assert small.content == "Error: " + small.error.message
    assert huge.error is not None and huge.error.code is ErrorCode.TOOL_ERROR, huge.content
    tail = f"\n[andon cut the tool's error message at {CONTENT_CAP} of {CONTENT_CAP + 24} bytes]"
    assert huge.error.message.endswith(tail)
    assert huge.error.message.startswith("RuntimeError: xxx")
    assert huge.content.endswith(f"of {CONTENT_CAP + 31} bytes]")
