"""The fleet view: the pure table from sample objects, and the CLI against a fake API server on loopback."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from specdec_operator import fleetview
from specdec_operator.fleetview import COLUMNS, render_table, status_main

NOW = "2026-11-29T08:00:00Z"


def make_pool(
    name: str, gfx: str, k: int, method: str = "eagle3", model: str | None = "org/EAGLE3-Llama-8B"
) -> dict[str, Any]:
    drafter: dict[str, Any] = {"method": method}
    if model:
        drafter["model"] = model
    return {"name": name, "gfxTarget": gfx, "drafter": drafter, "effectiveK": k, "replicas": 2, "readyReplicas": 1}


def make_model(
    name: str,
    namespace: str = "team-a",
    pools: list[dict[str, Any]] | None = None,
    stats: list[dict[str, Any]] | None = None,
    ready: tuple[str, str] = ("True", "AllPoolsReady"),
    canary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [{"type": "Ready", "status": ready[0], "reason": ready[1], "lastTransitionTime": NOW}],
        "pools": pools or [],
        "speculation": {"pools": stats or []},
    }
    if canary:
        status["canary"] = canary
    return {
        "apiVersion": "specdec.io/v1alpha1",
        "kind": "SpeculativeModel",
        "metadata": {"name": name, "namespace": namespace},
        "status": status,
    }


def parse_table(text: str) -> list[dict[str, str]]:
    """Cells by the header's column offsets, so a misaligned row reads wrong."""
    header, *lines = text.rstrip("\n").split("\n")
    cells = list(re.finditer(r"\S+", header))
    columns = [cell.group() for cell in cells]
    assert columns in (list(COLUMNS), list(fleetview.WIDE_COLUMNS))
    starts = [cell.start() for cell in cells]
    ends = [*starts[1:], None]
    return [
        {column: line[start:end].strip() for column, start, end in zip(columns, starts, ends, strict=True)}
        for line in lines
    ]


LLAMA = make_model(
    "llama-70b",
    pools=[make_pool("llama-70b-gfx942", "gfx942", 3), make_pool("llama-70b-gfx1100", "gfx1100", 0, "ngram", None)],
    stats=[
        {"pool": "llama-70b-gfx942", "k": 3, "acceptanceRate": 0.7123, "tokensPerSecond": 1234.56, "recommendedK": 4},
        {"pool": "llama-70b-gfx1100", "k": 0, "tokensPerSecond": 88.0, "recommendedK": 0},
    ],
    canary={
        "pool": "llama-70b-gfx942",
        "stableRevision": "a1",
        "canaryRevision": "b2",
        "weight": 10,
        "phase": "Progressing",
        "stepStartedAt": NOW,
    },
)


def test_one_row_per_pool_read_from_status() -> None:
    rows = parse_table(render_table([LLAMA]))
    assert rows == [
        {
            "NAMESPACE": "team-a",
            "NAME": "llama-70b",
            "POOL": "llama-70b-gfx942",
            "GFX": "gfx942",
            "DRAFTER": "eagle3:EAGLE3-Llama-8B",
            "K": "3->4",
            "ACCEPTANCE": "71.2%",
            "TOKENS/S": "1234.6",
            "REPLICAS": "1/2",
            "CANARY": "Progressing 10%",
            "READY": "True",
        },
        {
            "NAMESPACE": "team-a",
            "NAME": "llama-70b",
            "POOL": "llama-70b-gfx1100",
            "GFX": "gfx1100",
            "DRAFTER": "ngram",
            "K": "0",
            "ACCEPTANCE": "-",
            "TOKENS/S": "88.0",
            "REPLICAS": "1/2",
            "CANARY": "-",
            "READY": "True",
        },
    ]


@pytest.mark.parametrize(
    ("obj", "column", "shown"),
    [
        (make_model("m", ready=("False", "NoCompatibleNodes")), "READY", "False (NoCompatibleNodes)"),
        ({"metadata": {"name": "fresh", "namespace": "team-a"}}, "READY", "Unknown"),
        ({"metadata": {"name": "fresh", "namespace": "team-a"}}, "POOL", "-"),
        (
            make_model(
                "m",
                pools=[make_pool("p", "gfx90a", 2, "ngram", None) | {"drafter": {"method": "ngram", "fallback": True}}],
            ),
            "DRAFTER",
            "ngram (fallback)",
        ),
        (make_model("m", pools=[make_pool("p", "gfx942", 5)]), "K", "5"),
        (
            make_model("m", pools=[make_pool("p", "gfx942", 5)], canary={**LLAMA["status"]["canary"], "pool": "other"}),
            "CANARY",
            "-",
        ),
        ({"metadata": {"name": "m", "namespace": "a"}, "status": {"pools": [{"name": "p"}]}}, "READY", "InvalidStatus"),
    ],
)
def test_cells(obj: dict[str, Any], column: str, shown: str) -> None:
    (row,) = parse_table(render_table([obj]))
    assert row[column] == shown


def test_rows_sort_by_namespace_then_name_and_a_bad_status_hides_nothing() -> None:
    broken = {"metadata": {"name": "broken", "namespace": "team-a"}, "status": {"conditions": [{"type": "Ready"}]}}
    objs = [make_model("zeta", "team-b"), broken, make_model("alpha", "team-b"), LLAMA]
    rows = parse_table(render_table(objs))
    assert [(row["NAMESPACE"], row["NAME"]) for row in rows] == [
        ("team-a", "broken"),
        ("team-a", "llama-70b"),
        ("team-a", "llama-70b"),
        ("team-b", "alpha"),
        ("team-b", "zeta"),
    ]


class FakeApiServer:
    """Serves SpeculativeModel lists on 127.0.0.1, one object per page to exercise `continue`."""

    def __init__(self) -> None:
        self.models: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.selectors: list[str | None] = []
        self.fail_with: int | None = None
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _list(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        if self.fail_with:
            return web.json_response({"kind": "Status", "code": self.fail_with}, status=self.fail_with)
        namespace = request.match_info.get("namespace")
        self.selectors.append(request.query.get("labelSelector"))
        wanted = dict(term.split("=", 1) for term in (request.query.get("labelSelector") or "").split(",") if term)
        items = [obj for obj in self.models if namespace in (None, obj["metadata"]["namespace"])
                 and wanted.items() <= obj["metadata"].get("labels", {}).items()]
        start = int(request.query.get("continue") or 0)
        more = {"continue": str(start + 1)} if start + 1 < len(items) else {}
        return web.json_response({"kind": "SpeculativeModelList", "metadata": more, "items": items[start : start + 1]})

    async def _start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/apis/specdec.io/v1alpha1/speculativemodels", self._list)
        app.router.add_get("/apis/specdec.io/v1alpha1/namespaces/{namespace}/speculativemodels", self._list)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.port = runner.addresses[0][1]
        return runner

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        self._runner = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def kubeconfig(self, directory: Path) -> Path:
        path = directory / "kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "fake", "user": {"token": "not-a-secret"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "team-a"}}],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(config))
        return path


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path)))
        server.models = [LLAMA, make_model("qwen-7b", "team-b", pools=[make_pool("qwen-7b-gfx90a", "gfx90a", 2)])]
        yield server


def test_all_namespaces_follows_pagination(api: FakeApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert status_main(["-A"]) == 0
    rows = parse_table(capsys.readouterr().out)
    assert [row["POOL"] for row in rows] == ["llama-70b-gfx942", "llama-70b-gfx1100", "qwen-7b-gfx90a"]
    assert api.paths == ["/apis/specdec.io/v1alpha1/speculativemodels"] * 2


@pytest.mark.parametrize(("argv", "namespace"), [(["-n", "team-b"], "team-b"), ([], "team-a")])
def test_one_namespace_defaults_to_the_context_namespace(
    api: FakeApiServer, capsys: pytest.CaptureFixture[str], argv: list[str], namespace: str
) -> None:
    assert status_main(argv) == 0
    assert {row["NAMESPACE"] for row in parse_table(capsys.readouterr().out)} == {namespace}
    assert set(api.paths) == {f"/apis/specdec.io/v1alpha1/namespaces/{namespace}/speculativemodels"}


def test_empty_namespace_says_so(api: FakeApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert status_main(["-n", "team-c"]) == 0
    assert capsys.readouterr().out == "No SpeculativeModels found in namespace team-c.\n"


@pytest.mark.parametrize(
    ("code", "message"), [(404, "CRD (speculativemodels.specdec.io) is not installed"), (403, "403")]
)
def test_api_errors_exit_1_with_a_reason(
    api: FakeApiServer, capsys: pytest.CaptureFixture[str], code: int, message: str
) -> None:
    api.fail_with = code
    assert status_main(["-A"]) == 1
    assert message in capsys.readouterr().err


def test_unreachable_api_server_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeApiServer() as server:
        kubeconfig = server.kubeconfig(tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))  # the server is gone: its port refuses connections
    assert status_main(["-A"]) == 1
    assert "cannot reach the API server" in capsys.readouterr().err


@pytest.fixture(params=["default", "ignored", "blocked"])
def launched_with_sigint(request: pytest.FixtureRequest) -> Iterator[str]:
    """How whatever started this suite left SIGINT: as a terminal does, ignored (a background job of a
    script) or blocked (a supervisor waiting for it with sigwait); each is inherited by the plugin we start."""
    handler = signal.getsignal(signal.SIGINT)
    if request.param == "ignored":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    elif request.param == "blocked":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield request.param
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, handler)


def test_kubectl_plugin_watches_until_ctrl_c(api: FakeApiServer, launched_with_sigint: str) -> None:
    command = [sys.executable, "-c", "from specdec_operator.fleetview import kubectl_plugin_main as m; m()"]
    plugin = subprocess.Popen(
        [*command, "status", "-A", "--watch", "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: a suite started in the background (`cmd &` in a script) inherits an ignored
        # SIGINT, and a Python started with SIGINT ignored never raises KeyboardInterrupt; a suite started by a
        # supervisor that blocks SIGINT (to sigwait for it) passes the blocked mask through fork and exec, and
        # the plugin never sees the signal at all.
        preexec_fn=_sigint_as_at_a_terminal,
    )
    try:
        _wait_for_line(plugin, r"^Every 0\.1s: kubectl specdec status -A --watch --interval 0\.1 ")
        _wait_for_line(plugin, r"qwen-7b-gfx90a\s+gfx90a\s+\S+\s+2\s")
        # The next frames show what the API server says now: K moved from 2 to 4.
        api.models = [make_model("qwen-7b", "team-b", pools=[make_pool("qwen-7b-gfx90a", "gfx90a", 4)])]
        _wait_for_line(plugin, r"qwen-7b-gfx90a\s+gfx90a\s+\S+\s+4\s")
    finally:
        plugin.send_signal(signal.SIGINT)
        # Drain while waiting: frames keep coming every 0.1 s, and a plugin blocked on a full stdout pipe
        # cannot finish its Ctrl-C (it failed that way in CI on a loaded machine).
        try:
            _, stderr = plugin.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            plugin.kill()
            _, stderr = plugin.communicate()
            raise AssertionError(f"the watch did not stop on Ctrl-C within 20 s; stderr: {stderr[-2000:]}") from None
    assert plugin.returncode == 0, stderr


def _sigint_as_at_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _wait_for_line(process: subprocess.Popen[str], pattern: str) -> None:
    """Read the plugin's lines until one matches; fail on EOF, or after 30 s of lines that do not match.

    The 30 s run from the first line read, not from the call: a plugin that needs longer than that to import
    and connect (50 s on a loaded CI machine) writes its first frame's leading newline after the old deadline,
    and the frame's header, the very next line, was never read. pytest-timeout bounds a plugin that never writes.
    """
    assert process.stdout is not None
    seen: list[str] = []
    deadline: float | None = None
    while deadline is None or time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return
        deadline = deadline or time.monotonic() + 30
    raise AssertionError(f"no line matches {pattern!r} in:\n{''.join(seen[-40:])}")


@pytest.mark.parametrize(
    ("words", "status_argv"),
    [
        ([], ["-A"]),
        (["status"], []),
        (["status", "-n", "demo", "--watch"], ["-n", "demo", "--watch"]),
        (["-n", "demo"], ["-n", "demo"]),
    ],
)
def test_kubectl_plugin_dispatches_to_status(
    monkeypatch: pytest.MonkeyPatch, words: list[str], status_argv: list[str]
) -> None:
    calls: list[list[str]] = []

    def fake_status_main(argv: list[str], prog: str) -> int:
        calls.append(list(argv))
        return 3

    monkeypatch.setattr(fleetview, "status_main", fake_status_main)
    monkeypatch.setattr(sys, "argv", ["kubectl-specdec", *words])
    with pytest.raises(SystemExit) as exited:
        fleetview.kubectl_plugin_main()
    assert exited.value.code == 3
    assert calls == [status_argv]


def test_kubectl_plugin_rejects_unknown_commands(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["kubectl-specdec", "scale"])
    with pytest.raises(SystemExit) as exited:
        fleetview.kubectl_plugin_main()
    assert exited.value.code == 2
    assert "unknown command 'scale'" in capsys.readouterr().err


def _labelled(model: dict[str, Any], **labels: str) -> dict[str, Any]:
    model["metadata"]["labels"] = labels
    return model


def test_selector_is_sent_to_the_api_server(api: FakeApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    api.models = [_labelled(make_model("a", pools=[make_pool("a-gfx942", "gfx942", 3)]), team="ml"),
                  _labelled(make_model("b", pools=[make_pool("b-gfx942", "gfx942", 3)]), team="search")]
    assert status_main(["-A", "-l", "team=ml"]) == 0
    assert [row["NAME"] for row in parse_table(capsys.readouterr().out)] == ["a"]
    assert set(api.selectors) == {"team=ml"}
    assert status_main(["-A", "-l", "team=none"]) == 0
    assert capsys.readouterr().out == "No SpeculativeModels found in any namespace matching team=none.\n"


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_json_and_yaml_print_the_objects_as_a_list(
    api: FakeApiServer, capsys: pytest.CaptureFixture[str], output: str
) -> None:
    assert status_main(["-A", "-o", output]) == 0
    text = capsys.readouterr().out
    listed = yaml.safe_load(text)  # JSON is YAML too; the json branch must also parse as JSON
    if output == "json":
        assert json.loads(text) == listed
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in listed["items"]] == [
        ("team-a", "llama-70b"), ("team-b", "qwen-7b")]
    assert listed["items"][1] == api.models[1]


def test_json_with_nothing_found_is_an_empty_list(api: FakeApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert status_main(["-n", "team-c", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["items"] == []


def test_wide_adds_accepted_length_drafts_nodes_revision_and_image(
    api: FakeApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = {**make_pool("q-gfx90a", "gfx90a", 2), "nodes": 3, "revision": "5d8f", "image": "rt:cdna"}
    stats = [{"pool": "q-gfx90a", "k": 2, "drafts": 4200, "meanAcceptedLength": 2.456}]
    api.models = [make_model("q", "team-b", pools=[pool], stats=stats)]
    assert status_main(["-A", "-o", "wide"]) == 0
    (row,) = parse_table(capsys.readouterr().out)
    assert {k: row[k] for k in ("ACCEPTED-LEN", "DRAFTS", "NODES", "REVISION", "IMAGE", "K")} == {
        "ACCEPTED-LEN": "2.46", "DRAFTS": "4200", "NODES": "3", "REVISION": "5d8f", "IMAGE": "rt:cdna", "K": "2"}


def test_version_flags(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from specdec_operator import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert re.fullmatch(r"specdec-operator \d+\.\d+\.\d+\S* \(API specdec\.io/v1alpha1, Python 3\.\d+\.\d+\)\n",
                        capsys.readouterr().out)
    monkeypatch.setattr(sys, "argv", ["kubectl-specdec", "--version"])
    with pytest.raises(SystemExit):
        fleetview.kubectl_plugin_main()
    assert capsys.readouterr().out.startswith("kubectl specdec ")


def test_plugin_help_documents_the_plugin_and_every_status_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["kubectl-specdec", "--help"])
    with pytest.raises(SystemExit) as exited:
        fleetview.kubectl_plugin_main()
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "kubectl-specdec" in text and "kubectl plugin list" in text
    for flag in ("--namespace", "--all-namespaces", "--selector", "--output", "--watch", "--interval", "--kubeconfig"):
        assert flag in text, flag
