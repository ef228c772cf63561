"""The ``smartnsq`` group imports a command's module only when that command is asked for:
``smartnsq --help`` lists every command from the group's summaries, in the words the
commands themselves give, without loading the clients (aiohttp, pydantic)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import signal
import subprocess
import sys

import click
import pytest

from smartnsq.cli.app import COMMANDS, cli
from tests.cli_support import WAIT, closed_port, killed_at_end, send_signal

#: what a user's ``smartnsq --help`` must not wait for
HEAVY = ("aiohttp", "pydantic", "smartnsq.consumer", "smartnsq.producer", "smartnsq.lookup",
         "smartnsq.nsqd_http", "smartnsq.config")


def _loaded_after(*argv: str) -> set[str]:
    """The heavy modules a fresh ``smartnsq ARGV`` process has loaded when it exits."""
    code = ("import sys\n"
            "from smartnsq.cli import main\n"
            f"code = main({list(argv)!r})\n"
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
            "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.splitlines()[-1].split())


def test_top_help_loads_no_client() -> None:
    assert _loaded_after("--help") == set()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_commands_help_loads_no_client(command: str) -> None:
    assert _loaded_after(command, "--help") == set()


def test_each_summary_is_its_commands_own() -> None:
    """The group's summary of a command is the first sentence of the command's help."""
    for name, where in COMMANDS.items():
        command = getattr(importlib.import_module(where.module), where.attribute)
        assert isinstance(command, click.Command)
        assert command.get_short_help_str(10_000) == where.summary, name


@pytest.mark.parametrize("width", [60, 80, 100, 200])
def test_listing_is_the_one_click_prints_for_the_commands(width: int) -> None:
    """The lazy listing, at any terminal width, is what click prints from the commands."""
    lazy = cli.make_context("smartnsq", [], resilient_parsing=True, terminal_width=width)
    before = cli.get_help(lazy)
    eager = click.Group("smartnsq", params=cli.params, help=cli.help, epilog=cli.epilog,
                        context_settings=cli.context_settings)
    for name in cli.list_commands(lazy):
        command = cli.get_command(lazy, name)
        assert command is not None
        eager.add_command(command, name)
    expected = eager.get_help(eager.make_context("smartnsq", [], resilient_parsing=True,
                                                 terminal_width=width))
    assert before == expected
    listed = before.split("Commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    names = [line.split()[0] for line in listed if line.startswith("  ") and
             not line.startswith("   ")]
    assert names == sorted(COMMANDS)


def test_unknown_command_is_a_usage_error_with_a_suggestion() -> None:
    # click suggests from the commands it has loaded: none yet, with a lazy group
    done = subprocess.run([sys.executable, "-m", "smartnsq", "tial", "orders"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr == "smartnsq: error: No such command 'tial'. Did you mean 'tail'?\n"


@pytest.mark.parametrize("argv", [[], ["topic"]], ids=["smartnsq", "smartnsq topic"])
def test_a_group_alone_shows_its_help(argv: list[str]) -> None:
    """A user's first try, ``smartnsq`` with nothing after it: the help on several lines (it
    came as one 'error:' line holding the whole help)."""
    done = subprocess.run([sys.executable, "-m", "smartnsq", *argv],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2  # click's code for a group called without its command
    assert done.stderr.startswith(f"Usage: smartnsq {' '.join(argv)}".rstrip()), done.stderr
    assert "error:" not in done.stderr and "\nCommands:\n" in done.stderr, done.stderr


def test_dev_names_stay_importable() -> None:
    from smartnsq.cli.app import DevOptions, TopicSpec, build_parser, run_dev

    assert callable(build_parser) and callable(run_dev)
    assert DevOptions.__name__ == "DevOptions" and TopicSpec.__name__ == "TopicSpec"


#: ``smartnsq`` whose ``tail`` module takes seconds to import (a cold disk, a slow network
#: home), saying on stderr when that import began: a Ctrl-C then surely lands inside it (on
#: a fast machine the real import is over before a test's first signal arrives, and tail,
#: running, ends on Ctrl-C with 0 as nsq_tail does)
SLOW_TAIL_IMPORT = """
import sys, time

class SlowTail:
    def find_spec(self, name, path=None, target=None):
        if name == "smartnsq.cli.tail":
            sys.stderr.write("importing smartnsq.cli.tail\\n")
            sys.stderr.flush()
            time.sleep(10)
        return None

sys.meta_path.insert(0, SlowTail())
from smartnsq.cli import main
sys.exit(main())
"""


async def test_ctrl_c_while_a_command_imports_ends_quietly_with_130() -> None:
    """An impatient user's Ctrl-C, again and again, while ``tail``'s module is still being
    imported (after the group's): "interrupted" and 130, as at start-up, never a
    traceback."""
    for _ in range(3):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SLOW_TAIL_IMPORT, "tail", "orders", "--nsqd", closed_port(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        async with killed_at_end(proc):
            async with asyncio.timeout(WAIT):
                line = await proc.stderr.readline()
                assert line == b"importing smartnsq.cli.tail\n", line
                for _ in range(500):  # every 5 ms, at most 2.5 s of them
                    if proc.returncode is not None:
                        break
                    send_signal(proc, signal.SIGINT)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(proc.wait(), 0.005)
                _, err = await proc.communicate()
        said = err.decode().splitlines()
        assert proc.returncode == 130, said
        # (click first ends the terminal's "^C" line)
        assert said[-1:] == ["smartnsq: interrupted"], said
        assert "Traceback" not in err.decode(), said
