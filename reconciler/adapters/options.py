"""Where an option's value comes from when the command line does not give it.

A flag wins over the environment (``$TRITON_GITOPS_<OPTION>``), which wins over the config
file (``--config FILE``, before or after the command, or ``$TRITON_GITOPS_CONFIG``), which
wins over the built-in default. Option ``--foo-bar`` is key ``foo-bar`` (or ``foo_bar``) in
the file and ``$TRITON_GITOPS_FOO_BAR`` in the environment. ``cli.parse_arguments`` calls
``take_defaults`` before argparse parses, so argparse still checks every value and a flag
still wins.

A config file key that no command has is refused, with the file, the line and the nearest
key; a key that another command has is left to it (one file serves ``run`` and ``status``).
Values are taken only for the command being run: ``output: markdown`` does not trouble
``history``, whose ``--output`` has no markdown.

Why not ConfigArgParse or pydantic-settings: ConfigArgParse turns file and environment
values into command-line words appended to (or put before) the arguments, which misplaces
them around subcommands (bw2/ConfigArgParse#57, #275, #350, still reported in 2026) and it
knows nothing of keys meant for another subcommand; pydantic-settings would mean a settings
model beside every one of the parsers' options, or replacing argparse altogether. Both would
take more code than the little here, which reads only public attributes of an argparse
``Action`` (``option_strings``, ``dest``, ``nargs``, ``type``, ``choices``, ``default``,
``required``) and, for want of a public way to list a parser's options, ``_actions``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError

from reconciler.core.spec.typos import did_you_mean, nearest

ENV_PREFIX = "TRITON_GITOPS_"
CONFIG_VARIABLE = ENV_PREFIX + "CONFIG"
# Options that no file or environment sets: they are about this one invocation.
_OWN = frozenset({"help", "version", "config"})


class OptionSourceError(ValueError):
    """A config file or an environment variable that cannot be used; the message names the
    file and line, or the variable."""


@dataclass(frozen=True)
class ConfigFile:
    """A config file's keys (as written) with their values and 1-based lines."""

    path: Path
    values: Mapping[str, Any] = field(default_factory=dict)
    lines: Mapping[str, int] = field(default_factory=dict)

    def where(self, key: str) -> str:
        return f"{self.path}:{self.lines[key]}" if key in self.lines else str(self.path)


def read_config_file(path: Path) -> ConfigFile:
    """The file's keys, values and lines; OptionSourceError when it is not a YAML mapping."""
    try:
        loaded = YAML(typ="rt").load(path)  # its errors name the file and line
    except (OSError, YAMLError) as exc:
        raise OptionSourceError(f"config file {path}: {exc}") from exc
    if loaded is None:
        return ConfigFile(path)
    if not isinstance(loaded, CommentedMap):
        raise OptionSourceError(f"config file {path}: not a mapping of option names to values")
    lines = {str(key): loaded.lc.key(key)[0] + 1 for key in loaded}
    return ConfigFile(path, {str(k): v for k, v in loaded.items()}, lines)


def config_path(argv: Sequence[str], environ: Mapping[str, str]) -> Path | None:
    """The file ``--config`` names (the last one given, before or after the command), else
    ``$TRITON_GITOPS_CONFIG``. A bare ``--config`` word is always the option: argparse
    takes no word that starts with ``--`` as another option's value; ``--`` ends options."""
    found: str | None = None
    for index, word in enumerate(argv):
        if word == "--":
            break
        if word == "--config" and index + 1 < len(argv):
            found = argv[index + 1]
        elif word.startswith("--config="):
            found = word.split("=", 1)[1]
    if found is None:
        found = environ.get(CONFIG_VARIABLE) or None
    return Path(found) if found is not None else None


def command_in(argv: Sequence[str], commands: Mapping[str, argparse.ArgumentParser]) -> str | None:
    """The command named on the command line: the first word that is neither an option nor
    ``--config``'s value (the only global option that takes one)."""
    words = iter(argv)
    for word in words:
        if word == "--config":
            next(words, None)
        elif not word.startswith("-"):
            return word if word in commands else None
    return None


def _long_options(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    # argparse has no public list of a parser's options: _actions is the one private read.
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in _OWN:
            yield longs[0][2:], action


def known_keys(commands: Mapping[str, argparse.ArgumentParser]) -> set[str]:
    return {key for parser in commands.values() for key, _ in _long_options(parser)}


# The product's own variables that are no option: the config file's path; the on-call
# verbs' token (their --token-file's value); what a backend's replaceLibrary command is given
# (SERVER, MODEL, BACKEND, REVISION); fault injection. A secret whose option is NAME_FILE is
# also read as $TRITON_GITOPS_NAME (GIT_TOKEN, GITHUB_SECRET...): those are found below.
_NOT_OPTIONS = frozenset(
    {"CONFIG", "OPERATOR_TOKEN", "SERVER", "MODEL", "BACKEND", "REVISION", "FAULT"}
)


def misspelled_variables(environ: Mapping[str, str], known: set[str]) -> list[str]:
    """A warning for each ``$TRITON_GITOPS_`` variable that nothing reads but that looks like
    one that is read (``REVERT_MOD``, ``GIT_TOKN``), with the one meant. Others are left
    alone: the prefix is shared (CI settings, test switches), and unlike a config file's keys
    the environment cannot be refused as a whole."""
    options = {key.upper().replace("-", "_") for key in known}
    secrets = {name.removesuffix("_FILE") for name in options if name.endswith("_FILE")}
    read = sorted(options | secrets | _NOT_OPTIONS)
    found = []
    for variable in sorted(environ):
        name = variable.removeprefix(ENV_PREFIX)
        if name == variable or name in read:
            continue
        near = nearest(name, read, cutoff=0.8)
        if near:
            found.append(
                f"${variable} is not read and is ignored; did you mean ${ENV_PREFIX}{near}?"
            )
    return found


def refuse_unknown_keys(config: ConfigFile, known: set[str]) -> None:
    """OptionSourceError naming the first key no command has, with the nearest known one."""
    for key in config.values:
        name = key.replace("_", "-")
        if name in known:
            continue
        hint = did_you_mean(name, known, cutoff=0.6)  # difflib's own default
        raise OptionSourceError(
            f"config file {config.where(key)}: unknown key '{key}'{hint} "
            "(keys are long option names without the dashes)"
        )


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _value(action: argparse.Action, raw: Any, source: str) -> Any:
    if action.nargs == 0:  # a flag (store_true): true or false, in the usual spellings
        if isinstance(raw, bool):
            return raw
        spelled = str(raw).strip().lower()
        if spelled in _TRUE or spelled in _FALSE:
            return spelled in _TRUE
        # Anything else was meant as something: "ture" must not quietly mean false.
        raise OptionSourceError(
            f"{source}: {raw!r} is neither true nor false (true, yes, on, 1; false, no, off, 0)"
        )
    if isinstance(raw, list | dict):
        raise OptionSourceError(f"{source}: {raw!r}: give one value")
    value: Any = str(raw)
    if action.type is not None and callable(action.type):
        try:
            value = action.type(value)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            raise OptionSourceError(f"{source}: {raw!r}: {exc}") from exc
    if action.choices is not None and value not in action.choices:
        raise OptionSourceError(
            f"{source}: {value!r} is not one of {', '.join(map(str, action.choices))}"
        )
    return value


def take_defaults(
    parser: argparse.ArgumentParser, environ: Mapping[str, str], config: ConfigFile | None
) -> None:
    """Make the environment's and the config file's values ``parser``'s defaults (the
    environment's win); an option they give is no longer required on the command line."""
    values = config.values if config is not None else {}
    for key, action in _long_options(parser):
        variable = ENV_PREFIX + key.upper().replace("-", "_")
        if variable in environ:
            raw, source = environ[variable], f"${variable}"
        else:
            spelled = next((k for k in (key, key.replace("-", "_")) if k in values), None)
            if spelled is None or values[spelled] is None or config is None:
                continue
            raw, source = values[spelled], f"config file {config.where(spelled)}: {spelled}"
        action.default = _value(action, raw, source)
        action.required = False
