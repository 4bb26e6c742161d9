"""The shared setup of the recipes over sentence embeddings: ``sonar_llm``, ``lcm_mse`` and
``lcm_diffusion`` subclass :class:`SentenceRecipe` with their own family and loss.

Data path: corpus -> units (chapters) -> splits -> Punkt sentences -> windows of
``window_sentences`` + the end sentence -> embeddings and token ids, cached once
per (space, corpus, split) with ``datasets`` (:mod:`memlab.data.embcache`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from memlab.data import embcache
from memlab.data.views import sentence_documents, split_corpus
from memlab.errors import ConfigError
from memlab.flops import measured_step_flops
from memlab.models.sentence.data import SentenceDocDataset, collate_documents, make_documents
from memlab.models.sentence.spaces import SpaceHandle, load_space, normalize_spec
from memlab.registry import FAMILIES
from memlab.train.setup import TrainSetup


@dataclass
class SentenceOptions:
    """Options of the sentence-level recipes (sonar_llm, lcm_mse, lcm_diffusion)."""

    space: str = "toy_ae"
    """Embedding space spec ``NAME[:ARG]``: ``memory_ae:RUN_DIR`` (this machine's default), ``sonar:NAME`` (real
    SONAR, GPU + network), ``toy_ae[:DIR]`` (tests)."""
    window_sentences: int = 16
    """Sentences per training document: long units (chapters) are cut into windows of this many (0 = whole units)."""
    end_sentence: str = "End of sequence."
    """Sentence appended to every document; generation stops when it is predicted."""
    max_sentence_tokens: int = 64
    """Sentences longer than this many tokens (space tokenizer; at most the space's ``max_tokens``) are truncated
    (counted in summary.json)."""
    short_documents: str = "drop"
    """A unit of fewer than two sentences: ``drop`` it (counted) or raise an ``error``."""
    cache_dir: str | None = None
    """Root of the embedding cache (default ``$MEMLAB_CACHE/embeddings``)."""
    embedding_cache: str | None = None
    """Explicit cache folder (holds ``train/`` and ``validation/``); it must have been built with this space."""
    encode_batch_size: int = 64
    """Sentences per batch when the frozen encoder fills the cache."""
    unfreeze_decoder: bool = False
    """SONAR-LLM only: train the space's decoder too (its weights are saved beside the model)."""
    stop_cosine: float = 0.98
    """Generation stops when cosine(embedding, end sentence embedding) reaches this."""


def corpus_documents(cfg, opts: SentenceOptions) -> tuple[dict[str, list[list[str]]], dict[str, int]]:
    """Split -> documents (windows, each ending with the end sentence), and units dropped per split.

    Punkt over a whole corpus is slow on a busy machine, so the result is cached (JSON under
    ``$MEMLAB_CACHE/sentences/``) by a hash of the split units' text and the windowing options, sealed with a
    digest of its content (:mod:`memlab.cachecheck`): a damaged one is named in one warning line and rebuilt.
    """
    import hashlib

    from memlab.data.tokenizer import cache_dir

    splits = split_corpus(cfg.data)
    h = hashlib.sha256(json.dumps([opts.window_sentences, opts.end_sentence, opts.short_documents]).encode())
    for name in sorted(splits):
        h.update(name.encode())
        for u in splits[name]:
            h.update(hashlib.sha256(u.text.encode()).digest())
    cached = cache_dir() / "sentences" / f"{h.hexdigest()[:20]}.json"
    from memlab.cachecheck import seal, sealed

    if cached.is_file():
        try:
            got = json.loads(cached.read_text())
        except (OSError, ValueError):
            got = None
        if sealed(got):
            return got["docs"], got["dropped"]
        import sys

        print(f"memlab: warning: sentence cache {cached} is damaged (it does not match its digest); rebuilding it",
              file=sys.stderr)
    out, dropped = {}, {}
    for name, part in splits.items():
        if not part:
            continue
        out[name], dropped[name] = make_documents(sentence_documents(part), opts.window_sentences, opts.end_sentence,
                                                  opts.short_documents)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    from memlab.rundir import guarded

    with guarded(f"the sentence cache in {cached.parent}", tmp):  # a full disk: one line, no temporary file
        tmp.write_text(json.dumps(seal({"docs": out, "dropped": dropped})))
        os.replace(tmp, cached)
    return out, dropped


def embedded_splits(handle: SpaceHandle, docs: dict[str, list[list[str]]], opts: SentenceOptions,
                    names=("train", "validation"), env=None) -> dict[str, embcache.SentenceSplit]:
    from memlab.data.tokenizer import cache_dir

    root = Path(opts.cache_dir) if opts.cache_dir else cache_dir() / "embeddings"
    max_tokens = min(opts.max_sentence_tokens, int(getattr(handle.space, "max_tokens", None) or opts.max_sentence_tokens))
    out = {}
    for name in names:
        if name not in docs:
            continue
        path = Path(opts.embedding_cache) / name if opts.embedding_cache else None
        out[name] = embcache.build_or_load(handle.space, handle.spec, docs[name], name, root, max_tokens,
                                           opts.encode_batch_size, path, env=env)
    return out


def step_flops_per_document(loss_fn, model, data: SentenceDocDataset, n: int = 8) -> float:
    """Training FLOPs per document, counted by torch on up to ``n`` documents spread over the split.

    Each document is one step of its own (no padding between documents): the
    sentence model's forward and backward passes and, for SONAR-LLM, the frozen
    space decoder it learns through (its forward pass and the backward pass to
    its inputs), which an analytic count of the sentence model alone leaves out.
    """
    picks = sorted({int(i * len(data) / n) for i in range(min(n, len(data)))})
    total = sum(measured_step_flops(loss_fn, model, collate_documents([data[i]])) for i in picks)
    return total / max(len(picks), 1)


def freeze_unused_by_decoder(handle: SpaceHandle) -> list[str]:
    """Freeze the parameters of a trainable space that its decoder's loss never reaches (the encoder half:
    training reads cached embeddings), found by one tiny teacher-forced decode and backward. Under DDP a
    trainable parameter without a gradient would stall every step. Returns the frozen names."""
    import torch

    from memlab.models.sentence.objective import decoder_cross_entropy
    from memlab.space import tokenize

    space = handle.space
    sentence = ["End of sequence."]
    ids, mask = tokenize(space, sentence)
    with torch.no_grad():
        z = handle.encode_text(sentence).to(handle.device())  # (1, E)
    z.requires_grad_(True)
    for p in space.parameters():
        p.grad = None
    total, _, _ = decoder_cross_entropy(space, handle.shape, z, ids.to(z.device), mask.to(z.device))
    total.backward()
    frozen = [n for n, p in space.named_parameters() if p.requires_grad and p.grad is None]
    for n, p in space.named_parameters():
        p.grad = None
        if n in frozen:
            p.requires_grad_(False)
    return frozen


class SentenceRecipe:
    """Shared setup of the sentence-level recipes; subclasses set the name, the family and the loss."""

    name = ""
    family = ""
    options_class = SentenceOptions
    trains_decoder = False
    """The loss goes through the space's decoder, so ``options.unfreeze_decoder`` can train it."""

    def make_loss(self, handle: SpaceHandle, model, opts: SentenceOptions):  # pragma: no cover - abstract
        raise NotImplementedError

    def setup(self, cfg, run_dir: Path, env=None) -> TrainSetup:
        from memlab.train.processes import SetupEnv

        env = env or SetupEnv()
        opts: SentenceOptions = cfg.options or SentenceOptions()
        if opts.short_documents not in ("drop", "error"):
            raise ConfigError(f"options.short_documents must be 'drop' or 'error', got '{opts.short_documents}'")
        if cfg.model.family != self.family:
            raise ConfigError(f"recipe '{self.name}' trains family '{self.family}', not model.family='{cfg.model.family}'")
        spec = normalize_spec(opts.space)
        handle = SpaceHandle(load_space(spec), spec, freeze=True).to(env.device)  # the frozen encoder runs there
        docs, dropped = env.on_main(lambda: corpus_documents(cfg, opts))  # Punkt once; every process reads its result
        splits = embedded_splits(handle, docs, opts, env=env)  # encoded once across processes
        train = splits["train"]
        model = self.build_model(cfg, handle, opts, train)
        if opts.unfreeze_decoder:
            self.attach_trainable_space(model, handle)
        longest = max(int((s.doc_offsets[1:] - s.doc_offsets[:-1]).max()) for s in splits.values())
        if longest - 1 > model.config.max_position_embeddings:
            raise ConfigError(f"a document holds {longest} sentences; the model reads at most "
                              f"max_position_embeddings={model.config.max_position_embeddings} (lower window_sentences)")
        self.write_space_file(run_dir, handle, train)
        mean_len = train.embeddings.shape[0] / max(train.num_documents, 1)
        train_data = SentenceDocDataset(train)
        loss_fn = self.make_loss(handle, model, opts)
        val = splits.get("validation")
        model.to(env.device)
        flops = env.on_main(lambda: step_flops_per_document(loss_fn, model, train_data))  # real passes: once
        return TrainSetup(
            model=model,
            train_data=train_data,
            eval_data=SentenceDocDataset(val) if val is not None else None,
            loss_fn=loss_fn,
            eval_step_fn=getattr(loss_fn, "evaluate", None),
            collate_fn=collate_documents,
            tokens_per_example=int(mean_len),
            flops_per_example=flops,
            summary={"space": spec, "embedding_shape": handle.shape, "train_documents": train.num_documents,
                     "train_sentences": int(train.embeddings.shape[0]),
                     "eval_documents": val.num_documents if val is not None else 0,
                     "truncated_sentences": train.meta.get("truncated_sentences", 0), "dropped_units": dropped},
        )

    def build_model(self, cfg, handle: SpaceHandle, opts: SentenceOptions, train: embcache.SentenceSplit):
        family = FAMILIES.get(cfg.model.family)
        if cfg.model.init_from:
            from memlab.loading import load_pretrained

            model = load_pretrained(cfg.model.init_from, family.model_class)
            handle.check_width(model.config.embed_dim, f"the model in {cfg.model.init_from}")
            return model
        over = dict(cfg.model.overrides)
        if over.get("embed_dim", handle.width) != handle.width:
            handle.check_width(int(over["embed_dim"]), "model.overrides.embed_dim")
        over.update(embed_dim=handle.width, space_shape=handle.shape, space=handle.spec,
                    end_sentence=opts.end_sentence, stop_cosine=opts.stop_cosine)
        model = family.make_model(cfg.model.preset, **over)
        model.backbone.normalizer.fit(train.embeddings)
        return model

    def attach_trainable_space(self, model, handle: SpaceHandle) -> None:
        import torch

        if not self.trains_decoder:
            raise ConfigError(f"options.unfreeze_decoder does not apply to {self.name} (its loss never reaches the "
                              "space's decoder)")
        if not isinstance(handle.space, torch.nn.Module):
            raise ConfigError(f"space '{handle.spec}' is not an nn.Module, so its decoder cannot be trained")
        model.space = handle.space  # a submodule: optimised, moved and saved (as 'space.*') with the model
        handle.space.requires_grad_(True)
        freeze_unused_by_decoder(handle)  # the encoder half never trains (embeddings are cached): frozen
        model.config.decoder_trained = True

    @staticmethod
    def write_space_file(run_dir: Path, handle: SpaceHandle, train: embcache.SentenceSplit) -> None:
        """``RUN/space.json``: what rebuilds the space (its spec) and what identifies it."""
        meta = {k: train.meta[k] for k in ("space", "shape", "probe") if k in train.meta}
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / f"space.json.tmp{os.getpid()}"
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, run_dir / "space.json")

