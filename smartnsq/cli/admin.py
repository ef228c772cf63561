"""``smartnsq topic create|delete`` and ``smartnsq channel create|delete|set-offset|pause|
unpause|empty``: the admin calls, sent where the server requires them.

youzan: topics are created and deleted on the lookupd leader (:class:`LookupAdmin` follows a
moving leader); channel calls go to each partition's leader nsqd. Stock: topics and channels
live on the nsqds, so the call goes to every nsqd (the ones the lookupds list, or ``--nsqd``).
Each target's answer is printed, one line per target.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import click

from smartnsq.cli.common import (
    CliError,
    Cluster,
    FromParam,
    OutputClosed,
    cluster_options,
    echo,
    one_line,
    pick_cluster,
    topic_argument,
)
from smartnsq.cli.dev import MAX_PARTITIONS
from smartnsq.cli.stopping import command_runner
from smartnsq.cli.wire import http_wire_options, nsqd_http_client
from smartnsq.errors import (
    Flavour,
    LookupdError,
    NsqdHttpError,
    NsqdUnavailableError,
    NSQError,
    ServerError,
    ServerNotLeaderError,
    WrongPortError,
)

# the HTTP client (aiohttp), the lookup client and the protocol (pydantic) load when a
# command runs, not for --help
if TYPE_CHECKING:
    from smartnsq.cli.common import StartAt
    from smartnsq.lookup import Lookup, TopicView
    from smartnsq.nsqd_http import NsqdHttpClient
    from smartnsq.protocol.commands import OffsetSpec

TOPIC_EPILOG = """\b
Examples:
  smartnsq topic create orders --lookupd 127.0.0.1:4161 --partitions 4 --replica 2 --ordered
  smartnsq topic create events --nsqd 127.0.0.1:4151          # stock nsqd
  smartnsq topic delete orders --lookupd 127.0.0.1:4161
"""

CHANNEL_EPILOG = """\b
Examples:
  smartnsq channel create orders billing --lookupd 127.0.0.1:4161
  smartnsq channel set-offset orders billing --to end --lookupd 127.0.0.1:4161
  smartnsq channel set-offset orders billing --to offset:0=4096,1=0 --lookupd 127.0.0.1:4161
  smartnsq channel pause orders billing --partition 2 --lookupd 127.0.0.1:4161
  smartnsq channel empty events audit --nsqd 127.0.0.1:4151
"""


def _channel_arg(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from smartnsq.protocol.validation import check_channel

    try:
        return check_channel(value)
    except NSQError as exc:
        raise click.BadParameter(one_line(str(exc)), ctx, param) from None


@dataclass(frozen=True)
class Target:
    """One nsqd to call (with the youzan partition it leads, or None)."""

    http_address: str
    partition: int | None
    #: why it is not called: it gave no answer to the /info asked first, and the call would
    #: only wait as long again (a silent nsqd: the HTTP timeout twice)
    unreachable: str | None = None

    def label(self) -> str:
        where = f"partition {self.partition} @ " if self.partition is not None else ""
        return f"{where}nsqd {self.http_address}"


async def _flavour(lk: Lookup, view: TopicView | None = None) -> Flavour:
    if view is not None and view.flavour is not Flavour.UNKNOWN:
        return view.flavour
    nodes = await lk.admin.nodes()
    if lk.leader is not None or any(
            Flavour.of_version(n.version) is Flavour.YOUZAN or n.partitions for n in nodes):
        return Flavour.YOUZAN
    return Flavour.STOCK


# A youzan topic created moments ago refuses channels with E_FAILED_ON_NOT_LEADER, even on its
# leader, until lookupd's next topic check hands the leader its session (docs/protocol.md §13.2.4).
NEW_TOPIC_WAIT = 90.0


Call = Callable[["NsqdHttpClient", Target], Awaitable[str]]


def failure(exc: NsqdHttpError | ServerError) -> str:
    """A failed call's answer as the CLI prints it (the target is named beside it)."""
    if isinstance(exc, ServerError):
        return f"{exc.server_code} {exc.text}".strip()
    return f"HTTP {exc.status}: {exc.reason}" if exc.status is not None else exc.reason


async def _call_all(targets: list[Target], call: Call, what: str, *,
                    wait_not_leader: float = 0.0) -> None:
    """Run ``call`` on every target (one HTTP session for all), print each answer; fail if
    any target failed.

    With ``wait_not_leader`` a target answering E_FAILED_ON_NOT_LEADER is asked again, with
    growing pauses, for at most that many seconds."""
    loop = asyncio.get_running_loop()

    async def one(nsqd: NsqdHttpClient, t: Target) -> tuple[Target, str, bool]:
        deadline = loop.time() + wait_not_leader
        pause = 0.1
        if t.unreachable is not None:
            return t, t.unreachable, False
        while True:
            try:
                return t, await call(nsqd, t), True
            except (NsqdHttpError, ServerError) as exc:
                retry = isinstance(exc, ServerNotLeaderError) and loop.time() + pause < deadline
                if not retry:
                    return t, failure(exc), False
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    async with nsqd_http_client() as nsqd:
        results = await asyncio.gather(*(one(nsqd, t) for t in targets))
    failed = sum(not ok for _, _, ok in results)
    closed: OutputClosed | None = None
    try:
        for t, answer, _ in results:
            echo(f"{what}: {t.label()}: {answer}")
    except OutputClosed as exc:
        closed = exc  # a failed target still says so (on stderr) and exits non-zero
    if failed:
        raise CliError(f"{what} failed on {failed} of {len(results)} nsqd target(s)")
    if closed is not None:
        raise closed


# -- topic -----------------------------------------------------------------------------------


def _topic_call(action: str, name: str) -> Call:
    return lambda nsqd, t: nsqd.topic(t.http_address, action, name)


@click.group(epilog=TOPIC_EPILOG)
def topic() -> None:
    """Create or delete a topic."""


@topic.command("create", epilog=TOPIC_EPILOG)
@click.argument("name", callback=topic_argument)
@cluster_options(nsqd_kind="http")
@click.option("--partitions", type=click.IntRange(1, MAX_PARTITIONS), default=1,
              show_default=True, help="youzan: number of partitions")
@click.option("--replica", type=click.IntRange(1, 5), default=1, show_default=True,
              help="youzan: replicas per partition")
@click.option("--ordered", is_flag=True, help="youzan: an ordered topic (SUB_ORDERED only)")
@click.option("--ext", is_flag=True, help="youzan: messages carry a JSON ext header")
@click.option("--multi-part", is_flag=True, help="youzan: several partitions per nsqd")
@click.option("--disable-channel-auto-create", is_flag=True,
              help="youzan: channels must be created on lookupd first")
@click.option("--retention-days", type=click.IntRange(min=0), help="youzan: retention")
@http_wire_options
@command_runner
async def topic_create(name: str, lookupd: tuple[str, ...], nsqd: tuple[str, ...],
                       partitions: int, replica: int, ordered: bool, ext: bool,
                       multi_part: bool, disable_channel_auto_create: bool,
                       retention_days: int | None) -> None:
    """Create topic NAME (youzan: on the lookupd leader; stock: on every nsqd)."""
    cluster = pick_cluster(lookupd, nsqd)
    youzan_opts = (partitions != 1 or replica != 1 or ordered or ext or multi_part
                   or disable_channel_auto_create or retention_days is not None)
    if cluster.nsqd:
        if youzan_opts:
            raise click.UsageError("partitions, replicas and topic flags are youzan options; "
                                   "give --lookupd (youzan creates topics on nsqlookupd)")
        await _call_all([Target(a, None) for a in cluster.nsqd],
                        _topic_call("create", name), "topic create")
        return
    async with cluster.lookup() as lk:
        if await _flavour(lk) is Flavour.STOCK:
            if youzan_opts:
                raise CliError("these lookupds are stock nsqlookupd: partitions, replicas and "
                               "topic flags need youzan")
            await _call_all(await _stock_nodes(lk), _topic_call("create", name),
                            "topic create")
            return
        try:
            took = await lk.admin.create_topic(
                name, partitions, replica, ordered=ordered, ext=ext, multi_part=multi_part,
                disable_channel_auto_create=disable_channel_auto_create,
                retention_days=retention_days)
        except LookupdError as exc:
            hint = ""
            if "No node is available" in str(exc):
                hint = await _nodes_hint(lk, partitions, replica, ordered or multi_part)
            raise CliError(f"topic create {name}: {exc}{hint}") from None
    echo(f"topic create: lookupd {', '.join(took)}: OK ({partitions} partition(s), "
         f"replica {replica})")


async def _nodes_hint(lk: Lookup, partitions: int, replica: int, shared: bool) -> str:
    """Why youzan found no node: its bare error does not say how many the shape needs."""
    need = replica if shared else partitions * replica
    try:
        have = len([n for n in await lk.admin.nodes() if n.http_port])
    except (LookupdError, NSQError):
        return ""
    if shared:
        why = f"{replica} replica(s) each on its own nsqd"
    else:
        why = (f"{partitions} partition(s) x {replica} replica(s), each on its own nsqd "
               "unless --ordered or --multi-part")
    return (f" (needs {need} nsqd for {why}; the lookupd knows {have}: start more nsqd, "
            "or ask for fewer)")


@topic.command("delete", epilog=TOPIC_EPILOG)
@click.argument("name", callback=topic_argument)
@cluster_options(nsqd_kind="http")
@http_wire_options
@command_runner
async def topic_delete(name: str, lookupd: tuple[str, ...], nsqd: tuple[str, ...]) -> None:
    """Delete topic NAME and its messages (youzan: every partition, on the lookupd leader;
    stock: on every nsqd that has it, then on the lookupds)."""
    cluster = pick_cluster(lookupd, nsqd)
    if cluster.nsqd:
        await _call_all([Target(a, None) for a in cluster.nsqd],
                        _topic_call("delete", name), "topic delete")
        return
    async with cluster.lookup() as lk:
        view = await lk.lookup(name, "r")
        if view.not_found or not view.nodes:
            raise CliError(f"topic {name!r} not found on lookupd "
                           f"{', '.join(view.answered_by) or ', '.join(lk.seeds)}")
        if await _flavour(lk, view) is Flavour.STOCK:
            await _call_all([Target(n.http_address, None) for n in view.nodes.values()],
                            _topic_call("delete", name), "topic delete")
        # stock: the lookupds keep listing a topic nsqd deleted (nsqadmin deletes on both)
        await _lookupd_write(lk.admin.delete_topic(name), f"topic delete {name}",
                             "topic delete")


async def _lookupd_write(write: Awaitable[tuple[str, ...]], failed: str, done: str) -> None:
    try:
        took = await write
    except LookupdError as exc:
        raise CliError(f"{failed}: {exc}") from None
    echo(f"{done}: lookupd {', '.join(took)}: OK")


async def _stock_nodes(lk: Lookup) -> list[Target]:
    nodes = await lk.admin.nodes()
    targets = [Target(n.http_address, None) for n in nodes if n.http_port]
    if not targets:
        raise CliError(f"no nsqd registered with lookupd {', '.join(lk.seeds)}")
    return targets


# -- channel ---------------------------------------------------------------------------------


@click.group(epilog=CHANNEL_EPILOG)
def channel() -> None:
    """Create, delete, reposition, pause, unpause or empty a channel."""


def _channel_command(action: str, doc: str) -> click.Command:
    @click.argument("topic_name", metavar="TOPIC", callback=topic_argument)
    @click.argument("channel_name", metavar="CHANNEL", callback=_channel_arg)
    @cluster_options(nsqd_kind="http")
    @click.option("--partition", "partitions", type=click.IntRange(min=0), multiple=True,
                  help="youzan: only this partition (repeatable; default every partition)")
    @http_wire_options
    @command_runner
    async def command(topic_name: str, channel_name: str, lookupd: tuple[str, ...],
                      nsqd: tuple[str, ...], partitions: tuple[int, ...]) -> None:
        cluster = pick_cluster(lookupd, nsqd)
        targets = await _channel_targets(cluster, topic_name, channel_name, partitions,
                                         register=action == "create")
        await _call_all(targets, lambda n, t: n.channel(t.http_address, action, topic_name,
                                                        channel_name, t.partition),
                        f"channel {action}",
                        wait_not_leader=NEW_TOPIC_WAIT if action == "create" else 0.0)
        if action == "delete" and not cluster.nsqd and all(t.partition is None
                                                           for t in targets):
            # stock: the lookupds keep listing a channel nsqd deleted (as for topics)
            async with cluster.lookup() as lk:
                await _lookupd_write(lk.admin.delete_channel(topic_name, channel_name),
                                     f"channel delete {topic_name}/{channel_name}",
                                     "channel delete")

    command.__doc__ = doc
    return click.command(action, epilog=CHANNEL_EPILOG)(command)


for _action, _doc in (
        ("create", "Create CHANNEL on TOPIC (youzan: on every partition's leader, waiting up to "
                    "90 s while a topic created moments ago is not usable yet)."),
        ("delete", "Delete CHANNEL of TOPIC."),
        ("empty", "Drop every message waiting in CHANNEL (youzan: move it to the end)."),
        ("pause", "Stop delivering CHANNEL's messages to its consumers."),
        ("unpause", "Resume delivering CHANNEL's messages.")):
    channel.add_command(_channel_command(_action, _doc))


@channel.command("set-offset", epilog=CHANNEL_EPILOG)
@click.argument("topic_name", metavar="TOPIC", callback=topic_argument)
@click.argument("channel_name", metavar="CHANNEL", callback=_channel_arg)
@cluster_options(nsqd=False)
@click.option("--to", "position", type=FromParam(), required=True,
              help="earliest | end | offset:P=N,... | count:P=N,... | timestamp:T")
@click.option("--partition", "partitions", type=click.IntRange(min=0), multiple=True,
              help="only this partition (repeatable; default every partition)")
@command_runner
async def set_offset(topic_name: str, channel_name: str, lookupd: tuple[str, ...],
                     position: StartAt, partitions: tuple[int, ...]) -> None:
    """youzan: move CHANNEL of TOPIC to a position (on each partition's leader)."""
    cluster = pick_cluster(lookupd, (), allow_nsqd=False)
    if isinstance(position, dict):
        if partitions:
            raise click.UsageError("--to offset:/count: names its partitions; drop --partition")
        partitions = tuple(sorted(position))
    targets = await _channel_targets(cluster, topic_name, channel_name, partitions,
                                     youzan_only="set-offset")

    def spec(t: Target) -> OffsetSpec:
        assert t.partition is not None
        return position[t.partition] if isinstance(position, dict) else position

    targets = await _refuse_past_end(targets, topic_name, spec)
    await _call_all(targets, lambda n, t: n.set_offset(t.http_address, topic_name,
                                                       channel_name, t.partition or 0,
                                                       spec(t)),
                    "channel set-offset")


async def _refuse_past_end(targets: list[Target], topic: str,
                           spec: Callable[[Target], OffsetSpec]) -> list[Target]:
    """Refuse, before any partition moves, an offset or count past a partition's end: youzan
    takes it and moves the channel to the end (0.3.7-HA answers 200 with an empty body to
    ``virtual_queue:1000000`` on a 510-byte partition), skipping every message a mistyped
    number never meant to. ``count:`` one past the last message is the end, as youzan counts
    from 1. A partition whose /stats cannot be read is left to the call to report; one whose
    nsqd gave no answer at all comes back marked unreachable (the call would only wait the
    timeout again). Returns the targets to call."""
    checks = [(t, spec(t)) for t in targets
              if t.partition is not None and spec(t).kind in ("virtual_queue", "msgcount")]
    if not checks:
        return targets
    from smartnsq.nsqd_http import PartitionStats

    async with nsqd_http_client() as http:
        found = await asyncio.gather(
            *(http.partition_stats(t.http_address, topic, t.partition or 0)
              for t, _ in checks), return_exceptions=True)
    past = []
    silent: dict[Target, str] = {}
    for (t, offset), st in zip(checks, found, strict=True):
        if isinstance(st, NsqdUnavailableError) and _no_answer(st):
            silent[t] = failure(st)
        if not isinstance(st, PartitionStats):
            continue
        if offset.kind == "virtual_queue" and offset.value > st.end:
            past.append(f"partition {t.partition}: offset {offset.value} is past its end "
                        f"({st.end})")
        elif offset.kind == "msgcount" and offset.value > st.message_count + 1:
            past.append(f"partition {t.partition}: count {offset.value} is past its "
                        f"{st.message_count} message(s)")
    if past:
        raise CliError(f"channel set-offset: nothing moved: {'; '.join(past)}; youzan would "
                       "move the channel to the end (--to end does that)")
    return [replace(t, unreachable=silent[t]) if t in silent else t for t in targets]


def _no_answer(exc: NsqdUnavailableError) -> bool:
    """The nsqd gave no answer at all (refused, reset, timed out): not another kind of port,
    not a body that could not be read."""
    return exc.status is None and not isinstance(exc, WrongPortError)


async def _partition_targets(addresses: tuple[str, ...], partition: int) -> list[Target]:
    """``--partition`` with ``--nsqd``: refused when an nsqd's /info names a stock version,
    since stock nsqd ignores the partition parameter and would act on the whole channel (a
    youzan version carries ``HA``). An nsqd whose /info tells nothing gets the call as asked:
    its own answer says whether it took it."""
    async with nsqd_http_client() as http:
        versions = await asyncio.gather(*(_version(http, a) for a in addresses))
    targets = []
    for address, version in zip(addresses, versions, strict=True):
        if not isinstance(version, str):
            targets.append(Target(address, partition, failure(version)))
        elif Flavour.of_version(version) is Flavour.STOCK:
            raise CliError(f"--partition: nsqd {address} is stock NSQ (version {version}): "
                           "its topics are not partitioned; without --partition the command "
                           "acts on the whole channel")
        else:
            targets.append(Target(address, partition))
    return targets


async def _nsqd_targets(addresses: tuple[str, ...], topic: str) -> list[Target]:
    """``--nsqd`` without ``--partition``: the whole channel on a stock nsqd; on a youzan nsqd
    every partition of ``topic`` it leads. youzan acts on one partition when a call names
    none, one the nsqd holds picked by Go's map order (0.3.7-HA: partition 2 eleven times and
    5 once in 12 pauses on an nsqd leading both), where a user means them all."""
    targets: list[Target] = []
    async with nsqd_http_client() as http:
        versions = await asyncio.gather(*(_version(http, a) for a in addresses))
        for address, version in zip(addresses, versions, strict=True):
            if not isinstance(version, str):
                targets.append(Target(address, None, failure(version)))
                continue
            if Flavour.of_version(version) is not Flavour.YOUZAN:
                targets.append(Target(address, None))
                continue
            try:
                stats = await http.stats(address, topic)
            except NSQError as exc:
                raise CliError(f"nsqd {address}: cannot list the partitions of {topic!r} it "
                               f"leads: {one_line(str(exc))}") from None
            led = sorted({int(t["topic_partition"]) for t in stats["topics"]
                          if isinstance(t, dict) and t.get("topic_name") == topic
                          and str(t.get("topic_partition", "")).isdigit()
                          and t.get("is_leader") is not False})
            if not led:
                raise CliError(f"nsqd {address} (youzan) leads no partition of topic "
                               f"{topic!r}: give --lookupd to reach every partition's leader")
            targets += [Target(address, p) for p in led]
    return targets


async def _version(http: NsqdHttpClient, address: str) -> str | NsqdUnavailableError:
    """The version in the nsqd's /info; empty when it does not say; the error when the nsqd
    gave no answer at all (refused, reset, timed out)."""
    try:
        info = await http.info(address)
    except NsqdUnavailableError as exc:
        if _no_answer(exc):
            return exc
        return ""  # another port, or a body not read: the call itself says what it is
    except NSQError:
        return ""
    version = info.get("version")
    return version if isinstance(version, str) else ""


async def _channel_targets(cluster: Cluster, topic: str, channel: str,
                           partitions: tuple[int, ...], *, register: bool = False,
                           youzan_only: str | None = None) -> list[Target]:
    if cluster.nsqd:
        if len(partitions) > 1:
            raise click.UsageError("with --nsqd give at most one --partition")
        if partitions:
            return await _partition_targets(cluster.nsqd, partitions[0])
        return await _nsqd_targets(cluster.nsqd, topic)
    async with cluster.lookup() as lk:
        view = await lk.lookup(topic, "r")
        if view.not_found or not view.nodes:
            raise CliError(f"topic {topic!r} not found on lookupd "
                           f"{', '.join(view.answered_by) or ', '.join(lk.seeds)}")
        if not view.is_partitioned:
            if youzan_only:
                raise CliError(f"{youzan_only} needs youzan nsqd: topic {topic!r} is on stock "
                               "nsqd")
            if partitions:
                raise CliError(f"--partition: topic {topic!r} is not partitioned (stock NSQ)")
            return [Target(n.http_address, None) for n in view.nodes.values()]
        for p in partitions:
            if p >= view.partition_num:
                raise CliError(f"no partition {p}: topic {topic!r} has partitions "
                               f"0..{view.partition_num - 1}")
        if register and view.disable_channel_auto_create:
            # such topics only take channels lookupd knows about
            await lk.admin.create_channel(topic, channel)
        wanted = partitions or tuple(range(view.partition_num))
        missing = [p for p in wanted if view.leader(p) is None]
        if missing:
            raise CliError(f"topic {topic!r}: no leader for partition(s) "
                           f"{', '.join(map(str, missing))} right now; retry")
        return [Target(view.partitions[p].http_address, p) for p in wanted]
