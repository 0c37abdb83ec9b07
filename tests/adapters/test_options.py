"""Where options come from: flag > $TRITON_GITOPS_<OPTION> > config file > default, and
what the command line refuses (abbreviations, config file keys no command has)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.adapters.options import OptionSourceError, known_keys, misspelled_variables
from reconciler.cli import build_parser, main, parse_arguments


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_config_after_the_command_is_the_config_not_config_recheck(tmp_path: Path) -> None:
    # What the user saw: "argument --config-recheck: invalid float value: 'cfg.yaml'".
    cfg = config_file(tmp_path, "repo: https://git.example/m.git\nconfig-recheck: 30\n")
    for argv in (["plan", "--config", str(cfg)], [f"--config={cfg}", "plan"]):
        args = parse_arguments(argv, {})
        assert (args.command, args.repo, args.config_recheck) == (
            "plan",
            "https://git.example/m.git",
            30.0,
        )
        assert args.config == cfg


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["plan", "--repo", "r", "--config-re", "5"], "--config-re"),
        (["--conf", "x", "history"], "--conf"),
        (["apply", "--repo", "r", "--revert", "commit"], "--revert"),
    ],
)
def test_abbreviations_are_refused_everywhere(
    argv: list[str], word: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_arguments(argv, {})
    assert exited.value.code == 1  # a usage error, never "changes pending"
    assert word in capsys.readouterr().err
    # every parser, not only the ones tried above
    parser = build_parser()
    assert not parser.allow_abbrev
    assert not any(sub.allow_abbrev for sub in parser.commands.values())


def test_an_unknown_key_is_refused_with_file_line_and_the_nearest_key(tmp_path: Path) -> None:
    cfg = config_file(tmp_path, "repo: r\n# the mode\nrevert_mod: commit\n")
    with pytest.raises(OptionSourceError) as refused:
        parse_arguments(["plan", "--config", str(cfg)], {})
    assert str(refused.value).startswith(f"config file {cfg}:3: unknown key 'revert_mod'")
    assert "did you mean 'revert-mode'?" in str(refused.value)


def test_a_key_of_another_command_is_left_to_it(tmp_path: Path) -> None:
    # One file for run and history: interval is run's, output markdown is plan's alone.
    cfg = config_file(tmp_path, "interval: 30\noutput: json\nstate: /s.db\n")
    args = parse_arguments(["history", "--config", str(cfg)], {})
    assert (args.output, args.state) == ("json", Path("/s.db"))
    assert not hasattr(args, "interval")
    cfg.write_text("output: markdown\nrepo: r\n")
    assert parse_arguments(["plan", "--config", str(cfg)], {}).output == "markdown"


def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    cfg = config_file(tmp_path, "repo: r\npath: from-file\nref: file-ref\nallow-empty: true\n")
    env = {"TRITON_GITOPS_CONFIG": str(cfg), "TRITON_GITOPS_PATH": "from-env"}
    args = parse_arguments(["plan"], env)
    assert (args.path, args.ref, args.allow_empty, args.parallel) == (
        "from-env",
        "file-ref",
        True,
        8,
    )
    args = parse_arguments(["plan", "--path", "from-flag"], env)
    assert args.path == "from-flag"
    env["TRITON_GITOPS_ALLOW_EMPTY"] = "false"
    assert parse_arguments(["plan"], env).allow_empty is False


def test_a_bad_value_names_its_source(tmp_path: Path) -> None:
    cfg = config_file(tmp_path, "repo: r\nparallel: many\n")
    with pytest.raises(OptionSourceError, match=rf"config file {cfg}:2: parallel: 'many'"):
        parse_arguments(["plan", "--config", str(cfg)], {})
    env = {"TRITON_GITOPS_REVERT_MODE": "sideways"}
    with pytest.raises(OptionSourceError, match=r"\$TRITON_GITOPS_REVERT_MODE: 'sideways' is not"):
        parse_arguments(["plan", "--repo", "r"], env)


@pytest.mark.parametrize(
    ("given", "meant"), [("ture", None), ("TRUE", True), ("on", True), ("0", False), ("", False)]
)
def test_a_flag_from_the_environment_is_true_false_or_refused(
    given: str, meant: bool | None
) -> None:
    env = {"TRITON_GITOPS_REPO": "r", "TRITON_GITOPS_ALLOW_EMPTY": given}
    if meant is not None:
        assert parse_arguments(["plan"], env).allow_empty is meant
        return
    with pytest.raises(OptionSourceError) as refused:
        parse_arguments(["plan"], env)
    assert str(refused.value) == (
        "$TRITON_GITOPS_ALLOW_EMPTY: 'ture' is neither true nor false "
        "(true, yes, on, 1; false, no, off, 0)"
    )


def test_a_variable_that_looks_like_an_option_but_is_none_is_warned_about() -> None:
    known = known_keys(build_parser().commands)
    environ = {
        "TRITON_GITOPS_REVERT_MOD": "commit",  # a letter short
        "TRITON_GITOPS_GIT_TOKN": "secret",  # a secret's variable misspelled
        "TRITON_GITOPS_REVERT_MODE": "commit",
        "TRITON_GITOPS_GIT_TOKEN": "secret",  # read without its --git-token-file
        "TRITON_GITOPS_OPERATOR_TOKEN": "secret",  # the on-call verbs' token
        "TRITON_GITOPS_WHEEL": "https://...",  # someone else's setting: left alone
        "TRITON_GITOPS_SERVER": "edge-a",  # what a replaceLibrary command is given
        "PATH": "/usr/bin",
    }
    assert misspelled_variables(environ, known) == [
        "$TRITON_GITOPS_GIT_TOKN is not read and is ignored; did you mean "
        "$TRITON_GITOPS_GIT_TOKEN?",
        "$TRITON_GITOPS_REVERT_MOD is not read and is ignored; did you mean "
        "$TRITON_GITOPS_REVERT_MODE?",
    ]


def test_the_command_line_prints_the_warning_and_goes_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRITON_GITOPS_ALLOW_EMTPY", "true")
    assert main(["validate", str(tmp_path)]) == 0
    assert (
        "warning: $TRITON_GITOPS_ALLOW_EMTPY is not read and is ignored; did you mean "
        "$TRITON_GITOPS_ALLOW_EMPTY?"
    ) in capsys.readouterr().err


def test_every_duration_option_takes_a_duration_as_manifests_write_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 45, point 2: manifests take 1m30s, and so does every option of seconds, on the
    command line, in the config file and in the environment; a bare number stays seconds.
    What is neither says both forms (before: "invalid float value: '1m'")."""
    args = parse_arguments(["run", "--repo", "r", "--interval", "1m", "--jitter", "1.5"], {})
    assert (args.interval, args.jitter) == (60.0, 1.5)
    args = parse_arguments(["plan", "--repo", "r", "--call-timeout", "500ms"], {})
    assert args.call_timeout == 0.5
    cfg = config_file(tmp_path, "repo: r\ninterval: 1m30s\n")
    assert parse_arguments(["--config", str(cfg), "run"], {}).interval == 90.0
    environ = {"TRITON_GITOPS_INTERVAL": "2h", "TRITON_GITOPS_REPO": "r"}
    assert parse_arguments(["run"], environ).interval == 7200.0

    with pytest.raises(SystemExit):
        parse_arguments(["run", "--repo", "r", "--interval", "1 minute"], {})
    said = capsys.readouterr().err
    assert "argument --interval: '1 minute' is not a duration" in said, said
    assert "(1m, 1m30s, 500ms, 2h)" in said, said
    bad = config_file(tmp_path, "repo: r\ninterval: 5min\n")
    with pytest.raises(OptionSourceError, match=r"cfg.yaml:2.*'5min' is not a duration"):
        parse_arguments(["--config", str(bad), "run"], {})
