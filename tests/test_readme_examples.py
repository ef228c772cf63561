"""Every Python example in the README runs, as written, against the embedded cluster.

Each fenced ``python`` block of README.md is preceded by a marker comment saying what it
needs: ``<!-- example: stock -->`` (a stock nsqd and nsqlookupd), ``<!-- example: youzan
orders:3:billing -->`` (a youzan cluster with those topics, partition counts and channels:
youzan topics are created by an operator, with a channel before the first publish), with
``publish=topic:count`` for messages that must be there first; ``spark`` before the rest
marks a Spark example (run by ``tests/spark/test_readme_spark.py``), ``cli`` a shell session
(``bash`` with ``-e`` and pipefail). The block runs in a fresh
interpreter, exactly as written except for the addresses: the README's ``127.0.0.1:4150``
(nsqd TCP), ``127.0.0.1:4151`` (nsqd HTTP) and ``127.0.0.1:4161`` (nsqlookupd HTTP) become
the embedded cluster's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from smartnsq import Producer
from smartnsq.devcluster import DevCluster

README = Path(__file__).resolve().parent.parent / "README.md"

_BLOCK = re.compile(r"<!-- example: (?P<kind>[^>]*?) -->\n```(?P<lang>\w*)\n(?P<code>.*?)```",
                    re.S)
#: how long one example may run (a Spark one starts a JVM)
EXAMPLE_TIMEOUT = 120.0


@dataclass(frozen=True)
class Example:
    line: int
    kind: str
    lang: str
    code: str

    @property
    def id(self) -> str:
        return f"README.md:{self.line}:{self.kind.split()[0]}"


def examples(text: str) -> list[Example]:
    return [Example(text.count("\n", 0, m.start()) + 2, m["kind"].strip(), m["lang"],
                    m["code"]) for m in _BLOCK.finditer(text)]


def test_every_python_block_is_marked() -> None:
    """An unmarked example would silently go untested."""
    text = README.read_text()
    fenced = len(re.findall(r"^```python$", text, re.M))
    marked = sum(1 for e in examples(text) if e.lang == "python")
    assert fenced == marked, "every ```python block in README.md needs an example marker"


def runnable(spark: bool = False) -> list[Example]:
    return [e for e in examples(README.read_text())
            if e.lang == "python" and e.kind.startswith("spark") == spark]


def with_addresses(code: str, nsqd_tcp: str, nsqd_http: str, lookupd: str) -> str:
    return (code.replace("127.0.0.1:4150", nsqd_tcp).replace("127.0.0.1:4151", nsqd_http)
            .replace("127.0.0.1:4161", lookupd))


async def run_example(code: str, cwd: Path | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, cwd=cwd)
    try:
        async with asyncio.timeout(EXAMPLE_TIMEOUT):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"the example ran past {EXAMPLE_TIMEOUT:.0f} s") from None
    text = out.decode(errors="replace")
    assert proc.returncode == 0, f"the example failed ({proc.returncode}):\n{text}"
    return text


@contextlib.asynccontextmanager
async def example_cluster(kind: str) -> AsyncIterator[DevCluster]:
    """The cluster a marker asks for: ``stock`` or ``youzan``, then ``topic:partitions:
    channel,channel`` (youzan) and ``publish=topic:count`` (messages there before the
    example runs)."""
    flavour, *specs = kind.split()
    assert flavour in ("stock", "youzan"), f"unknown example kind {kind!r}"
    async with DevCluster(nodes=1 if flavour == "stock" else 3, flavour=flavour) as cluster:
        publish: list[tuple[str, int]] = []
        for spec in specs:
            if spec.startswith("publish="):
                topic, count = spec.removeprefix("publish=").split(":")
                publish.append((topic, int(count)))
                continue
            name, _, rest = spec.partition(":")
            partitions, _, channels = rest.partition(":")
            cluster.create_topic(name, partition_num=int(partitions or 1), replica=1,
                                 channels=[c for c in channels.split(",") if c])
        if publish:
            async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
                for topic, count in publish:
                    for i in range(count):
                        await producer.publish(topic, b'{"order": %d, "note": "from the '
                                                      b'README test"}' % i)
        yield cluster


async def run_in(cluster: DevCluster, example: Example, cwd: Path | None = None) -> str:
    code = with_addresses(example.code, cluster.nsqd_tcp_addresses[0],
                          cluster.nsqd_http_addresses[0], cluster.lookupd_http_addresses[0])
    return await run_example(code, cwd)


def sessions() -> list[Example]:
    return [e for e in examples(README.read_text()) if e.kind.startswith("cli")]


@pytest.mark.parametrize("example", sessions(), ids=lambda e: e.id)
async def test_readme_command_line_session_runs(example: Example, tmp_path: Path) -> None:
    """A shell session: every command in order, each must succeed (``bash -e`` with
    pipefail), the ``smartnsq`` of this environment on the PATH."""
    assert example.lang == "bash"
    bindir = str(Path(sys.executable).parent)
    async with example_cluster(example.kind.removeprefix("cli").strip()) as cluster:
        script = with_addresses(example.code, cluster.nsqd_tcp_addresses[0],
                                cluster.nsqd_http_addresses[0],
                                cluster.lookupd_http_addresses[0])
        proc = await asyncio.create_subprocess_exec(
            "bash", "-euo", "pipefail", "-c", script, cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"})
        try:
            async with asyncio.timeout(EXAMPLE_TIMEOUT):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError(f"the session ran past {EXAMPLE_TIMEOUT:.0f} s") from None
    text = out.decode(errors="replace")
    assert proc.returncode == 0, f"the session failed ({proc.returncode}):\n{text}"
    assert '"user_id": 1' in text, text  # tail --format json showed the published events


@pytest.mark.parametrize("example", runnable(), ids=lambda e: e.id)
async def test_readme_example_runs(example: Example) -> None:
    async with example_cluster(example.kind) as cluster:
        out = await run_in(cluster, example)
    assert out.strip(), "the example printed nothing"
