"""A small MCP stdio server for the tests, speaking JSON-RPC by hand (no SDK): ``python
fake_server.py MODE``. Its behaviours are the ones andon must survive.

Modes: ``ok`` (answers; ``slow`` sends progress, then stops at ``notifications/cancelled``
without answering, as the protocol asks), ``deaf`` (``slow`` blocks the server; SIGINT ignored,
so SIGTERM ends it), ``deaf-hard`` (also SIGTERM ignored: only SIGKILL ends it), ``exit`` (exits 3
at once, saying why on stderr), ``silent`` (never answers), ``garbage`` (answers initialize with
a line that is not JSON), ``many`` (as ``ok``, listing a thousand tools more).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

MODE = sys.argv[1]

TOOLS = [
    {"name": "echo", "description": "Echo text.", "inputSchema": {"type": "object"}},
    {"name": "pid", "description": "The server's pid.", "inputSchema": {"type": "object"}},
    {
        "name": "slow",
        "description": "Progress, then never ends.",
        "inputSchema": {"type": "object"},
    },
    {"name": "env", "description": "The server's environment.", "inputSchema": {"type": "object"}},
    {"name": "pending", "description": "Calls not ended.", "inputSchema": {"type": "object"}},
    {"name": "die", "description": "Exit 5 mid-call.", "inputSchema": {"type": "object"}},
]


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text(request_id: Any, value: str) -> None:
    send(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "result": {"content": [{"type": "text", "text": value}]},
        }
    )


def block_forever() -> None:
    while True:
        signal.pause()


def main() -> None:
    if MODE in ("deaf", "deaf-hard"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if MODE == "deaf-hard":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if MODE == "exit":
        print("fake server: no configuration, giving up", file=sys.stderr, flush=True)
        sys.exit(3)
    print(f"fake server {MODE} up", file=sys.stderr, flush=True)
    pending: set[Any] = set()
    for line in sys.stdin:
        message = json.loads(line)
        method = message.get("method")
        request_id = message.get("id")
        if MODE == "silent":
            continue
        if method == "initialize":
            if MODE == "garbage":
                sys.stdout.write("Server starting... this is not JSON-RPC\n")
                sys.stdout.flush()
                continue
            send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "result": {
                        "protocolVersion": message["params"]["protocolVersion"],
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "fake", "version": "1"},
                    },
                }
            )
        elif method == "tools/list":
            tools = TOOLS
            if MODE == "many":  # a thousand tools, beside the usual ones
                tools = TOOLS + [
                    {
                        "name": f"t{n:04}",
                        "description": f"Tool {n}.",
                        "inputSchema": {"type": "object"},
                    }
                    for n in range(1000)
                ]
            send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}})
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": request_id, "result": {}})
        elif method == "notifications/cancelled":
            pending.discard(message["params"].get("requestId"))  # stopped: no answer
        elif method == "tools/call":
            name = message["params"]["name"]
            arguments = message["params"].get("arguments") or {}
            if name == "echo":
                text(request_id, str(arguments.get("text", "")))
            elif name == "pid":
                text(request_id, str(os.getpid()))
            elif name == "env":
                text(request_id, json.dumps(dict(os.environ)))
            elif name == "pending":
                text(request_id, json.dumps(sorted(pending)))
            elif name == "die":
                sys.exit(5)
            elif name == "slow":
                token = (message["params"].get("_meta") or {}).get("progressToken")
                if token is not None:
                    send(
                        {
                            "jsonrpc": "2.0",
                            "method": "notifications/progress",
                            "params": {"progressToken": token, "progress": 1, "total": 10},
                        }
                    )
                if MODE not in ("ok", "many"):
                    block_forever()
                pending.add(request_id)
            else:
                send(
                    {
                        "jsonrpc": "2.0",
                        "id": request_id,
                        "error": {"code": -32602, "message": f"unknown tool {name}"},
                    }
                )


if __name__ == "__main__":
    main()
