"""Downloads from a loopback HTTP server (checksums, resume, atomicity), dataset-level download,
offline errors, and safe archive extraction."""

from __future__ import annotations

import hashlib
import http.server
import io
import socket
import stat
import tarfile
import threading
import zipfile
from functools import partial

import pytest

from torchcal.data import download as dl
from torchcal.data import load_splits
from torchcal.data.download import Resource, download_url, extract_archive, md5sum
from torchcal.data.fake import write_fake_cifar
from torchcal.errors import ChecksumError, DataNotFoundError


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files with single-range ``Range: bytes=N-`` support; records what it served."""

    served: list = []

    def log_message(self, *args):  # keep the test output clean
        pass

    def do_GET(self):
        path = self.translate_path(self.path)
        try:
            data = open(path, "rb").read()
        except OSError:
            self.send_error(404)
            return
        rng = self.headers.get("Range")
        start = int(rng.split("=")[1].rstrip("-")) if rng and self.server.ranges else 0
        if start and start >= len(data):
            self.send_error(416)
            return
        body = data[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        type(self).served.append((self.path, start, len(body)))


@pytest.fixture
def server(tmp_path):
    www = tmp_path / "www"
    www.mkdir()
    _Handler.served = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Handler, directory=str(www)))
    httpd.ranges = True
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    yield httpd, www, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _closed_port_url():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/nothing.tar.gz"


def test_download_verifies_checksum(server, tmp_path):
    _, www, base = server
    payload = bytes(range(256)) * 5000
    (www / "f.bin").write_bytes(payload)
    md5 = hashlib.md5(payload).hexdigest()
    dest = tmp_path / "out" / "f.bin"
    assert download_url(f"{base}/f.bin", dest, md5) == dest
    assert dest.read_bytes() == payload and not (tmp_path / "out" / "f.bin.part").exists()
    # Present and valid: no second request.
    n = len(_Handler.served)
    download_url(f"{base}/f.bin", dest, md5)
    assert len(_Handler.served) == n


def test_corrupt_download_rejected(server, tmp_path):
    _, www, base = server
    (www / "f.bin").write_bytes(b"corrupted bytes")
    dest = tmp_path / "f.bin"
    with pytest.raises(ChecksumError, match="expected the published 0123"):
        download_url(f"{base}/f.bin", dest, "0123456789abcdef0123456789abcdef")
    assert not dest.exists() and not (tmp_path / "f.bin.part").exists()


@pytest.mark.parametrize("ranges", [True, False])
def test_resume_partial_download(server, tmp_path, ranges):
    httpd, www, base = server
    httpd.ranges = ranges
    payload = b"0123456789" * 1000
    (www / "f.bin").write_bytes(payload)
    (tmp_path / "f.bin.part").write_bytes(payload[:4000])
    download_url(f"{base}/f.bin", tmp_path / "f.bin", hashlib.md5(payload).hexdigest())
    assert (tmp_path / "f.bin").read_bytes() == payload
    assert _Handler.served[-1][1:] == ((4000, 6000) if ranges else (0, 10000))


def test_dataset_download_through_registry(server, tmp_path, monkeypatch):
    _, www, base = server
    arc = write_fake_cifar(www, "cifar10", n_train=20, n_test=5)
    res = Resource(arc.name, f"{base}/{arc.name}", md5sum(arc), "CIFAR-10 (test copy)")
    monkeypatch.setitem(dl.RESOURCES, "cifar10", res)
    root = tmp_path / "root"
    s = load_splits("cifar10", root, download=True)
    assert (len(s.train), len(s.val), len(s.test)) == (18, 2, 5)
    assert (root / arc.name).exists() and (root / "cifar-10-batches-py" / "test_batch").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".torchcal-extract")]
    # A corrupted archive on the server is rejected and not kept.
    (www / arc.name).write_bytes(arc.read_bytes()[:-10] + b"x" * 10)
    root2 = tmp_path / "root2"
    with pytest.raises(ChecksumError):
        load_splits("cifar10", root2, download=True)
    assert not (root2 / arc.name).exists()


def test_offline_error_names_file_and_url(tmp_path, monkeypatch):
    url = _closed_port_url()
    monkeypatch.setitem(dl.RESOURCES, "cifar10",
                        Resource("cifar-10-python.tar.gz", url, "0" * 32, "CIFAR-10 (python version)"))
    with pytest.raises(DataNotFoundError) as e:
        load_splits("cifar10", tmp_path, download=True)
    msg = str(e.value)
    assert url in msg and "cifar-10-python.tar.gz" in msg and str(tmp_path.resolve()) in msg


# The published MD5s, each from an independent listing: torchvision's dataset sources
# (torchvision/datasets/cifar.py `tgz_md5`, svhn.py `split_list`; CIFAR-10's also REFERENCE §6),
# the MD5 the public Tiny-ImageNet loaders use (e.g. Avalanche's tiny_imagenet.py; torchvision
# has no Tiny-ImageNet), and Zenodo record 2535967 for CIFAR-10-C (torchvision has none either).
PUBLISHED = {
    "cifar10": ("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a", "www.cs.toronto.edu"),
    "cifar100": ("cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85", "www.cs.toronto.edu"),
    "svhn_train": ("train_32x32.mat", "e26dedcc434d2e4c54c9b2d4a06d8373", "ufldl.stanford.edu"),
    "svhn_test": ("test_32x32.mat", "eb5a983be6a315427106f1b164d9cef3", "ufldl.stanford.edu"),
    "tinyimagenet": ("tiny-imagenet-200.zip", "90528d7ca1a48142e341f4ef8d21d0de", "cs231n.stanford.edu"),
    "cifar10c": ("CIFAR-10-C.tar", "56bf5dcef84df0e2308c6dcbcbbd8499", "zenodo.org/records/2535967"),
}


def test_published_checksums_table():
    assert set(dl.RESOURCES) == set(PUBLISHED)
    for key, (filename, md5, host) in PUBLISHED.items():
        r = dl.RESOURCES[key]
        assert (r.filename, r.md5) == (filename, md5), key
        assert host in r.url and r.url.endswith("/" + r.filename), key


# ---------------------------------------------------------------------------------------------
# Safe extraction

def _tar(path, members):
    with tarfile.open(path, "w") as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name, data=b"x"):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name, target, kind):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


@pytest.mark.parametrize("member,why", [
    (_file("../evil.txt"), "'..'"),
    (_file("ok/../../evil.txt"), "'..'"),
    (_file("/tmp/torchcal-evil.txt"), "absolute"),
    (_link("ok/link", "/etc/passwd", tarfile.SYMTYPE), "link"),
    (_link("ok/link", "../../outside", tarfile.SYMTYPE), "link"),
    (_link("ok/hard", "/etc/passwd", tarfile.LNKTYPE), "link"),
])
def test_tar_escapes_rejected(tmp_path, member, why):
    arc = _tar(tmp_path / "a.tar", [_file("ok/fine.txt"), member])
    root = tmp_path / "root"
    with pytest.raises(ValueError, match=f"Unsafe archive member.*{why}"):
        extract_archive(arc, root)
    assert not (tmp_path / "evil.txt").exists()
    assert [p.name for p in root.iterdir()] == []  # nothing extracted, temp dir removed


def _zip(path, entries):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name)
            if mode is not None:
                info.external_attr = mode << 16
            zf.writestr(info, data)
    return path


@pytest.mark.parametrize("entry,why", [
    (("../evil.txt", b"x", None), "'..'"),
    (("/abs/evil.txt", b"x", None), "absolute"),
    (("ok/link", b"/etc/passwd", stat.S_IFLNK | 0o777), "symbolic link"),
])
def test_zip_escapes_rejected(tmp_path, entry, why):
    arc = _zip(tmp_path / "a.zip", [("ok/fine.txt", b"x", None), entry])
    root = tmp_path / "root"
    with pytest.raises(ValueError, match=f"Unsafe archive member.*{why}"):
        extract_archive(arc, root)
    assert not (tmp_path / "evil.txt").exists() and list(root.iterdir()) == []


def test_good_archives_extract_and_merge(tmp_path):
    root = tmp_path / "root"
    extract_archive(_tar(tmp_path / "a.tar.gz", [_file("d/a.txt", b"A"), _file("d/sub/b.txt", b"B")]), root)
    extract_archive(_zip(tmp_path / "b.zip", [("d/c.txt", b"C", None), ("d/a.txt", b"A2", None)]), root)
    assert (root / "d" / "a.txt").read_bytes() == b"A2"
    assert (root / "d" / "sub" / "b.txt").read_bytes() == b"B"
    assert (root / "d" / "c.txt").read_bytes() == b"C"
    assert sorted(p.name for p in root.iterdir()) == ["d"]
    with pytest.raises(ValueError, match="tar or zip"):
        extract_archive(_file_path(tmp_path), root)


def _file_path(tmp_path):
    p = tmp_path / "plain.txt"
    p.write_bytes(b"not an archive")
    return p


def test_concurrent_downloads_share_one_fetch(server, tmp_path, monkeypatch):
    # Two loaders (threads here; DDP ranks or parallel jobs in practice) on one data root: the
    # root lock makes one of them download and extract while the other waits, then reads.
    _, www, base = server
    arc = write_fake_cifar(www, "cifar10", n_train=20, n_test=5)
    monkeypatch.setitem(dl.RESOURCES, "cifar10",
                        Resource(arc.name, f"{base}/{arc.name}", md5sum(arc), "CIFAR-10 (test copy)"))
    root = tmp_path / "shared"
    (root / ".torchcal-extract-stale").mkdir(parents=True)  # left by a killed extraction
    results, errors = [], []

    def work():
        try:
            results.append(load_splits("cifar10", root, download=True))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 3
    assert [p for p in _Handler.served if p[0].endswith(arc.name)] == [(f"/{arc.name}", 0, arc.stat().st_size)]
    assert all(r.train.data.equal(results[0].train.data) for r in results)
    assert not (root / ".torchcal-extract-stale").exists()


def test_complete_part_file_is_promoted_without_network(tmp_path):
    payload = b"complete download, rename interrupted"
    (tmp_path / "f.bin.part").write_bytes(payload)
    out = download_url(_closed_port_url(), tmp_path / "f.bin", hashlib.md5(payload).hexdigest())
    assert out.read_bytes() == payload and not (tmp_path / "f.bin.part").exists()


def test_http_error_is_data_not_found(server, tmp_path):
    _, _, base = server
    with pytest.raises(DataNotFoundError, match="404"):
        download_url(f"{base}/missing.bin", tmp_path / "m.bin", "0" * 32)
    assert not (tmp_path / "m.bin").exists()


def test_overlong_part_file_restarts(server, tmp_path):
    _, www, base = server
    payload = b"abc" * 100
    (www / "f.bin").write_bytes(payload)
    (tmp_path / "f.bin.part").write_bytes(b"x" * 1000)  # longer than the file: HTTP 416
    download_url(f"{base}/f.bin", tmp_path / "f.bin", hashlib.md5(payload).hexdigest())
    assert (tmp_path / "f.bin").read_bytes() == payload


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_truncated_archive_is_one_line_naming_it(tmp_path, kind):
    """An unverified (verify=False) truncated archive: a ValueError naming it, not an EOFError
    from gzip or a BadZipFile, and no half-extracted files."""
    if kind == "tar.gz":
        arc = write_fake_cifar(tmp_path, "cifar10", n_train=60, n_test=12)
    else:
        arc = tmp_path / "a.zip"
        with zipfile.ZipFile(arc, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("d/x.bin", bytes(range(256)) * 400)
            zf.writestr("d/y.bin", bytes(range(256)) * 400)
    data = arc.read_bytes()
    if kind == "tar.gz":
        arc.write_bytes(data[: len(data) // 2])
        with pytest.raises(ValueError, match=f"Archive '{arc}' is truncated or corrupt"):
            load_splits("cifar10", tmp_path, verify=False)
    else:  # the directory at the end intact, compressed bytes in the middle zeroed
        arc.write_bytes(data[:100] + bytes(200) + data[300:])
        with pytest.raises(ValueError, match=f"Archive '{arc}' is truncated or corrupt"):
            extract_archive(arc, tmp_path / "out")
    assert not list(tmp_path.rglob(".torchcal-extract-*"))
