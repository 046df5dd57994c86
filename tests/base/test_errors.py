from __future__ import annotations

import andon.errors as errors
from andon.base import ErrorCode, Hook


def test_every_error_is_an_andon_error() -> None:
    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, errors.AndonError), name


def test_tree_shape_matches_the_architecture() -> None:
    assert issubclass(errors.NoWorkerStarted, errors.WorkerError)
    leaf: type[errors.AndonError]
    for leaf in (
        errors.LogCorrupted,
        errors.LogFormatUnsupported,
        errors.SessionLive,
        errors.LogWriteFailed,
    ):
        assert issubclass(leaf, errors.SessionError)
    for leaf in (errors.MessageTooLarge, errors.MalformedFrame, errors.VersionMismatch):
        assert issubclass(leaf, errors.ProtocolError)
    assert issubclass(errors.ScriptInvalid, errors.ConfigError)


def test_leaves_carry_ids_as_attributes() -> None:
    e = errors.LogCorrupted("bad line", session="s", line=7, offset=512)
    assert (e.session, e.line, e.offset) == ("s", 7, 512)
    live = errors.SessionLive("held", pid=42, host="h")
    assert (live.pid, live.host) == (42, "h")
    refused = errors.WorkerError("holds a key", worker="w1")
    assert refused.worker == "w1"
    model = errors.ModelError(ErrorCode.RATE_LIMITED, "429", status=429, retry_after=0.5)
    assert model.code is ErrorCode.RATE_LIMITED and model.retry_after == 0.5
    aborted = errors.Aborted(Hook("budget"))
    assert aborted.reason == Hook("budget") and "budget" in str(aborted)
    script = errors.ScriptInvalid("must be a string", index=3, field="text")
    assert (script.index, script.field) == (3, "text")
    assert "reply 3" in str(script) and "'text'" in str(script)


def test_describe_error_is_one_line_for_a_person() -> None:
    from andon.base import describe_error

    missing = FileNotFoundError(2, "No such file or directory", "/nowhere/x")
    assert describe_error(missing, typed=False) == "No such file or directory: /nowhere/x"
    assert describe_error(missing) == "FileNotFoundError: No such file or directory: /nowhere/x"
    group = ExceptionGroup("one", [ExceptionGroup("inner", [ValueError("bad")])])
    assert describe_error(group) == "ValueError: bad"
    assert describe_error(RuntimeError()) == "RuntimeError"
    assert describe_error(RuntimeError(), typed=False) == "RuntimeError"
    two = ExceptionGroup("two", [ValueError("a"), KeyError("b")])
    assert describe_error(two).startswith("ExceptionGroup: two")
