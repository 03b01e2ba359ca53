"""The one SIGTERM context (``torchcal._signals``, used by the command line, the sweeps and Ray):
SIGTERM keeps its name through a library that catches the KeyboardInterrupt raised by the
handler and raises its own (Ray's ``wait`` does): the command then exits 143, not 130."""

from __future__ import annotations

import os
import signal
import time
import weakref

import pytest

from torchcal._signals import interrupt_signal, sigterm_interrupts


def _library_that_reraises() -> None:
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
    except KeyboardInterrupt:
        raise KeyboardInterrupt from None  # its own, without the signal's name


def test_sigterm_keeps_its_name_through_a_reraising_library():
    with pytest.raises(KeyboardInterrupt) as info:
        with sigterm_interrupts():
            _library_that_reraises()
    assert interrupt_signal(info.value) == signal.SIGTERM


def test_ctrl_c_stays_sigint():
    with pytest.raises(KeyboardInterrupt) as info:
        with sigterm_interrupts():
            raise KeyboardInterrupt
    assert interrupt_signal(info.value) == signal.SIGINT


def test_sigterm_while_the_command_loads_is_an_interruption(monkeypatch, capsys):
    """The handler is set before the command's modules load: a SIGTERM then (a fork server's
    kill 5 ms in) exits 143 with the one line, not by the default action (status -15)."""
    import torchcal.cli as cli

    real, calls = cli.build_parser, []

    def slow_build(command):
        calls.append(command)
        if len(calls) == 1:  # the first load is interrupted; the hint's parse is not
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
        return real(command)

    monkeypatch.setattr(cli, "build_parser", slow_build)
    assert cli.main(["calibrate", "val.npz", "--out", "cal.json"]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("torchcal calibrate: interrupted by SIGTERM;")
    assert "cal.json" in err[0]  # the command's own hint, from the command line parsed again


@pytest.mark.parametrize("exc, name", [(KeyboardInterrupt("signal 15"), "signal 15"),
                                       (KeyboardInterrupt(), "")])
def test_an_interruption_swallowed_by_a_weakref_callback_is_raised_again(exc, name):
    """A signal whose KeyboardInterrupt is raised inside a weakref callback (importlib's
    module-lock callback while a module loads) was "ignored" by Python and the command ran on
    to exit 0; in the block the signal is sent again and raised in the code that runs next."""

    class Thing:
        pass

    def callback(_ref):  # where the signal's handler happened to run
        raise exc

    with pytest.raises(KeyboardInterrupt) as info:
        with sigterm_interrupts():
            thing = Thing()
            ref = weakref.ref(thing, callback)
            del thing  # the callback runs now; its exception cannot propagate
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the signal sent again is handled here
                pass
    assert ref() is None
    assert interrupt_signal(info.value) == (15 if name else signal.SIGINT)
