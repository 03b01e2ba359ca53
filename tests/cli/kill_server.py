"""A fork server for the signal tests (issue 51 item 1): imports torchcal and the command's
module once, then runs ``torchcal ARGV`` in forked children, each killed by SIGTERM or SIGINT
after a seeded random delay, and records how each ended.  Forked children start in
milliseconds, so a test can kill a command twenty times in a few seconds.

Usage: python kill_server.py PLAN.json  (plan: argv, kills, seed, delay [lo, hi], watch, snaps,
follow: run the printed continue command next; until: a path under watch whose absence after
a kill widens the delay window, up to 20 s).  Writes PLAN.json's "out" (a JSON list: one
{"status", "signal", "stderr", "delay"} per child)."""

from __future__ import annotations

import importlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import sys
import time

import torch

from torchcal.cli import build_parser, main


def serve() -> None:
    """Run the plan of ``sys.argv[1]`` (the module docstring)."""
    torch.set_num_threads(1)
    plan = json.loads(open(sys.argv[1]).read())
    argv = list(plan["argv"])
    build_parser(argv[0])  # the command's module and its imports, before the first fork
    for name in plan.get("preload", []):  # what the command imports later (scikit-learn: 2 s)
        importlib.import_module(name)
    rng = random.Random(plan["seed"])
    first_delay = list(plan["delay"])
    records: list[dict] = []
    i = 0
    while sum(r["status"] != 0 for r in records) < plan["kills"] and i < 3 * plan["kills"]:
        delay, sig = rng.uniform(*plan["delay"]), rng.choice([signal.SIGTERM, signal.SIGINT])
        err_path = os.path.join(plan["snaps"], f"stderr{i}")
        # "{i}": the child's number (a title); "{bins}": 10 for an even child, 15 for an odd one
        args = [a.replace("{i}", str(i)).replace("{bins}", "15" if i % 2 else "10") for a in argv]
        pid = os.fork()
        if pid == 0:  # the child: torchcal ARGV, stderr to a file
            fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 2)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            sys.stderr = open(2, "w", closefd=False)
            code = 1
            try:
                code = main(args)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        time.sleep(delay)
        os.kill(pid, sig)
        _, status = os.waitpid(pid, 0)
        err = open(err_path).read()
        records.append({"status": os.waitstatus_to_exitcode(status), "signal": int(sig),
                        "stderr": err, "delay": delay, "i": i})
        if plan.get("watch") and os.path.isdir(plan["watch"]):  # the state the kill left
            shutil.copytree(plan["watch"], os.path.join(plan["snaps"], str(i)), symlinks=True)
        if records[-1]["status"] == 0:  # the command finished before the kill: kill sooner
            plan["delay"][1] = max(plan["delay"][0] + 0.005, 0.8 * plan["delay"][1])
        elif plan.get("until"):
            if not os.path.exists(os.path.join(plan["watch"], plan["until"])):
                # a loaded machine: no kill came after the first kept epoch yet; kill later, so
                # that the kills are spread over the training and not all in its start-up
                plan["delay"] = [plan["delay"][0], min(20.0, 1.5 * plan["delay"][1])]
            else:  # it got there: back to the planned window
                plan["delay"] = list(first_delay)
        m = re.search(r"(?:continue with|run it again|start it again with): (torchcal .*)$", err.strip())
        if plan.get("follow") and m:
            argv = shlex.split(m.group(1))[1:]
        i += 1
    json.dump(records, open(plan["out"], "w"))


if __name__ == "__main__":  # a script: pytest's doctest collection imports it
    serve()
