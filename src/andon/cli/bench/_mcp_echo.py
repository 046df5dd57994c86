"""A minimal MCP stdio server for ``andon bench dispatch``: ``initialize``, ``tools/list`` (one
tool, ``echo``), ``tools/call``, ``ping``; one JSON-RPC message a line, no SDK, so that its own
round trip is the floor an MCP call through andon is measured beside. Run by its file path."""

from __future__ import annotations

import json
import sys


def main() -> None:
    out = sys.stdout
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue  # a notification
        if method == "initialize":
            result: object = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "andon-bench-echo", "version": "1"},
            }
        elif method == "tools/list":
            result = {
                "tools": [
                    {"name": "echo", "description": "Echo text.", "inputSchema": {"type": "object"}}
                ]
            }
        elif method == "tools/call":
            text = str((message["params"].get("arguments") or {}).get("text", ""))
            result = {"content": [{"type": "text", "text": text}]}
        else:
            result = {}
        out.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
