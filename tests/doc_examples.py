"""The examples of README.md and of the documentation site (docs/**/*.md), found and run.

A fenced ``python`` or ``bash`` block is an example; the marker comment right before it says
what it needs (a marker may be indented with its block, inside a tab or an admonition):

* ``<!-- example: standalone -->``: needs no cluster (it starts its own, or none);
* ``<!-- example: stock -->``: a stock nsqd with an nsqlookupd;
* ``<!-- example: youzan orders:3:billing -->``: a 3-node youzan cluster with these topics
  (``topic:partitions:channel,channel``, then ``:ordered``, ``:ext`` or ``:ordered+ext``
  for an ordered topic, one with JSON headers): youzan topics are made by an operator,
  with a channel before the first publish;
* ``publish=topic:count`` after either: messages already in the topic when the example runs;
* ``spark`` before the rest: a Spark example (``tests/spark/test_doc_spark_examples.py``);
* ``cli`` before the rest: a shell session (``bash -euo pipefail``, the ``smartnsq`` of this
  environment on the PATH). ``session=NAME`` joins the page's blocks of that name into one
  session, run in page order on one cluster and in one directory, as a reader would type
  them; without it a block is a session of its own;
* ``pytest``: a test module of a user, run by pytest with the plugin (``smartnsq.testing``);
* ``peer``: another library's code shown for comparison (the migration pages): not run.

Every example runs in a fresh interpreter (or shell), exactly as written except for the
addresses: ``127.0.0.1:4150`` (nsqd TCP), ``127.0.0.1:4151`` (nsqd HTTP) and
``127.0.0.1:4161`` (nsqlookupd HTTP) become the servers' (:class:`Servers`: the embedded
cluster's, or real ones in ``tests/test_doc_examples_real.py``), and the metrics ports the
docs serve on (``9108``, ``9109``) become free ones, so that an exporter already listening
there cannot fail an example. On a shared real server an example's topics may be given names
of their own (``topics``: :func:`with_topics`). Commands shown but not run (installs, servers
that run until Ctrl-C) are ``sh`` blocks, output is ``text``.

An example (a shell session: all its blocks together) has :data:`EXAMPLE_TIMEOUT`; the tests
that run them allow :data:`TEST_TIMEOUT`, so that an example running past its time fails with
what it printed until then, not with pytest's bare timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from smartnsq import Producer
from smartnsq.devcluster import DevCluster

ROOT = Path(__file__).resolve().parent.parent
#: how long one example, or one shell session, may run (a Spark one starts a JVM)
EXAMPLE_TIMEOUT = 120.0
#: the pytest timeout of a test that runs one: the example's time, its cluster's start and stop
TEST_TIMEOUT = EXAMPLE_TIMEOUT + 60.0
#: the languages whose blocks are examples and need a marker
EXAMPLE_LANGS = ("python", "bash")

_BLOCK = re.compile(r"^(?P<indent>[ \t]*)<!-- example: (?P<kind>[^>]*?) -->\n"
                    r"(?P=indent)```(?P<lang>\w*)\n(?P<code>.*?)^(?P=indent)```",
                    re.S | re.M)
_FENCE = re.compile(r"^[ \t]*```(?P<lang>\w+)[ \t]*$", re.M)


def pages() -> list[Path]:
    """README.md and every page of the site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    kind: str
    lang: str
    code: str

    @property
    def flavour(self) -> str:
        return self.kind.split()[0]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}:{self.flavour}"

    def option(self, name: str) -> str | None:
        for word in self.kind.split():
            if word.startswith(name + "="):
                return word.removeprefix(name + "=")
        return None


def examples(path: Path) -> list[Example]:
    text = path.read_text()
    page = path.relative_to(ROOT).as_posix()
    found = []
    for m in _BLOCK.finditer(text):
        indent = m["indent"]
        code = "".join(line.removeprefix(indent) for line in m["code"].splitlines(True))
        found.append(Example(page, text.count("\n", 0, m.start()) + 2, m["kind"].strip(),
                             m["lang"], textwrap.dedent(code)))
    return found


def unmarked(path: Path) -> list[int]:
    """Lines of the example blocks (python, bash) of ``path`` that have no marker."""
    text = path.read_text()
    marked = {e.line for e in examples(path)}
    return [line for m in _FENCE.finditer(text) if m["lang"] in EXAMPLE_LANGS
            if (line := text.count("\n", 0, m.start()) + 1) not in marked]


def all_examples() -> list[Example]:
    return [e for page in pages() for e in examples(page)]


def runnable(flavour: str) -> list[Example]:
    """The examples of one kind: ``standalone``, ``stock`` and ``youzan`` together are
    ``python``."""
    if flavour == "python":
        return [e for e in all_examples() if e.flavour in ("standalone", "stock", "youzan")]
    return [e for e in all_examples() if e.flavour == flavour]


def sessions() -> list[list[Example]]:
    """The shell sessions: the blocks of one ``session=`` name on one page, in page order."""
    grouped: dict[tuple[str, str], list[Example]] = {}
    for e in runnable("cli"):
        grouped.setdefault((e.page, e.option("session") or e.id), []).append(e)
    return list(grouped.values())


#: the default addresses the docs write, each a whole address (not a prefix of a longer port)
_DOC_ADDRESS = re.compile(r"127\.0\.0\.1:(4150|4151|4161)(?!\d)")
#: the metrics ports the docs serve on, each a whole number
_DOC_METRICS_PORT = re.compile(r"(?<!\d)(9108|9109)(?!\d)")


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Servers(Protocol):
    """Where an example runs: a :class:`DevCluster`, or real servers by address."""

    @property
    def nsqd_tcp_addresses(self) -> list[str]: ...

    @property
    def nsqd_http_addresses(self) -> list[str]: ...

    @property
    def lookupd_http_addresses(self) -> list[str]: ...


def with_addresses(code: str, cluster: Servers, ports: dict[str, str] | None = None,
                   topics: Mapping[str, str] | None = None) -> str:
    """``code`` with its topics renamed (:func:`with_topics`), then the docs' default
    addresses made the cluster's, in one pass: replacing them one after another would
    rewrite an address already put in (a TCP port 41515 would then have its
    ``127.0.0.1:4151`` taken for the HTTP address). Then its metrics ports made ``ports``'
    (:func:`with_metrics_ports`)."""
    real = {"4150": cluster.nsqd_tcp_addresses[0], "4151": cluster.nsqd_http_addresses[0],
            "4161": cluster.lookupd_http_addresses[0]}
    code = _DOC_ADDRESS.sub(lambda m: real[m.group(1)], with_topics(code, topics or {}))
    return with_metrics_ports(code, ports)


#: a word of a topic name: where it starts and ends (``payments`` is not in ``payments.dead``)
_NAME_WORD = re.compile(r"[\w.-]+")


def with_topics(code: str, topics: Mapping[str, str]) -> str:
    """``code`` with each topic name of ``topics`` that stands as a whole word (letters,
    digits, ``_``, ``.``, ``-`` end it) renamed to its value."""
    if not topics:
        return code
    return _NAME_WORD.sub(lambda m: topics.get(m.group(0), m.group(0)), code)


def words(code: str) -> set[str]:
    """The words of ``code`` that could be topic names (as :func:`with_topics` sees them)."""
    return set(_NAME_WORD.findall(code))


def with_metrics_ports(code: str, ports: dict[str, str] | None = None) -> str:
    """``code`` with each metrics port of the docs (9108, 9109: a whole number, not part of
    a longer one) made ``ports``' (default: a free port each)."""
    if ports is None:
        ports = {p: str(free_port()) for p in ("9108", "9109")}
    return _DOC_METRICS_PORT.sub(lambda m: ports[m.group(1)], code)


async def run_process(*args: str, cwd: Path | None = None, what: str = "the example",
                      env: dict[str, str] | None = None, within: float = EXAMPLE_TIMEOUT) -> str:
    """Run a process to its end within ``within`` seconds; its output (stdout and stderr); it
    must exit 0. One that runs past its time is killed, and the error shows what it printed
    until then."""
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=cwd,
        env=env)
    assert proc.stdout is not None
    out = bytearray()
    try:
        async with asyncio.timeout(within):
            # read as it comes, so that a process killed at its timeout has its output shown
            while chunk := await proc.stdout.read(65536):
                out += chunk
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        printed = out.decode(errors="replace")[-4000:] or "(nothing)"
        raise AssertionError(f"{what} ran past {within:.0f} s; it printed:\n{printed}") \
            from None
    text = out.decode(errors="replace")
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{text}"
    return text


def cluster_spec(kind: str) -> str:
    """The cluster part of a marker: without the leading ``spark`` / ``cli`` / ``pytest``
    word and without ``session=``."""
    words = kind.split()
    if words and words[0] in ("spark", "cli", "pytest"):
        words = words[1:]
    return " ".join(w for w in words if not w.startswith("session="))


@dataclass(frozen=True)
class TopicSpec:
    """A topic of a youzan marker (``name:partitions:channels:flags``)."""

    name: str
    partitions: int
    channels: tuple[str, ...]
    ordered: bool
    ext: bool


@dataclass(frozen=True)
class Needs:
    """What a marker asks for: the cluster, its topics, the messages already in them."""

    flavour: str
    topics: tuple[TopicSpec, ...]
    publish: tuple[tuple[str, int], ...]


def needs(kind: str) -> Needs:
    flavour, *specs = cluster_spec(kind).split()
    assert flavour in ("stock", "youzan"), f"unknown example kind {kind!r}"
    topics, publish = [], []
    for spec in specs:
        if spec.startswith("publish="):
            topic, count = spec.removeprefix("publish=").split(":")
            publish.append((topic, int(count)))
            continue
        name, partitions, channels, flags = [*spec.split(":"), "", "", ""][:4]
        kinds = {f for f in flags.split("+") if f}
        assert kinds <= {"ordered", "ext"}, f"bad topic spec {spec!r}"
        chans = tuple(c for c in channels.split(",") if c)
        topics.append(TopicSpec(name, int(partitions or 1), chans, "ordered" in kinds,
                                "ext" in kinds))
    return Needs(flavour, tuple(topics), tuple(publish))


async def preload(servers: Servers, need: Needs, topics: Mapping[str, str] | None = None
                  ) -> None:
    """The marker's ``publish=`` messages, into the topics as ``topics`` names them."""
    if not need.publish:
        return
    # a stock topic is made by its first publish to nsqd; youzan ones exist already
    producer = (Producer(nsqd=servers.nsqd_tcp_addresses) if need.flavour == "stock"
                else Producer(lookupd=servers.lookupd_http_addresses))
    async with producer:
        for topic, count in need.publish:
            for i in range(count):     # one by one: round-robin over the partitions
                await producer.publish(
                    (topics or {}).get(topic, topic),
                    b'{"order": %d, "note": "published before the example"}' % i)


#: a session's ``smartnsq topic create NAME``
_TOPIC_CREATE = re.compile(r"\bsmartnsq topic create ([\w.-]+)")


def created_topics(blocks: Iterable[Example]) -> list[str]:
    """The topics a shell session creates itself."""
    return [name for b in blocks for name in _TOPIC_CREATE.findall(b.code)]


@contextlib.asynccontextmanager
async def example_cluster(kind: str) -> AsyncIterator[DevCluster]:
    """The cluster a marker asks for (see the module docstring)."""
    need = needs(kind)
    async with DevCluster(nodes=1 if need.flavour == "stock" else 3,
                          flavour=need.flavour) as cluster:
        for t in need.topics:
            cluster.create_topic(t.name, partition_num=t.partitions, replica=1,
                                 ordered=t.ordered, ext=t.ext, channels=list(t.channels))
        await preload(cluster, need)
        yield cluster


async def run_python(cluster: Servers, example: Example, cwd: Path | None = None,
                     topics: Mapping[str, str] | None = None) -> str:
    return await run_process(sys.executable, "-c",
                             with_addresses(example.code, cluster, topics=topics),
                             cwd=cwd, what=example.id)


def path_env() -> dict[str, str]:
    """This environment with its own ``smartnsq`` (and python) first on the PATH."""
    bindir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}


async def run_session(cluster: Servers, blocks: Iterable[Example], cwd: Path,
                      topics: Mapping[str, str] | None = None) -> str:
    """Each block with ``bash -euo pipefail`` in turn, all within :data:`EXAMPLE_TIMEOUT`;
    their outputs, concatenated. The session's blocks share its metrics ports, as a reader's
    commands do."""
    out = []
    ports = {p: str(free_port()) for p in ("9108", "9109")}
    deadline = time.monotonic() + EXAMPLE_TIMEOUT
    for block in blocks:
        assert block.lang == "bash", f"{block.id}: a cli example is a bash block"
        code = with_addresses(block.code, cluster, ports, topics)
        out.append(await run_process("bash", "-euo", "pipefail", "-c", code, cwd=cwd,
                                     what=block.id, env=path_env(),
                                     within=max(1.0, deadline - time.monotonic())))
    return "".join(out)
