"""`subres completion bash|zsh|fish`: a shell completion script, generated from the parser.

Owns reading the command line's shape out of an `argparse` parser (the
verbs, each verb's flags, which flags take a value, their choices, which
values are files) and writing it as each shell's completion script. The
script is made from the same parser that parses the command line, so it
never drifts from it: a flag added to a verb completes at once. Flags
hidden from `--help` stay hidden here. Targets are left to the shell's
default (file names), since naming machines would take a server.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SHELLS", "Command", "Option", "add_arguments", "read", "script"]

PROGRAMS = ("subres", "kubectl-subres")
FILE_METAVARS = frozenset({"FILE", "OUT", "DIR"})
"""Metavars whose values are paths (besides flags of type `Path`)."""


@dataclass(frozen=True)
class Option:
    """One flag: its spellings, whether it takes a value, and which values complete."""

    names: tuple[str, ...]
    help: str
    takes_value: bool
    choices: tuple[str, ...] = ()
    files: bool = False


@dataclass(frozen=True)
class Command:
    """The top level (`name` "") or one verb."""

    name: str
    help: str
    options: tuple[Option, ...]
    files: bool = False
    """Its positional arguments are paths (`replay FILE`)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `completion` flags."""
    parser.add_argument("shell", choices=SHELLS, help="the shell to print a script for")


def read(parser: argparse.ArgumentParser) -> list[Command]:
    """The top level, then every verb, as the parser has them."""
    top = Command("", parser.description or "", _options(parser))
    verbs: list[Command] = []
    for action in parser._actions:  # argparse keeps its actions only here
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                files = any(
                    not a.option_strings and _is_file(a)
                    for a in sub._actions
                    if a.help != argparse.SUPPRESS
                )
                verbs.append(Command(name, helps.get(name, ""), _options(sub), files))
    return [top, *verbs]


def _options(parser: argparse.ArgumentParser) -> tuple[Option, ...]:
    return tuple(
        Option(
            names=tuple(a.option_strings),
            help=_one_line(a.help or ""),
            takes_value=a.nargs != 0,
            choices=tuple(str(c) for c in a.choices or ()),
            files=_is_file(a),
        )
        for a in parser._actions
        if a.option_strings and a.help != argparse.SUPPRESS
    )


def _is_file(action: argparse.Action) -> bool:
    return action.type is Path or action.metavar in FILE_METAVARS


def _one_line(text: str) -> str:
    first = " ".join(text.split())
    return first.split(" (", 1)[0].split("; ", 1)[0]


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of `shell` for the command `parser` parses."""
    return WRITERS[shell](read(parser))


def _bash(commands: list[Command]) -> str:
    top, verbs = commands[0], commands[1:]
    skip = "|".join(n for o in top.options if o.takes_value for n in o.names)
    lines = [
        "# subres completion for bash: source it, e.g. from ~/.bashrc:",
        "#   source <(subres completion bash)",
        "_subres() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    local verb="" i=1 words=""',
        "    COMPREPLY=()",
        "    while ((i < COMP_CWORD)); do",
        '        case "${COMP_WORDS[i]}" in',
        f"            {skip}) ((i += 2)); continue ;;",
        "            -*) ;;",
        '            *) verb="${COMP_WORDS[i]}"; break ;;',
        "        esac",
        "        ((i++))",
        "    done",
        '    case "$verb" in',
    ]
    for command in commands:
        names = [n for o in command.options for n in o.names]
        if command is top:
            names += [v.name for v in verbs]
        label = shlex.quote(command.name) if command.name else '""'
        lines.append(f"        {label}) words={shlex.quote(' '.join(names))} ;;")
    lines += ["        *) return ;;", "    esac", '    case "$verb $prev" in']
    for command in commands:
        for option in command.options:
            if not option.takes_value:
                continue
            patterns = "|".join(shlex.quote(f"{command.name} {n}") for n in option.names)
            if option.choices:
                words = shlex.quote(" ".join(option.choices))
                action = f'COMPREPLY=($(compgen -W {words} -- "$cur")); '
            elif option.files:
                action = 'COMPREPLY=($(compgen -f -- "$cur")); '
            else:
                action = ""  # a value to type: nothing to offer but the shell's default
            lines.append(f"        {patterns}) {action}return ;;")
    lines += [
        "    esac",
        "    if [[ -z $verb || $cur == -* ]]; then",
        '        COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "    fi",
        "}",
        f"complete -o default -F _subres {' '.join(PROGRAMS)}",
        "",
    ]
    return "\n".join(lines)


def _zsh(commands: list[Command]) -> str:
    top, verbs = commands[0], commands[1:]
    lines = [
        f"#compdef {' '.join(PROGRAMS)}",
        "# subres completion for zsh: save it as _subres in a directory of $fpath, or",
        "#   source <(subres completion zsh)",
        "_subres() {",
        "    local context state state_descr line",
        "    typeset -A opt_args",
        "    local -a verbs=(",
        *(f"        {_zq(_zdescribed(v.name, v.help))}" for v in verbs),
        "    )",
        "    _arguments -C \\",
        *(f"        {spec} \\" for spec in _zspecs(top)),
        "        '1:verb:->verb' \\",
        "        '*::argument:->argument'",
        "    case $state in",
        "        verb) _describe verb verbs ;;",
        "        argument)",
        "            case $line[1] in",
    ]
    for verb in verbs:
        positional = "'*:file:_files'" if verb.files else "'*:argument:_default'"
        specs = " ".join([*_zspecs(verb), positional])
        lines.append(f"                {shlex.quote(verb.name)}) _arguments {specs} ;;")
    lines += [
        "            esac",
        "            ;;",
        "    esac",
        "}",
        'if [[ $zsh_eval_context[-1] == loadautofunc ]]; then _subres "$@"; '
        f"else compdef _subres {' '.join(PROGRAMS)}; fi",
        "",
    ]
    return "\n".join(lines)


def _zspecs(command: Command) -> list[str]:
    specs = []
    for option in command.options:
        help_text = option.help.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")
        value = ""
        if option.takes_value:
            what = option.names[-1].lstrip("-").replace(":", "\\:")
            if option.choices:
                value = f":{what}:({' '.join(option.choices)})"
            elif option.files:
                value = f":{what}:_files"
            else:
                value = f":{what}: "
        for name in option.names:
            specs.append(_zq(f"{name}[{help_text}]{value}"))
    return specs


def _zdescribed(name: str, help_text: str) -> str:
    """An entry of `_describe`: a colon ends the name, so one in it is escaped."""
    escaped = name.replace(":", "\\:")
    return f"{escaped}:{help_text}"


def _zq(text: str) -> str:
    """`text` in zsh single quotes."""
    return "'" + text.replace("'", "'\\''") + "'"


def _fish(commands: list[Command]) -> str:
    top, verbs = commands[0], commands[1:]
    lines = [
        "# subres completion for fish: save it as ~/.config/fish/completions/subres.fish, or",
        "#   subres completion fish | source",
    ]
    for program in PROGRAMS:
        lines.append(f"complete -c {program} -f")
        for verb in verbs:
            lines.append(
                f"complete -c {program} -n __fish_use_subcommand -a {shlex.quote(verb.name)} "
                f"-d {shlex.quote(verb.help)}"
            )
        lines += _fish_options(program, "__fish_use_subcommand", top)
        for verb in verbs:
            when = f"'__fish_seen_subcommand_from {verb.name}'"
            lines += _fish_options(program, when, verb)
            if verb.files:
                lines.append(f"complete -c {program} -n {when} -F")
    lines.append("")
    return "\n".join(lines)


def _fish_options(program: str, when: str, command: Command) -> list[str]:
    lines = []
    for option in command.options:
        names = " ".join(
            f"-l {n[2:]}" if n.startswith("--") else f"-s {n[1:]}" for n in option.names
        )
        value = ""
        if option.choices:
            value = f" -x -a {shlex.quote(' '.join(option.choices))}"
        elif option.files:
            value = " -r -F"
        elif option.takes_value:
            value = " -x"
        lines.append(
            f"complete -c {program} -n {when} {names}{value} -d {shlex.quote(option.help)}"
        )
    return lines


WRITERS: dict[str, Callable[[list[Command]], str]] = {"bash": _bash, "zsh": _zsh, "fish": _fish}
SHELLS = tuple(WRITERS)
