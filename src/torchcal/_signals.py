"""SIGTERM as Ctrl-C: the one context every entry point (the command line, the sweeps' runner,
the Ray executor) uses, so that ``kill PID`` ends work the way Ctrl-C does: atomic writers
remove their temporary file, locks are released, and the command prints what continues.

Standard library only (the command line sets it before any other module loads)."""

from __future__ import annotations

import _thread
import contextlib
import re
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["sigterm_interrupts", "interrupt_signal", "forget_handled_interrupt"]


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises ``KeyboardInterrupt("signal 15")`` in the block, as Ctrl-C raises
    ``KeyboardInterrupt`` (main thread only; elsewhere signals cannot be set).  A library that
    catches the interruption and raises its own ``KeyboardInterrupt`` (Ray's wait does) has the
    signal's name put back.  The previous handler is restored on the way out.

    An interruption raised where Python cannot raise it, in a weakref callback or a
    ``__del__`` (importlib's module-lock callback, while a module loads), is "ignored" by
    Python: the command then ran on to its end and exited 0 (seen once in 80 SIGTERMs at
    start-up).  In the block, such a ``KeyboardInterrupt`` sends its signal again
    (``sys.unraisablehook``, 50 ms later), so that it is raised in the code that runs then."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    fired: list[int] = []

    def handler(signum: int, frame: object) -> None:
        fired.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    old_hook = sys.unraisablehook

    def unraisable(info: Any) -> None:
        if isinstance(info.exc_value, KeyboardInterrupt):  # swallowed: deliver it again,
            # from a timer: raised in this hook, it would be "ignored" once more
            timer = threading.Timer(0.05, _thread.interrupt_main,
                                    args=(interrupt_signal(info.exc_value),))
            timer.daemon = True
            timer.start()
            return
        old_hook(info)

    old = signal.signal(signal.SIGTERM, handler)
    sys.unraisablehook = unraisable
    try:
        yield
    except KeyboardInterrupt as exc:
        if fired and f"signal {fired[-1]}" not in map(str, exc.args):
            raise KeyboardInterrupt(f"signal {fired[-1]}") from exc
        raise
    finally:
        sys.unraisablehook = old_hook
        signal.signal(signal.SIGTERM, old)


def interrupt_signal(exc: KeyboardInterrupt) -> int:
    """The signal a ``KeyboardInterrupt`` stands for: the number in ``"signal N"`` (raised by
    :func:`sigterm_interrupts`), else SIGINT (Ctrl-C).

    >>> interrupt_signal(KeyboardInterrupt("signal 15")), interrupt_signal(KeyboardInterrupt())
    (15, 2)
    """
    for a in exc.args:
        m = re.fullmatch(r"signal (\d+)", str(a))
        if m:
            return int(m.group(1))
    return int(signal.SIGINT)


def forget_handled_interrupt() -> None:
    """Tell the interpreter that the ``KeyboardInterrupt`` it saw was handled.

    CPython marks a ``KeyboardInterrupt`` that leaves code run by ``exec`` of a string as
    unhandled, even when an outer ``except`` catches it, and ``python`` then ends by killing
    itself with SIGINT (exit status -2, "130" in a shell) instead of with the status the
    command returned.  ``dataclasses`` and ``collections.namedtuple`` build their methods with
    ``exec`` while modules load, so a SIGTERM or Ctrl-C that lands there during a command's
    start-up turned its 143 into -2 (about once in 20 kills during start-up under load).
    CPython 3.11 clears the mark at the start of every ``exec``: the ``exec`` below does that;
    where the mark is a C global that no ``exec`` clears, it is cleared through ``ctypes``.
    Called where the command line has handled the interruption."""
    exec("pass")  # noqa: S102 - clears CPython's mark (a constant string, nothing run)
    try:
        # deferred: ctypes is needed only on this path, after an interruption
        import ctypes

        flag = ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt")
    except (ImportError, AttributeError, ValueError, OSError):  # not this CPython's global
        return
    flag.value = 0
