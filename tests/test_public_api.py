"""The public surface (issue 21): every public name resolves and is documented, every error is
exported from ``smartnsq``, importing the package or the producer loads no more than it needs,
the command line says what is missing without its extra, and the changelog covers this
version."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import smartnsq
import smartnsq.errors
import smartnsq.sync

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_every_public_name_resolves_and_is_listed_by_dir() -> None:
    for name in smartnsq.__all__:
        assert getattr(smartnsq, name) is not None, name
    assert set(smartnsq.__all__) <= set(dir(smartnsq))


def test_lazy_names_are_the_real_classes() -> None:
    from smartnsq.consumer import Consumer
    from smartnsq.lookup import Lookup
    from smartnsq.message import Message
    from smartnsq.ordered import OrderedConsumer
    from smartnsq.producer import BatchReceipt, HttpProducer, Producer, PublishReceipt

    assert smartnsq.Producer is Producer
    assert smartnsq.HttpProducer is HttpProducer
    assert smartnsq.Consumer is Consumer
    assert smartnsq.OrderedConsumer is OrderedConsumer
    assert smartnsq.Message is Message
    assert smartnsq.Lookup is Lookup
    assert smartnsq.PublishReceipt is PublishReceipt
    assert smartnsq.BatchReceipt is BatchReceipt


def test_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'OrderedProducer'"):
        smartnsq.OrderedProducer  # noqa: B018  (gone in 1.0: Producer.publish_ordered)


def test_every_error_class_is_in_smartnsq_errors_and_exported_from_smartnsq() -> None:
    errors = {name: obj for name, obj in vars(smartnsq.errors).items()
              if inspect.isclass(obj) and issubclass(obj, smartnsq.errors.NSQError)}
    assert len(errors) > 60
    for name, cls in errors.items():
        assert name in smartnsq.errors.__all__, name
        assert name in smartnsq.__all__ and getattr(smartnsq, name) is cls, name
    # and no other module defines an exception of its own (the CLI's click error excepted)
    defined = []
    for path in (ROOT / "smartnsq").rglob("*.py"):
        if "errors" in path.parts or "devcluster" in path.parts or "cli" in path.parts:
            continue
        for line in path.read_text().splitlines():
            if line.startswith("class ") and "Error(" in line:
                defined.append(f"{path.relative_to(ROOT)}: {line}")
    assert defined == []


def test_names_say_which_side() -> None:
    assert smartnsq.ServerNotLeaderError.code == "E_FAILED_ON_NOT_LEADER"
    assert issubclass(smartnsq.ServerNotLeaderError, smartnsq.ServerError)
    assert not issubclass(smartnsq.NoLeaderKnownError, smartnsq.ServerError)
    for gone in ("NoLeaderError", "NotLeaderError"):
        assert not hasattr(smartnsq.errors, gone)


def test_publish_error_sent_is_a_typed_field() -> None:
    assert smartnsq.PublishError("x").sent == 0
    assert smartnsq.PublishTimeoutError("late", sent=3).sent == 3
    assert "sent" in smartnsq.PublishError.__annotations__


@pytest.mark.parametrize("module", [smartnsq, smartnsq.sync], ids=lambda m: m.__name__)
def test_every_public_name_has_a_docstring(module: object) -> None:
    missing = []
    for name in module.__all__:  # type: ignore[attr-defined]
        if name.startswith("__"):
            continue
        obj = getattr(module, name)
        if not (inspect.getdoc(obj) or "").strip():
            missing.append(name)
    assert missing == []


def test_spark_public_names_have_docstrings() -> None:
    pytest.importorskip("pyspark")
    import smartnsq.spark

    missing = [n for n in smartnsq.spark.__all__
               if not (inspect.getdoc(getattr(smartnsq.spark, n)) or "").strip()]
    assert missing == []


#: modules a producer-only process (a web app, a Spark executor's sink) must not load
HEAVY = ("smartnsq.consumer", "smartnsq.ordered", "smartnsq.spark", "smartnsq.cli",
         "smartnsq.devcluster", "smartnsq.sync", "click", "rich", "pyspark")


def loaded_after(statement: str) -> list[str]:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_import_smartnsq_loads_no_client() -> None:
    loaded = loaded_after("import smartnsq")
    client = ("smartnsq.producer", "smartnsq.consumer", "smartnsq.lookup", "aiohttp", *HEAVY)
    clients = [m for m in loaded if m.startswith(client)]
    assert clients == []


def test_importing_the_producer_loads_no_consumer_spark_cli_or_devcluster() -> None:
    for statement in ("from smartnsq import Producer", "from smartnsq import HttpProducer",
                      "import smartnsq.producer"):
        loaded = loaded_after(statement)
        heavy = [m for m in loaded if m.startswith(HEAVY)]
        assert heavy == [], statement
        assert "smartnsq.producer.producer" in loaded


def test_import_smartnsq_loads_neither_pydantic_nor_the_protocol() -> None:
    # the config models (pydantic: ~0.15 s) load on first use: a command line's own Ctrl-C
    # handling is in place within milliseconds of start-up, and a bare import stays cheap
    loaded = loaded_after("import smartnsq; import smartnsq.cli")
    assert [m for m in loaded if m.startswith(("pydantic", "smartnsq.config",
                                               "smartnsq.protocol"))] == []
    assert "ProducerConfig" in dir(smartnsq)
    assert loaded_after("from smartnsq import ProducerConfig, OffsetSpec").count(
        "smartnsq.config") == 1


def test_the_command_line_without_its_extra_says_how_to_get_it() -> None:
    for missing in ("click", "rich"):
        out = run_python(f"import sys; sys.modules[{missing!r}] = None; "
                         "from smartnsq.cli import main; sys.exit(main(['--help']))")
        assert out.returncode == 1
        assert f"needs the 'cli' extra ({missing} is not installed)" in out.stderr
        assert "pip install 'smartnsq[cli]'" in out.stderr
        assert "Traceback" not in out.stderr


def test_version_and_changelog_agree() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == smartnsq.__version__ == "1.0.0rc1"
    assert "click" not in " ".join(project["dependencies"])
    assert project["optional-dependencies"]["cli"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{smartnsq.__version__}]" in changelog
    # every name that went away is named there, with what replaces it
    for gone in ("OrderedProducer", "NoLeaderError", "NotLeaderError", "SentBatch",
                 "nsqd_tcp_addresses", "lookupd_http_addresses", "nsqd_http_addresses",
                 "close()", "closed", "smartnsq.ordered.sharding", "ordered=True"):
        assert gone in changelog, gone
