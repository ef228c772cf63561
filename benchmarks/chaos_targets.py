"""Where the chaos soak runs and how it injects faults: the embedded cluster or a real one.

Both targets offer the same calls (:class:`Target`): create the soak's topics, and the faults of
the schedule — move a partition leader, kill a node hard and start it again, make the lookupd
unreachable, slow a node down, drop a node's client connections.

* :class:`EmbeddedTarget` runs a 3-node youzan :class:`~smartnsq.devcluster.DevCluster` in a
  child process (``chaos_cluster.py``) so its CPU and memory are not the client's;
* :class:`RealTarget` drives a real youzan cluster started by ``../shared/realnsq/start-youzan.sh``
  over HTTP (topic creation, ``/topic/partition/move``) and by signals: nsqd killed with SIGKILL
  by the pid its start script recorded and started again with the same flags, the lookupd and
  nsqd stalled with SIGSTOP/SIGCONT, client connections to an nsqd destroyed with ``ss -K``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import aiohttp

HERE = Path(__file__).resolve().parent
V1_ACCEPT = {"Accept": "application/vnd.nsq; version=1.0"}
#: a real cluster's metadata catches up within seconds (a new topic 1–8 s, a move 4–7 s)
REAL_SETTLE_SECONDS = 60.0


class TargetError(Exception):
    """A fault or set-up step the target refused (the text says which and why)."""


class Target(Protocol):
    kind: str
    nodes: int

    @property
    def lookupd_http_addresses(self) -> list[str]: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def create_topic(self, name: str, partition_num: int, replica: int, ordered: bool,
                           channel: str) -> None: ...

    async def move_leader(self, topic: str, partition: int) -> str: ...

    async def kill_node(self, node: int) -> str: ...

    async def start_node(self, node: int) -> str: ...

    async def lookupd_down(self, mode: str) -> str: ...

    async def lookupd_up(self) -> None: ...

    async def slow_node(self, node: int, delay: float) -> str: ...

    async def unslow_node(self, node: int) -> None: ...

    async def drop_connections(self, node: int) -> str: ...

    async def server_note(self) -> str: ...


async def move_via_lookupd(session: aiohttp.ClientSession, lookupd: str, topic: str,
                           partition: int, ids: list[str], down: set[int]) -> str:
    """Move a partition's leader with lookupd's ``/topic/partition/move`` (on the lookupd
    leader), from the leader consistent lookups name to the next alive node in ``ids``."""
    async with session.get(f"http://{lookupd}/lookup", headers=V1_ACCEPT,
                           params={"topic": topic, "access": "r", "consistent": "true"}) as r:
        body = await r.json(content_type=None) if r.status == 200 else {}
    peer = (body.get("partitions") or {}).get(str(partition))
    if not peer:
        raise TargetError(f"{topic}/{partition} has no leader in consistent lookups")
    current = str(peer.get("distributed_id") or "")
    alive = [d for i, d in enumerate(ids) if i not in down and d != current]
    if not alive:
        raise TargetError(f"no other alive node to lead {topic}/{partition}")
    # the next node after the current leader, so repeated moves walk round the cluster
    start = ids.index(current) + 1 if current in ids else 0
    to = next(d for d in ids[start:] + ids[:start] if d in alive)
    async with session.get(f"http://{lookupd}/listlookup", headers=V1_ACCEPT) as r:
        leader = (await r.json(content_type=None)).get("lookupdleader") or {}
    where = f"{leader['NodeIP']}:{leader['HttpPort']}" if leader else lookupd
    async with session.post(f"http://{where}/topic/partition/move",
                            params={"topic": topic, "partition": str(partition),
                                    "move_leader": "true", "move_from": current,
                                    "move_to": to}) as r:
        text = await r.text()
        if r.status != 200:
            raise TargetError(f"partition/move {topic}/{partition}: {r.status} {text.strip()}")
    return f"{topic}/{partition}: {current} -> {to} (lookupd accepted the move)"


# ---------------------------------------------------------------------------- embedded


class EmbeddedTarget:
    """The embedded youzan cluster in a child process (see ``chaos_cluster.py``)."""

    kind = "embedded"

    def __init__(self, nodes: int = 3) -> None:
        self.nodes = nodes
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._lookupds: list[str] = []
        self._topics: list[str] = []
        self._ids: list[str] = []
        self._down: set[int] = set()
        self._session: aiohttp.ClientSession | None = None

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return list(self._lookupds)

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, str(HERE / "chaos_cluster.py"), "--nodes", str(self.nodes),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._proc.stdout is not None
        try:
            async with asyncio.timeout(60):
                line = await self._proc.stdout.readline()
        except TimeoutError:
            await self.close()
            raise TargetError("the embedded cluster did not start within 60 s") from None
        if not line:
            await self.close()
            raise TargetError("the embedded cluster exited before it was ready")
        ready = json.loads(line)["ready"]
        self._lookupds = list(ready["lookupd_http"])
        self._ids = list(await self.call("node_ids"))
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def call(self, op: str, **args: Any) -> Any:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise TargetError("the embedded cluster is not running")
        async with self._lock:
            proc.stdin.write(json.dumps({"op": op, "args": args}).encode() + b"\n")
            await proc.stdin.drain()
            async with asyncio.timeout(30):
                line = await proc.stdout.readline()
        if not line:
            raise TargetError(f"the embedded cluster exited during {op}")
        answer = json.loads(line)
        if not answer["ok"]:
            raise TargetError(f"{op}: {answer['error']}")
        return answer["result"]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            async with asyncio.timeout(15):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def create_topic(self, name: str, partition_num: int, replica: int, ordered: bool,
                           channel: str) -> None:
        await self.call("create_topic", name=name, partition_num=partition_num,
                        replica=replica, ordered=ordered, channels=[channel])
        self._topics.append(name)

    async def move_leader(self, topic: str, partition: int) -> str:
        if self._session is None:
            raise TargetError("the embedded cluster is not running")
        return await move_via_lookupd(self._session, self._lookupds[0], topic, partition,
                                      self._ids, self._down)

    async def kill_node(self, node: int) -> str:
        await self.call("stop_node", node=node)
        self._down.add(node)
        return f"nsqd-{node} stopped (its connections dropped, its partitions failed over)"

    async def start_node(self, node: int) -> str:
        await self.call("start_node", node=node)
        self._down.discard(node)
        return f"nsqd-{node} started"

    async def lookupd_down(self, mode: str) -> str:
        await self.call("lookupd_fault", kind=mode)
        return f"lookupd: {mode}"

    async def lookupd_up(self) -> None:
        await self.call("clear_lookupd_fault")

    async def slow_node(self, node: int, delay: float) -> str:
        await self.call("delay_responses", node=node, seconds=delay)
        return f"nsqd-{node} holds every response back {delay * 1000:.0f} ms"

    async def unslow_node(self, node: int) -> None:
        await self.call("delay_responses", node=node, seconds=0.0)

    async def drop_connections(self, node: int) -> str:
        n = await self.call("drop_clients", node=node)
        return f"nsqd-{node}: {n} client connection(s) aborted"

    async def server_note(self) -> str:
        parts = []
        for t in self._topics:
            parts.append(f"{t} stores {await self.call('stored', topic=t):,} records")
        peak = await self.call("rss_peak_kib")
        parts.append(f"cluster process peak RSS {peak / 1024:.0f} MiB")
        return "; ".join(parts)


# ---------------------------------------------------------------------------- real


def realnsq_dir() -> Path:
    """``../shared/realnsq`` beside the checkout, or $REALNSQ_DIR."""
    env = os.environ.get("REALNSQ_DIR")
    return Path(env) if env else HERE.parent.parent / "shared" / "realnsq"


class RealTarget:
    """A real youzan cluster from ``start-youzan.sh N`` with $REALNSQ_YOUZAN_BASE and
    $REALNSQ_STATE as it was started with (the port layout is the script's)."""

    kind = "real"

    def __init__(self, nodes: int = 3, keep_topics: bool = False) -> None:
        self.nodes = nodes
        self.keep_topics = keep_topics
        self.base = int(os.environ.get("REALNSQ_YOUZAN_BASE", "4150"))
        self.state = Path(os.environ.get("REALNSQ_STATE", "/tmp/realnsq-state"))
        self.root = realnsq_dir()
        self.lookupd = f"127.0.0.1:{self.base + 10011}"
        self._session: aiohttp.ClientSession | None = None
        self._topics: list[str] = []
        self._stopped: set[int] = set()
        #: nsqd processes this soak started again (reaped when killed once more)
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return [self.lookupd]

    def tcp_port(self, node: int) -> int:
        return self.base + 100 + 10 * node

    def distributed_id(self, node: int) -> str:
        # ip:rpc_port:tcp_port:worker_id, as lookupd names producers (docs/protocol.md §13.2.9)
        return f"127.0.0.1:{self.tcp_port(node) + 2}:{self.tcp_port(node)}:{node + 1}"

    def _pidfile(self, name: str) -> Path:
        return self.state / "pids" / f"{name}.pid"

    def _pid(self, name: str) -> int:
        f = self._pidfile(name)
        try:
            return int(f.read_text().strip())
        except (OSError, ValueError):
            raise TargetError(f"no pid recorded in {f} (was start-youzan.sh run with "
                              f"REALNSQ_STATE={self.state}?)") from None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise TargetError("the real target is not started")
        return self._session

    async def _get(self, addr: str, path: str, **params: str) -> tuple[int, Any]:
        async with self.session.get(f"http://{addr}{path}", params=params,
                                    headers=V1_ACCEPT) as r:
            text = await r.text()
        try:
            return r.status, json.loads(text) if text else None
        except ValueError:
            return r.status, text

    async def _post(self, addr: str, path: str, **params: str) -> tuple[int, str]:
        async with self.session.post(f"http://{addr}{path}", params=params) as r:
            return r.status, await r.text()

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        for i in range(self.nodes):
            self._pid(f"youzan-nsqd{i}")
        status, _ = await self._get(self.lookupd, "/ping")
        if status != 200:
            await self.close()
            raise TargetError(f"no youzan nsqlookupd answers at {self.lookupd}")

    async def close(self) -> None:
        if self._session is None:
            return
        for name in [] if self.keep_topics else self._topics:
            with contextlib.suppress(Exception):
                await self._post(await self._leader_lookupd(), "/topic/delete", topic=name,
                                 partition="**")
        await self._session.close()
        self._session = None

    async def _leader_lookupd(self) -> str:
        _, body = await self._get(self.lookupd, "/listlookup")
        leader = body.get("lookupdleader") if isinstance(body, dict) else None
        if not leader:
            raise TargetError(f"{self.lookupd} names no lookupd leader")
        return f"{leader['NodeIP']}:{leader['HttpPort']}"

    async def _partitions(self, topic: str, access: str,
                          consistent: bool = False) -> dict[int, dict[str, Any]]:
        params = {"topic": topic, "access": access, "metainfo": "true"}
        if consistent:
            params["consistent"] = "true"
        try:
            status, body = await self._get(self.lookupd, "/lookup", **params)
        except (aiohttp.ClientError, TimeoutError):
            return {}
        if status != 200 or not isinstance(body, dict):
            return {}
        return {int(p): peer for p, peer in (body.get("partitions") or {}).items()}

    async def _settle(self, what: str, probe: Any) -> Any:
        deadline = time.monotonic() + REAL_SETTLE_SECONDS
        while time.monotonic() < deadline:
            got = await probe()
            if got:
                return got
            await asyncio.sleep(0.5)
        raise TargetError(f"{what}: not seen within {REAL_SETTLE_SECONDS:.0f} s")

    async def create_topic(self, name: str, partition_num: int, replica: int, ordered: bool,
                           channel: str) -> None:
        params = {"topic": name, "partition_num": str(partition_num),
                  "replicator": str(replica)}
        if ordered:
            params["orderedmulti"] = "true"
        status, text = await self._post(await self._leader_lookupd(), "/topic/create", **params)
        if status != 200:
            raise TargetError(f"topic/create {name}: {status} {text}")
        self._topics.append(name)
        pending = set(range(partition_num))

        async def channels() -> bool:
            # a partition leader refuses channels until lookupd's topic check ran
            parts = await self._partitions(name, "r")
            for p, peer in parts.items():
                if p in pending:
                    addr = f"{peer['broadcast_address']}:{peer['http_port']}"
                    st, _ = await self._post(addr, "/channel/create", topic=name,
                                             partition=str(p), channel=channel)
                    if st == 200:
                        pending.discard(p)
            return not pending

        await self._settle(f"channel {channel} on every partition of {name}", channels)

        async def writable() -> bool:
            return len(await self._partitions(name, "w")) == partition_num

        await self._settle(f"{name} writable in lookups", writable)

    async def move_leader(self, topic: str, partition: int) -> str:
        return await move_via_lookupd(self.session, self.lookupd, topic, partition,
                                      [self.distributed_id(i) for i in range(self.nodes)],
                                      self._stopped)

    def _nsqd_cmd(self, i: int) -> list[str]:
        # start-youzan.sh's flags for node i, so the node comes back as itself
        b = self.tcp_port(i)
        data = self.state / "data" / "youzan"
        logdir = self.state / "logs" / "youzan"
        return [str(self.root / "bin-youzan" / "nsqd"),
                f"--tcp-address=127.0.0.1:{b}", f"--http-address=127.0.0.1:{b + 1}",
                f"--rpc-port={b + 2}", f"--metric-address=127.0.0.1:{b + 3}",
                f"--https-address=127.0.0.1:{b + 4}",
                "--broadcast-address=127.0.0.1", "--broadcast-interface=lo",
                "--cluster-id=realnsq",
                f"--cluster-leadership-addresses=http://127.0.0.1:{self.base + 8229}",
                f"--worker-id={i + 1}", f"--data-path={data / f'nsqd{i}'}", "--log-level=2",
                f"--log-dir={logdir / f'nsqd{i}'}"]

    def _spawn_nsqd(self, node: int) -> subprocess.Popen[bytes]:
        log = self.state / "logs" / "youzan" / f"nsqd{node}.out"
        with open(log, "ab") as out:
            proc = subprocess.Popen(self._nsqd_cmd(node), stdout=out, stderr=out,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self._children[node] = proc
        # the stop script stops what the pid files name: the new process from now on
        self._pidfile(f"youzan-nsqd{node}").write_text(f"{proc.pid}\n")
        return proc

    async def kill_node(self, node: int) -> str:
        pid = self._pid(f"youzan-nsqd{node}")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            raise TargetError(f"nsqd{node} (pid {pid}) is not running") from None
        self._stopped.add(node)
        child = self._children.pop(node, None)
        if child is not None:
            await asyncio.to_thread(child.wait, 10)
        for _ in range(100):
            if _gone(pid):
                break
            await asyncio.sleep(0.05)
        return f"nsqd{node} (pid {pid}) killed with SIGKILL"

    async def start_node(self, node: int) -> str:
        proc = await asyncio.to_thread(self._spawn_nsqd, node)
        self._stopped.discard(node)
        http = f"127.0.0.1:{self.tcp_port(node) + 1}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                if (await self._get(http, "/ping"))[0] == 200:
                    return f"nsqd{node} started again (pid {proc.pid})"
            await asyncio.sleep(0.2)
        raise TargetError(f"nsqd{node} (pid {proc.pid}) did not answer /ping within 30 s")

    def _signal(self, name: str, sig: signal.Signals) -> int:
        pid = self._pid(name)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            raise TargetError(f"{name} (pid {pid}) is not running") from None
        return pid

    async def lookupd_down(self, mode: str) -> str:
        # a stopped process still accepts TCP connections (the kernel does) and never
        # answers: the lookupd "hangs" for every client; refusing would need a restart
        pid = self._signal("youzan-nsqlookupd", signal.SIGSTOP)
        return f"nsqlookupd (pid {pid}) stopped with SIGSTOP (hangs; asked for {mode})"

    async def lookupd_up(self) -> None:
        self._signal("youzan-nsqlookupd", signal.SIGCONT)

    async def slow_node(self, node: int, delay: float) -> str:
        if node in self._stopped:
            raise TargetError(f"nsqd{node} is down")
        pid = self._signal(f"youzan-nsqd{node}", signal.SIGSTOP)
        return f"nsqd{node} (pid {pid}) stalled with SIGSTOP"

    async def unslow_node(self, node: int) -> None:
        if node not in self._stopped:
            self._signal(f"youzan-nsqd{node}", signal.SIGCONT)

    async def drop_connections(self, node: int) -> str:
        port = self.tcp_port(node)
        # destroys this machine's TCP sockets to the nsqd port (the client's ends): the
        # client sees its connections reset, as on a dropped network path
        proc = await asyncio.create_subprocess_exec(
            "ss", "-K", "-t", "state", "established", "dst", f"127.0.0.1:{port}",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise TargetError(f"ss -K failed: {err.decode().strip()}")
        n = max(len(out.decode().strip().splitlines()) - 1, 0)
        return f"nsqd{node}: {n} connection(s) to port {port} destroyed (ss -K)"

    async def server_note(self) -> str:
        """Per partition of the soak's topics, what its leader holds: message count, and the
        channel's depth and in-flight count (tells lost-on-the-server from not-delivered)."""
        lines = [f"real youzan cluster, lookupd {self.lookupd}, state {self.state}"]
        for i in range(self.nodes):
            try:
                _, body = await self._get(f"127.0.0.1:{self.tcp_port(i) + 1}", "/stats",
                                          format="json")
            except (aiohttp.ClientError, TimeoutError) as exc:
                lines.append(f"nsqd{i}: /stats failed: {exc!r}")
                continue
            data = body.get("data", body) if isinstance(body, dict) else {}
            for t in data.get("topics") or []:
                if t.get("topic_name") not in self._topics or not t.get("is_leader"):
                    continue
                chans = ", ".join(f"channel {c.get('channel_name')} depth {c.get('depth')} "
                                  f"in flight {c.get('in_flight_count')}"
                                  for c in t.get("channels") or [])
                lines.append(f"{t['topic_name']}/{t.get('topic_partition')} led by nsqd{i}: "
                             f"{t.get('message_count')} messages; {chans}")
        return "\n                 ".join(lines)

    async def heal(self) -> None:
        """Resume anything stopped with SIGSTOP (called at the end, whatever happened)."""
        for name in ["youzan-nsqlookupd", *(f"youzan-nsqd{i}" for i in range(self.nodes))]:
            with contextlib.suppress(TargetError):
                self._signal(name, signal.SIGCONT)


def _gone(pid: int) -> bool:
    """The process exited (or is a zombie nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True
