"""``andon completion bash|zsh|fish``: a shell completion script, generated from the command's
own parser, so that a flag added to a command is offered without anyone remembering to.

It completes what the parser knows: the commands (and a command's own sub-commands, such as
``keys generate``), each command's options, and the values of options with fixed choices. Files
and folders are left to the shell's own completion.

    andon completion bash > ~/.local/share/bash-completion/completions/andon
    andon completion zsh > "${fpath[1]}/_andon"
    andon completion fish > ~/.config/fish/completions/andon.fish
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Final

__all__ = ["SHELLS", "completion_script"]

SHELLS: Final = ("bash", "zsh", "fish")


@dataclass(frozen=True)
class _Option:
    flags: tuple[str, ...]
    help: str
    choices: tuple[str, ...]
    takes_value: bool


@dataclass(frozen=True)
class _Command:
    path: tuple[str, ...]  # ("keys", "generate")
    help: str
    options: tuple[_Option, ...]
    children: tuple[str, ...]
    values: tuple[str, ...] = ()  # a positional argument's fixed choices


def _commands(parser: argparse.ArgumentParser) -> list[_Command]:
    """Every command under ``parser`` (the root is the empty path), depth first."""
    found: list[_Command] = []

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...], help_text: str) -> None:
        options: list[_Option] = []
        values: list[str] = []
        children: list[tuple[str, argparse.ArgumentParser, str]] = []
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help or "" for a in action._choices_actions}
                for name, child in action.choices.items():
                    children.append((name, child, helps.get(name, "")))
            elif not action.option_strings and action.choices:
                values.extend(str(c) for c in action.choices)
            elif action.option_strings and action.help != argparse.SUPPRESS:
                choices = tuple(str(c) for c in action.choices) if action.choices else ()
                options.append(
                    _Option(
                        tuple(action.option_strings),
                        _one_line(action.help or ""),
                        choices,
                        action.nargs != 0,
                    )
                )
        names = tuple(n for n, _, _ in children)
        found.append(_Command(path, help_text, tuple(options), names, tuple(values)))
        for name, child, child_help in children:
            walk(child, (*path, name), _one_line(child_help))

    walk(parser, (), "")
    return found


def _one_line(text: str) -> str:
    return " ".join(text.replace("%%", "%").split())


def completion_script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` (one of :data:`SHELLS`)."""
    commands = _commands(parser)
    if shell == "bash":
        return _bash(commands)
    if shell == "zsh":
        # zsh runs bash's completion functions through bashcompinit: one generator, two shells.
        return "#compdef andon\nautoload -U +X bashcompinit && bashcompinit\n" + _bash(commands)
    if shell == "fish":
        return _fish(commands)
    raise ValueError(f"no completion for the shell {shell!r} (known: {', '.join(SHELLS)})")


def _bash(commands: list[_Command]) -> str:
    lines = [
        "# andon's completion for bash (andon completion bash): generated from its parser.",
        "_andon() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    local path="" word i',
        # The command path so far: the words before the cursor that are commands, in order.
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        word="${COMP_WORDS[i]}"',
        '        case "${path}:${word}" in',
    ]
    for command in commands:
        key = " ".join(command.path)
        for child in command.children:
            lines.append(
                f'            "{key}:{child}") path="{" ".join((*command.path, child))}" ;;'
            )
    lines += ["        esac", "    done", '    case "${path}:${prev}" in']
    for command in commands:
        key = " ".join(command.path)
        for option in command.options:
            if option.choices:
                for flag in option.flags:
                    words = " ".join(option.choices)
                    lines.append(
                        f'        "{key}:{flag}") COMPREPLY=($(compgen -W "{words}" -- "$cur")); '
                        "return ;;"
                    )
            elif option.takes_value:
                for flag in option.flags:
                    # A value of the user's: files, as the shell would offer by default.
                    lines.append(
                        f'        "{key}:{flag}") COMPREPLY=($(compgen -f -- "$cur")); return ;;'
                    )
    lines += ["    esac", '    case "$path" in']
    for command in commands:
        offered = [
            *command.children,
            *command.values,
            *(f for o in command.options for f in o.flags),
        ]
        lines.append(f'        "{" ".join(command.path)}") words="{" ".join(offered)}" ;;')
    lines += [
        "    esac",
        '    if [[ "$cur" == -* || -n "$words" ]]; then',
        '        COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "    fi",
        '    [[ ${#COMPREPLY[@]} -eq 0 ]] && COMPREPLY=($(compgen -f -- "$cur"))',
        "    return 0",
        "}",
        "complete -F _andon andon",
        "",
    ]
    return "\n".join(lines)


def _fish(commands: list[_Command]) -> str:
    lines = ["# andon's completion for fish (andon completion fish): generated from its parser."]
    lines.append("complete -c andon -f")
    for command in commands:
        condition = _fish_condition(command.path)
        for child in command.children:
            help_text = next((c.help for c in commands if c.path == (*command.path, child)), "")
            lines.append(
                f"complete -c andon -n {_fish_quote(condition)} -a {child} "
                f"-d {_fish_quote(help_text)}"
            )
        if command.values:
            lines.append(
                f"complete -c andon -n {_fish_quote(condition)} "
                f"-a {_fish_quote(' '.join(command.values))}"
            )
        for option in command.options:
            parts = [f"complete -c andon -n {_fish_quote(condition)}"]
            for flag in option.flags:
                if flag.startswith("--"):
                    parts.append(f"-l {flag[2:]}")
                else:
                    parts.append(f"-s {flag[1:]}")
            if option.choices:
                parts.append(f"-x -a {_fish_quote(' '.join(option.choices))}")
            elif option.takes_value:
                parts.append("-r -F")
            parts.append(f"-d {_fish_quote(option.help)}")
            lines.append(" ".join(parts))
    return "\n".join(lines) + "\n"


def _fish_condition(path: tuple[str, ...]) -> str:
    if not path:
        return "__fish_use_subcommand"
    seen = " && ".join(f"__fish_seen_subcommand_from {word}" for word in path)
    return seen


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
