"""Structured output of ``andon run`` / ``andon resume`` (docs/ci.md, Structured output).

``--output-schema FILE``: the schema is read and checked before anything starts; the model is
asked for a final answer in JSON matching it, always in the prompt and, where the provider has a
parameter that leaves tool calls alone, in the request too (:class:`SchemaModel`); the final text
is parsed and validated with the full validator of its draft (Draft 2020-12 unless ``$schema``
names another). ``--output-last-message FILE``: the final text is written atomically (a temporary
file in the same folder, then a rename), so the file is never half written.

Here are the pieces; ``andon.cli._run`` drives them (the retry turn, the exit code).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import stat
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from andon.base import AbortSignal, ConfigError, UnreadableFile, read_small_file
from andon.llm import (
    Chunk,
    Model,
    ModelIdentity,
    ModelRequest,
    OnAttempt,
    ResponseSchema,
    RetryDecider,
)

if TYPE_CHECKING:
    # jsonschema (and what it imports) is a fifth of the CLI's import time; only a run with
    # --output-schema needs it, so it is imported where a schema is read or an answer checked.
    import jsonschema.protocols

__all__ = [
    "Answer",
    "Mismatch",
    "OutputSchema",
    "SchemaModel",
    "check_answer",
    "check_output_file",
    "instructions",
    "load_output_schema",
    "retry_message",
    "write_atomically",
]

MAX_SCHEMA_BYTES: Final = 1 << 20
"""The largest schema file read: a schema is a few kilobytes; anything bigger is a mistake."""

MAX_PROBLEM: Final = 300
"""The longest description of a mismatch (the model's wrong value can be long)."""

_FLAG: Final = "--output-schema"
_NAME_CHARS: Final = re.compile(r"[^A-Za-z0-9_-]+")
_FENCE: Final = re.compile(r"```(?:json)?[ \t]*\n(.*?)\n?```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class OutputSchema:
    """A checked ``--output-schema`` file."""

    path: str
    schema: dict[str, Any]
    validator: jsonschema.protocols.Validator

    @property
    def response_schema(self) -> ResponseSchema:
        """The schema as a model request carries it, named after the file (OpenAI needs a name
        of ``[A-Za-z0-9_-]``, at most 64 characters)."""
        name = _NAME_CHARS.sub("_", Path(self.path).stem).strip("_")[:64] or "output"
        return ResponseSchema(name=name, schema=self.schema)


@dataclass(frozen=True)
class Answer:
    """A final answer that matched: its value and its JSON text (a fence taken off)."""

    value: Any
    text: str


@dataclass(frozen=True)
class Mismatch:
    """Why a final answer did not match, in one line (where, and what is wrong)."""

    problem: str


def _read_schema_bytes(path: str) -> bytes:
    """The file's bytes, read the one safe way (``andon.base.read_small_file``)."""
    try:
        found = read_small_file(path, MAX_SCHEMA_BYTES)
    except FileNotFoundError as e:
        raise ConfigError(f"{_FLAG} {path}: cannot read it: {e.strerror or e}") from None
    except UnreadableFile as e:
        reason = "is a folder, not a schema file" if "folder" in e.reason else e.reason
        raise ConfigError(f"{_FLAG} {path}: {reason}") from None
    if found.over(MAX_SCHEMA_BYTES):
        raise ConfigError(f"{_FLAG} {path}: larger than {MAX_SCHEMA_BYTES} bytes; not a schema")
    return found.data


def load_output_schema(path: str) -> OutputSchema:
    """Read and check a schema file; every way it can be wrong is one ``ConfigError`` line that
    names the file (exit 2, before anything starts)."""
    data = _read_schema_bytes(path)
    try:
        schema = json.loads(data, parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{_FLAG} {path}: not UTF-8 text (offset {e.start})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{_FLAG} {path}: not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
        ) from None
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{_FLAG} {path}: not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise ConfigError(
            f"{_FLAG} {path}: not a JSON Schema: the file holds a JSON {_kind(schema)}, not an "
            "object"
        )
    import jsonschema
    import jsonschema.exceptions
    import jsonschema.validators

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as e:
        where = _json_path(e.absolute_path)
        raise ConfigError(
            f"{_FLAG} {path}: not a valid JSON Schema: at {where}: {_short(e.message)}"
        ) from None
    except RecursionError:
        raise ConfigError(f"{_FLAG} {path}: not a valid JSON Schema: nested too deeply") from None
    validator = cls(schema)
    try:
        # A reference andon cannot follow (another file, a URL: nothing is fetched) shows here
        # when it is on the root's path; one deeper shows as a mismatch of the answer.
        validator.is_valid(None)
    except Exception as e:
        raise ConfigError(f"{_FLAG} {path}: cannot apply the schema: {_short(str(e))}") from None
    return OutputSchema(path=path, schema=schema, validator=validator)


def instructions(schema: OutputSchema) -> str:
    """What a run with ``--output-schema`` asks the model for (after its prompt, or as a message
    of its own)."""
    text = json.dumps(schema.schema, ensure_ascii=False)
    return (
        "Output format: use the tools as the task needs. When you are done, your final "
        "answer must be a single JSON value that matches the JSON Schema below. Answer with only "
        "the JSON: no text before or after it, no Markdown.\n\n"
        f"```json\n{text}\n```\n"
    )


def retry_message(problem: str) -> str:
    """The follow-up that asks once more for an answer that matches."""
    return (
        f"Your final answer did not match the required JSON Schema: {problem}. Answer again with "
        "only the JSON value that matches the schema given with the task: no text before or "
        "after it, no Markdown."
    )


def check_answer(schema: OutputSchema, text: str | None) -> Answer | Mismatch:
    """Parse ``text`` as JSON (a ```` ```json ```` fence around it is taken off, nothing else is
    forgiven) and validate it against ``schema``."""
    body = (text or "").strip()
    fenced = _FENCE.fullmatch(body)
    if fenced is not None:
        body = fenced.group(1).strip()
    if not body:
        return Mismatch("the answer is empty, not JSON")
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        return Mismatch(f"the answer is not JSON: {e.msg} (line {e.lineno}, column {e.colno})")
    except (ValueError, RecursionError) as e:
        return Mismatch(f"the answer is not JSON: {_short(str(e))}")
    import jsonschema.exceptions

    try:
        error = jsonschema.exceptions.best_match(schema.validator.iter_errors(value))
    except Exception as e:  # a reference andon cannot follow, deep in the schema
        return Mismatch(f"the schema could not be applied: {_short(str(e))}")
    if error is not None:
        return Mismatch(f"at {_json_path(error.absolute_path)}: {_short(error.message)}")
    return Answer(value=value, text=body)


class SchemaModel:
    """A model whose step requests carry the schema as :attr:`ModelRequest.response_schema`.

    Only requests that offer tools are the agent's steps; any other request (a summary made for
    compaction, say) goes as it came, since a JSON-only answer there would be no summary. What a
    provider does with the field is the request builder's choice (``andon.llm``: OpenAI only).
    Everything else is the wrapped model's.
    """

    def __init__(self, inner: Model, schema: ResponseSchema) -> None:
        self.inner = inner
        self.schema = schema

    @property
    def info(self) -> ModelIdentity:
        return self.inner.info

    def stream(
        self,
        request: ModelRequest,
        signal: AbortSignal,
        on_attempt: OnAttempt,
        *,
        decide_retry: RetryDecider | None = None,
    ) -> AsyncIterator[Chunk]:
        if request.tools and request.response_schema is None:
            request = dataclasses.replace(request, response_schema=self.schema)
        return self.inner.stream(request, signal, on_attempt, decide_retry=decide_retry)

    def __getattr__(self, name: str) -> Any:
        # What a later andon asks of a model beyond the protocol (its context window, say).
        if name in ("inner", "schema"):  # not set yet: no recursion while unpickling
            raise AttributeError(name)
        return getattr(self.inner, name)


def check_output_file(path: str) -> Path:
    """Where ``--output-last-message`` will write, checked before anything starts: its folder
    exists and a file can be created and renamed there (a real probe, removed at once). A
    symbolic link is followed, so the file it points at is replaced, not the link."""
    flag = "--output-last-message"
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder, not a file")
    if target.exists() and not target.is_file():
        raise ConfigError(f"{flag} {path}: is not a regular file")
    folder = target.parent
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: the folder {folder} does not exist")
    try:
        probe = _create_temporary(target)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(
            f"{flag} {path}: cannot write a file in {folder}: {e.strerror or e}"
        ) from None
    return target


def write_atomically(target: Path, text: str) -> None:
    """Replace ``target`` with ``text`` (UTF-8) in one rename: a reader sees the old file or the
    whole new one. An existing file keeps its permission bits; a new one gets the umask's. Raises
    ``OSError``; the temporary file is removed then."""
    temporary = _create_temporary(target)
    try:
        with open(temporary, "wb") as f:
            f.write(text.encode("utf-8", "replace"))
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(temporary, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # the rename durable too, where the folder can be opened
        fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _create_temporary(target: Path) -> Path:
    """A new, empty file beside ``target`` (same folder, so the rename is atomic), made with
    mode 0666 minus the umask, as any file a program writes."""
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    os.close(fd)
    return temporary


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _kind(value: object) -> str:
    match value:
        case list():
            return "array"
        case str():
            return "string"
        case bool():
            return "boolean"
        case int() | float():
            return "number"
        case None:
            return "null"
    return type(value).__name__


def _json_path(parts: Iterable[str | int]) -> str:
    """``$``, ``$.verdict``, ``$.items[2].name``: where in a JSON value."""
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += f".{part}"
        else:
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
    return out


def _short(text: str) -> str:
    """One line, at most :data:`MAX_PROBLEM` characters."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_PROBLEM else line[: MAX_PROBLEM - 1] + "…"
