"""The ``smartnsq`` command line's group and its commands (click for arguments, rich for
terminal output); :func:`smartnsq.cli.main` checks the extra is installed, then runs it.

One module per command family: ``tail``, ``publish``, ``archive`` (``to-file``), ``bridge``,
``stat``, ``lookup`` and ``admin`` (``topic …``, ``channel …``), ``dev`` (the embedded
cluster); shared options and error handling live in ``common``. Every command is a thin layer
over the public client API.

click rather than typer: it is what typer wraps anyway, it ships its own type hints (clean
under ``mypy --strict`` without plugins), and repeatable options, custom value types and
the command groups here map onto it directly.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import click

from smartnsq import __version__
from smartnsq.cli.common import (
    OutputClosed,
    cli_logging,
    one_line,
    writing_stdout,
)
from smartnsq.cli.interrupts import OWN_PROCESS, guard_imports, ignore_further_ctrl_c
from smartnsq.cli.stopping import EXIT_INTERRUPTED

if TYPE_CHECKING:
    from smartnsq.cli.dev import DevOptions, TopicSpec, build_parser, run_dev

__all__ = ["DevOptions", "TopicSpec", "build_parser", "cli", "main", "run_dev"]


class LazyCommand(NamedTuple):
    """Where a command lives, and its summary for the group's listing (the first sentence
    of the command's help: tests/test_cli_lazy.py checks they agree)."""

    module: str
    attribute: str
    summary: str


#: the group's commands, imported when asked for: ``smartnsq --help`` lists them from here,
#: so it loads none of the clients (aiohttp, pydantic); ``smartnsq tail`` loads only tail's
COMMANDS: dict[str, LazyCommand] = {
    "bridge": LazyCommand(
        "smartnsq.cli.bridge", "bridge",
        "Forward TOPIC from one cluster to DEST_TOPIC (default: the same name) on another, "
        "finishing each message on the source only after the destination acknowledged it."),
    "channel": LazyCommand(
        "smartnsq.cli.admin", "channel",
        "Create, delete, reposition, pause, unpause or empty a channel."),
    "dev": LazyCommand(
        "smartnsq.cli.dev", "dev",
        "Run an in-process nsqlookupd + nsqd cluster until interrupted (Ctrl-C or SIGTERM) "
        "and print its addresses: one '<kind> <host:port>' per line, then 'ready'."),
    "lookup": LazyCommand(
        "smartnsq.cli.lookup", "lookup",
        "Show how the lookupds see TOPIC, merged the way the clients merge it."),
    "publish": LazyCommand(
        "smartnsq.cli.publish", "publish",
        "Publish one message per record of FILEs (or stdin; '-' is stdin too) to TOPIC; "
        "records from a pipe are published as they arrive (with --batch, a batch at a "
        "time)."),
    "stat": LazyCommand(
        "smartnsq.cli.stat", "stat",
        "Live statistics of every topic (or TOPIC) on every nsqd: partitions, leaders and "
        "replicas, depths, in flight, deferred, rates, lag, clients; with --client-metrics, "
        "the consuming clients' own counts beside them."),
    "tail": LazyCommand(
        "smartnsq.cli.tail", "tail", "Print the messages of TOPIC as they arrive."),
    "to-file": LazyCommand(
        "smartnsq.cli.archive", "to_file",
        "Archive TOPIC into files in --output-dir (at-least-once: a message is finished only "
        "after the file holding it has been flushed and synced)."),
    "topic": LazyCommand("smartnsq.cli.admin", "topic", "Create or delete a topic."),
}


def __getattr__(name: str) -> Any:
    # dev's names stay importable from here without loading dev (and the protocol) up front
    if name in ("DevOptions", "TopicSpec", "build_parser", "run_dev"):
        return getattr(importlib.import_module("smartnsq.cli.dev"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

EPILOG = """\b
Examples:
  smartnsq dev --flavour youzan --nodes 3 --topic orders:4
  smartnsq lookup orders --lookupd 127.0.0.1:4161
  smartnsq tail orders --lookupd 127.0.0.1:4161 --from earliest -n 10
  printf 'a\\nb\\n' | smartnsq publish orders --lookupd 127.0.0.1:4161
  smartnsq stat --lookupd 127.0.0.1:4161 --once --json

\b
Exit codes: 0 done (also when the output was closed, | head, and when Ctrl-C or SIGTERM
stopped tail, stat, to-file or bridge gracefully), 1 error, 2 usage error; publish stopped
before its input's end: 130 after Ctrl-C, 143 after SIGTERM, 141 when publish --trace's
reader went away.
"""


class SmartnsqGroup(click.Group):
    """Every failure ends as one line on stderr and a non-zero exit code, never a traceback;
    a closed stdout ends a command quietly (exit code 0). The commands of :data:`COMMANDS`
    are imported when one is asked for (click's "lazy group")."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = self.commands.get(cmd_name)
        if command is None and cmd_name in COMMANDS:
            where = COMMANDS[cmd_name]
            # Ctrl-C during the import: "interrupted" and 130 as at start-up (run_main)
            undo = guard_imports()
            try:
                module = importlib.import_module(where.module)
            finally:
                undo()
            command = getattr(module, where.attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{where.module}.{where.attribute} is not a click command")
            self.add_command(command, cmd_name)
        return command

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:
            # click suggests from the commands loaded so far (none, here): from all of them
            if exc.possibilities:
                raise
            raise click.exceptions.NoSuchCommand(
                exc.command_name, possibilities=self.list_commands(ctx), ctx=ctx) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, from the summaries of :data:`COMMANDS` for the commands not
        imported yet: a stand-in command with the summary as its help is shortened to the
        width exactly as the command itself would be."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            command = self.commands.get(name) or click.Command(name, help=COMMANDS[name].summary)
            if not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        # click's own output (--help, --version) to a closed or failing stdout: as a
        # command's own writes end, not with click's exit code 1 or an internal error
        with writing_stdout():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with writing_stdout():  # a command's --help, and what click itself prints
            return super().invoke(ctx)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        code = self.run_main(args, prog_name, complete_var, windows_expand_args, **extra)
        if standalone_mode:
            sys.exit(code)
        return code

    def run_main(self, args: Sequence[str] | None, prog_name: str | None,
                 complete_var: str | None, windows_expand_args: bool, **extra: Any) -> int:
        try:
            rv = super().main(args, prog_name or "smartnsq", complete_var,
                              standalone_mode=False,
                              windows_expand_args=windows_expand_args, **extra)
        except (click.exceptions.Abort, KeyboardInterrupt):
            # a further Ctrl-C while the process ends says nothing more
            ignore_further_ctrl_c()
            print("smartnsq: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        except click.exceptions.Exit as exc:
            return exc.exit_code
        except OutputClosed:
            return 0
        except click.exceptions.NoArgsIsHelpError as exc:
            # `smartnsq` (or `smartnsq topic`) alone: the help, as click shows it, not as an
            # error squeezed into one line
            exc.show()
            return exc.exit_code
        except click.ClickException as exc:
            where = ""
            if isinstance(exc, click.UsageError) and exc.ctx is not None \
                    and exc.ctx.parent is not None:  # the group itself: "smartnsq: error:"
                where = f"{exc.ctx.command_path}: "
            print(f"smartnsq: error: {where}{one_line(exc.format_message())}", file=sys.stderr)
            return exc.exit_code
        except Exception as exc:  # a bug of ours: still one line, the traceback on request
            if os.environ.get("SMARTNSQ_TRACEBACK"):
                traceback.print_exc()
            print(f"smartnsq: internal error: {type(exc).__name__}: {one_line(str(exc))}",
                  file=sys.stderr)
            return 1
        return rv if isinstance(rv, int) else 0


@click.group(cls=SmartnsqGroup, epilog=EPILOG,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="smartnsq")
@click.option("-v", "--verbose", count=True,
              help="show the library's log: -v warnings, -vv info, -vvv debug")
@click.pass_context
def cli(ctx: click.Context, verbose: int) -> None:
    """Operators' tools for NSQ: stock nsqd and youzan's partitioned NSQ."""
    if ctx.invoked_subcommand != "dev":  # dev logs as it always did
        ctx.with_resource(cli_logging(verbose))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``smartnsq`` console script."""
    token = OWN_PROCESS.set(True)
    try:
        result: int = cli.main(list(argv) if argv is not None else None,
                               standalone_mode=False)
    finally:
        OWN_PROCESS.reset(token)
    return result
