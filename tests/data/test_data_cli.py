"""``torchcal data list | check | download`` and :func:`torchcal.data.prepare.prepare`."""

from __future__ import annotations

import argparse
import http.server
import threading
from functools import partial

import pytest

from torchcal.cli.data import register
from torchcal.data import download as dl
from torchcal.data.download import Resource, md5sum
from torchcal.data.fake import write_fake_cifar, write_fake_svhn
from torchcal.data.prepare import prepare, status
from torchcal.errors import DataNotFoundError


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A loopback mirror serving tiny CIFAR-10 and SVHN files, registered in RESOURCES."""
    www = tmp_path / "www"
    arc = write_fake_cifar(www, "cifar10", n_train=20, n_test=5)
    mats = [write_fake_svhn(www, s, n=10) for s in ("train", "test")]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(www)))
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    for key, p in (("cifar10", arc), ("svhn_train", mats[0]), ("svhn_test", mats[1])):
        monkeypatch.setitem(dl.RESOURCES, key, Resource(p.name, f"{base}/{p.name}", md5sum(p), key))
    yield tmp_path / "root"
    httpd.shutdown()
    httpd.server_close()


def _run(argv):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_prepare_and_status(mirror):
    root = mirror
    assert not status("cifar10", root)["ready"]
    with pytest.raises(DataNotFoundError, match="cifar-10-python.tar.gz"):
        prepare("cifar10", root, download=False)
    prepare("cifar10", root)
    st = status("cifar10", root)
    assert st["ready"] and st["archives"] == {"cifar-10-python.tar.gz": True}
    prepare("svhn", root)
    assert status("svhn", root)["ready"]
    with pytest.raises(ValueError, match="Unknown data set 'mnist'"):
        prepare("mnist", root)


def test_cli_download_and_check(mirror, capsys):
    root = str(mirror)
    assert _run(["data", "check", "cifar10", "--data-root", root]) == 1
    assert "absent: torchcal data download cifar10" in capsys.readouterr().out
    assert _run(["data", "download", "cifar10", "svhn", "--data-root", root, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "cifar10: ready" in out and "svhn: ready" in out
    assert _run(["data", "check", "cifar10", "svhn", "--data-root", root]) == 0
    assert _run(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "cifar10, cifar100, digits, imagenet, mnist1d, svhn, tinyimagenet" in out
    assert f"cifar-10-python.tar.gz     {dl.RESOURCES['cifar10'].md5}  http://127.0.0.1:" in out
    with pytest.raises(SystemExit):
        _run(["data", "download", "mnist"])
