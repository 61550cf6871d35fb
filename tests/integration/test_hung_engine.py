"""An engine that stops making progress without dying (here: its process stopped with SIGSTOP) is
detected like a dead one: the service exits non-zero so a supervisor restarts it."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil
import pytest

from tests.integration.conftest import start_service, stop_service


def test_hung_engine_stops_the_service_with_exit_1(tmp_path_factory: pytest.TempPathFactory) -> None:
    svc = start_service(tmp_path_factory.mktemp("hung"), [
        "--no-enable-predictions", "--no-enable-codec", "--engine-stall-seconds", "4", "--drain-seconds", "2"])
    children = psutil.Process(svc.process.pid).children(recursive=True)
    cores = [child for child in children if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline())]
    try:
        assert len(cores) == 1
        os.kill(cores[0].pid, signal.SIGSTOP)
        code = svc.process.wait(timeout=90)
    finally:
        stop_service(svc)
        for child in children:  # this test's own engine processes, whatever state they were left in
            with contextlib.suppress(psutil.NoSuchProcess):
                child.resume()
                child.kill()
    assert code == 1, "a hung engine must exit non-zero so a supervisor restarts the service"
    assert "stopped making progress" in svc.log_tail(20000)
