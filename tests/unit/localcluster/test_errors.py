"""The local control plane's failures each come back as one line that says what to do."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster import build, processes
from localcluster.errors import ClusterError
from localcluster.versions import BUILDS


def test_missing_go_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ClusterError, match=r"Go is not installed .*install Go 1.26 or newer"):
        build.go_binary()


@pytest.mark.parametrize("line", [
    "go: k8s.io/kubernetes@v1.36.99: reading https://proxy.example/k8s.io/kubernetes/@v/v1.36.99.zip: 404 Not Found",
    "go: specdec.io/hack/cluster/kubernetes imports\n"
    "go: k8s.io/api@v0.36.99: invalid version: unknown revision v0.36.99",
])
def test_a_refused_module_is_named_with_its_version(line: str) -> None:
    error = build._explain_go_failure(BUILDS[0], f"go: downloading something v1\n{line}\n")
    message = str(error)
    assert "the Go module proxy refused" in message
    assert "@v1.36.99" in message or "@v0.36.99" in message
    assert "go.mod" in message and "\n" not in message


def test_other_build_failures_show_the_tail_of_go_output() -> None:
    error = build._explain_go_failure(BUILDS[0], "compiling\n./main.go:3: undefined: x\n")
    assert "failed; last lines of go's output" in str(error) and "undefined: x" in str(error)


def test_a_port_in_use_names_port_owner_and_remedy() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ClusterError, match=rf"port {port} on 127.0.0.1 \(needed by etcd\) is already in use"):
            processes.check_port_free(port, "etcd")


def test_a_component_that_exits_at_start_shows_its_log_tail(tmp_path: Path) -> None:
    (tmp_path / "pids").mkdir()
    component = processes.Component(
        "kube-apiserver", [sys.executable, "-c", "import sys; print('error: bad flag --nope'); sys.exit(3)"]
    )
    process = processes.start(component, tmp_path, tmp_path / "pids")
    process.wait(10)
    with pytest.raises(ClusterError) as raised:
        processes.ensure_running(component, process, tmp_path)
    message = str(raised.value)
    assert "kube-apiserver exited at start (exit code 3)" in message and "error: bad flag --nope" in message


def test_stop_pid_file_stops_the_whole_process_group(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    pid_file = tmp_path / "sleeper.pid"
    pid_file.write_text(str(child.pid))
    assert processes.stop_pid_file(pid_file, grace_s=5)
    assert child.wait(5) is not None and not pid_file.exists()
