"""Every example of README.md and of the documentation site runs, as written, against the
embedded cluster (the markers and the harness: ``tests/doc_examples.py``; the Spark examples:
``tests/spark/test_doc_spark_examples.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.doc_examples import (
    ROOT,
    TEST_TIMEOUT,
    Example,
    all_examples,
    cluster_spec,
    example_cluster,
    pages,
    path_env,
    run_process,
    run_python,
    run_session,
    runnable,
    sessions,
    unmarked,
    with_addresses,
    with_metrics_ports,
)

KINDS = ("standalone", "stock", "youzan", "spark", "cli", "pytest", "peer")


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_example_block_is_marked(page: Path) -> None:
    """An unmarked example would silently go untested."""
    lines = unmarked(page)
    assert not lines, f"{page.name}: the python/bash blocks at lines {lines} need a marker"


def test_every_marker_names_a_known_kind() -> None:
    bad = [e.id for e in all_examples() if e.flavour not in KINDS]
    assert not bad, f"unknown example kinds: {bad}"


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("example", runnable("python"), ids=lambda e: e.id)
async def test_example_runs(example: Example) -> None:
    assert example.lang == "python"
    if example.flavour == "standalone":
        out = await run_process(sys.executable, "-c", with_metrics_ports(example.code),
                                what=example.id)
    else:
        async with example_cluster(example.kind) as cluster:
            out = await run_python(cluster, example)
    assert out.strip(), "the example printed nothing"


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("blocks", sessions(), ids=lambda bs: bs[0].id)
async def test_command_line_session_runs(blocks: list[Example], tmp_path: Path) -> None:
    """A shell session: every command in order, each must succeed (``bash -e`` with
    pipefail)."""
    async with example_cluster(blocks[0].kind) as cluster:
        out = await run_session(cluster, blocks, tmp_path)
    assert out.strip(), "the session printed nothing"


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("example", runnable("pytest"), ids=lambda e: e.id)
async def test_user_test_module_passes(example: Example, tmp_path: Path) -> None:
    """A user's test module, with only the plugin's fixtures: pytest runs it and every test
    in it passes."""
    assert example.lang == "python"
    assert not cluster_spec(example.kind), "a pytest example brings its own cluster"
    (tmp_path / "test_user.py").write_text(example.code)
    out = await run_process(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "test_user.py", cwd=tmp_path, what=example.id, env=path_env())
    assert " passed" in out and "failed" not in out, out


def test_addresses_are_substituted_whole_and_once() -> None:
    """A cluster port that begins like another default (TCP 41515 begins with 4151) is not
    rewritten again; a longer port in the text is left alone."""
    cluster: Any = SimpleNamespace(nsqd_tcp_addresses=["127.0.0.1:41515"],
                                   nsqd_http_addresses=["127.0.0.1:34847"],
                                   lookupd_http_addresses=["127.0.0.1:41500"])
    code = "127.0.0.1:4150 127.0.0.1:4151 127.0.0.1:4161 127.0.0.1:41501"
    assert with_addresses(code, cluster) == \
        "127.0.0.1:41515 127.0.0.1:34847 127.0.0.1:41500 127.0.0.1:41501"


def test_metrics_ports_are_substituted_whole() -> None:
    """The docs' metrics ports become the given ones wherever they stand alone (a call's
    argument, a flag's value, an address); a longer number that contains one stays."""
    ports = {"9108": "40001", "9109": "40002"}
    code = "serve(9108) --metrics-port 9109 http://127.0.0.1:9109/metrics 191090 91080"
    assert with_metrics_ports(code, ports) == \
        "serve(40001) --metrics-port 40002 http://127.0.0.1:40002/metrics 191090 91080"


async def test_a_process_past_its_time_fails_with_what_it_printed() -> None:
    """The harness's own timeout fires first and its error carries the output so far (an
    example cut off by pytest's timeout would show nothing)."""
    code = "import sys, time; print('started', flush=True); time.sleep(60)"
    with pytest.raises(AssertionError, match=r"ran past 1 s; it printed:\nstarted"):
        await run_process(sys.executable, "-c", code, what="sleeper", within=1.0)
