"""A pod's volumes in the kubelet simulator's process runtime (sandbox/podprocs.py) hide
what a real volume hides, and nothing of the image: the Deployment mounts an emptyDir at
/tmp, and a checkout (the "image") under /tmp must stay visible to the worker, as must
the pod's other volume sources, which live under /tmp too. A fresh-clone CI in /tmp
failed with exit 127 (`raysize` not found) before."""

from __future__ import annotations

import subprocess
from pathlib import Path

from raysize.sandbox.podprocs import _in_own_mounts


def test_a_volume_over_the_images_folder_hides_neither_the_image_nor_other_sources(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"  # stands for /tmp
    image = root / "checkout"  # a clone under /tmp, with its install
    image.mkdir(parents=True)
    (image / "marker").write_text("image\n")
    empty = tmp_path / "empty"  # the pod's emptyDir
    empty.mkdir()
    secret = root / "pods" / "secret"  # a Secret volume's files, under /tmp as well
    secret.mkdir(parents=True)
    (secret / "api-key").write_text("k1\n")
    (root / "stray").write_text("host /tmp\n")
    secret_at = tmp_path / "etc-secret"
    mounts = [(empty, str(root)), (secret, str(secret_at))]
    script = (
        f"cat {image}/marker {secret_at}/api-key && touch {root}/beat && test ! -e {root}/stray"
    )
    done = subprocess.run(
        [*_in_own_mounts(mounts, keep=[image]), "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout == "image\nk1\n"
    assert (empty / "beat").exists()  # the write went to the emptyDir
    assert not (root / "beat").exists()  # not to the host's folder
    assert (root / "stray").exists()
