"""The commands with actions of their own (`gpuop.cli.verbs.add_command`): each needs its
action, a missing one is a usage error (exit 2), and the action is read back as `action`."""

from __future__ import annotations

import pytest

from gpuop.cli import main

COMMANDS_WITH_ACTIONS = ("bus", "cdi", "driver", "events", "package", "runtime", "sim", "upgrade")


@pytest.mark.parametrize("command", COMMANDS_WITH_ACTIONS)
def test_a_command_without_its_action_is_a_usage_error(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main.parser().parse_args([command])
    assert exited.value.code == main.EXIT_USAGE
    assert "ACTION" in capsys.readouterr().err


def test_the_action_is_read_back_with_its_handler() -> None:
    args = main.parser().parse_args(["bus", "backup", "somewhere"])
    assert (args.verb, args.action, args.dir) == ("bus", "backup", "somewhere")
    assert callable(args.handler)


def test_the_command_keeps_its_description_in_its_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main.parser().parse_args(["runtime", "--help"])
    assert "Configure containerd or CRI-O" in capsys.readouterr().out
