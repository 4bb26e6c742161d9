"""``memlab.app.cli.main`` under ``accelerate launch``, with test instruments (tests/train/test_distributed.py).

    python tests/dist_helper.py count-encodes DIR -- train CONFIG ...   # the sentences each process encodes
    python tests/dist_helper.py fail RANK STEP -- train CONFIG ...      # a MemlabError on one process after STEP
    python tests/dist_helper.py threads DIR CORES -- train CONFIG ...   # each process's torch threads, on a host
                                                                        # that shows CORES cores
"""

from __future__ import annotations

import atexit
import json
import os
import sys


def _count_encodes(out_dir: str) -> None:
    """Log, per process, each sentence-cache build (split, unique sentences) and the sentences it encodes."""
    from memlab.data import embcache

    log: list[dict] = []
    build, encode = embcache.build_or_load, embcache.encode_sentences

    def logged_build(space, spec, documents, split, *a, **k):
        log.append({"split": split, "unique": len({s for d in documents for s in d})})
        return build(space, spec, documents, split, *a, **k)

    def logged_encode(space, sentences, *a, **k):
        log.append({"encode": list(sentences)})
        return encode(space, sentences, *a, **k)

    embcache.build_or_load, embcache.encode_sentences = logged_build, logged_encode
    path = os.path.join(out_dir, f"encodes-{os.environ.get('RANK', '0')}.json")
    atexit.register(lambda: open(path, "w").write(json.dumps(log)))


def _fail(rank: int, step: int) -> None:
    from memlab.errors import MemlabError
    from memlab.train.loop import Trainer

    real = Trainer._after_step

    def after_step(self, *a):
        if self.step == step and self.acc.process_index == rank:
            raise MemlabError(f"injected failure on process {rank} after step {step}")
        return real(self, *a)

    Trainer._after_step = after_step


def _threads(out_dir: str, cores: int) -> None:
    """A host of ``cores`` cores; at exit, write this process's intra-op thread count."""
    import torch

    from memlab.train import processes as devices

    devices.available_cores = lambda: cores
    path = os.path.join(out_dir, f"threads-{os.environ.get('RANK', '0')}.json")
    atexit.register(lambda: open(path, "w").write(json.dumps(torch.get_num_threads())))


def main() -> int:
    sep = sys.argv.index("--")
    mode, params, args = sys.argv[1], sys.argv[2:sep], sys.argv[sep + 1:]
    if mode == "count-encodes":
        _count_encodes(params[0])
    elif mode == "fail":
        _fail(int(params[0]), int(params[1]))
    elif mode == "threads":
        _threads(params[0], int(params[1]))
    from memlab.app.cli import main as cli

    return cli(args)


if __name__ == "__main__":
    sys.exit(main())
