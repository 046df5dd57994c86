"""The environment variables that hold a model's API key.

Declared here, at the bottom, because two layers that never import each other need them: the
model layer reads a key from them, and the fleet starts every worker without them (no tool may
read a key: docs/workers.md, Tools). A key variable added for a new provider is hidden from the
tools by the same change.
"""

from __future__ import annotations

from typing import Final

__all__ = ["API_KEY_ENV_VARS"]

API_KEY_ENV_VARS: Final = frozenset({"DEEPSEEK_API_KEY", "OPENAI_API_KEY", "ANDON_API_KEY"})
"""Every variable a model spec may read a key from: tool environments never carry them."""
