"""``--method relax`` and ``relax-correct`` in the run: chunks relaxed in batches, then each corrected.

The chunks still to do are taken in order, ``--relax-group`` of one length at a time; each brings its target and,
with the control, the next chunk's target (searched from the same seed, scored against the true chunk). The batch
is relaxed together (:class:`~memlab.probes.invert.pooled.relax.Relaxer`) within ``--relax-share`` of each target's budget
(``relax``: all of it); then, for ``relax-correct``, every target its relaxation did not certify is corrected
(:class:`~memlab.probes.invert.pooled.recover.Recoverer`) from its nearest projection with the budget it has left. Each
chunk's result is yielded as soon as its batch is done, so the run's log keeps it and ``--resume`` starts after
it.
"""

from __future__ import annotations

from memlab.probes.invert.pooled.report import pooled_chunk
from memlab.probes.invert.pooled.recover import RecoverResult
from memlab.probes.invert.pooled.relax import RelaxJob


def groups(todo: list[int], chunks: list[list[int]], size: int) -> list[list[int]]:
    """``todo`` in order, cut into runs of at most ``size`` chunks of one length (a chunk of another length starts
    a new run at its first place)."""
    out: list[list[int]] = []
    open_: dict[int, list[int]] = {}
    for i in todo:
        n = len(chunks[i])
        g = open_.get(n)
        if g is None or len(g) >= size:
            g = []
            open_[n] = g
            out.append(g)
        g.append(i)
    return out


def _finish(run, rel, target, length: int, seed: int, decode) -> RecoverResult:
    """The result of one target: its relaxation's, or the correction's from there with the budget left."""
    text = decode(rel.ids)
    if run.opts.pooled.method == "relax" or rel.certified:
        return RecoverResult(rel.ids, rel.distance, rel.distance, rel.forwards, rel.seconds, rel.steps,
                             proposal=text)
    left = max(run.budget_s - rel.seconds, 0.0)
    r = run.recoverer.search(target, length, seed=seed, start=rel.ids, seconds=left,
                             forwards=max(run.opts.pooled.forwards - rel.forwards, 1))
    if rel.distance < r.distance:  # never worse than the relaxation's own best
        r.ids, r.distance = rel.ids, rel.distance
    r.start_distance = rel.distance
    r.forwards += rel.forwards
    r.seconds += rel.seconds
    r.steps += rel.steps
    r.proposal = text
    return r


def relaxed_chunks(run, todo: list[int], texts, chunks, targets, step):
    """Each chunk of ``todo`` relaxed (in batches) and corrected; its
    :class:`~memlab.probes.invert.pooled.report.PooledChunk` yielded as its batch ends (``run``: the
    :class:`~memlab.probes.invert.pooled.run.PooledRun`)."""
    o = run.opts.pooled
    decode = run.enc.tokenizer.decode
    control = o.control and len(targets) > 1
    share = o.relax_share if o.method == "relax-correct" else 1.0
    note = getattr(run, "note", None)
    for group in groups(todo, chunks, o.relax_group):
        jobs, slots = [], []
        for i in group:
            seed = run.opts.text.seed + i
            jobs.append(RelaxJob(targets[i], len(chunks[i]), seed))
            slots.append((i, None))
            if control:
                j = (i + 1) % len(targets)
                jobs.append(RelaxJob(targets[j], len(chunks[i]), seed))
                slots.append((i, j))
        relaxed = run.relaxer.run(jobs, run.budget_s * share, note=note,
                                  forwards_each=max(int(o.forwards * share), 2))
        by_chunk: dict[int, dict] = {}
        for (i, j), job, rel in zip(slots, jobs, relaxed):
            res = _finish(run, rel, job.target, job.length, job.seed, decode)
            by_chunk.setdefault(i, {})["control" if j is not None else "main"] = (res, j, rel)
            step()
        for i in group:
            got, _, rel = by_chunk[i]["main"]
            ctrl, j, _ = by_chunk[i].get("control", (None, None, None))
            c = pooled_chunk(i, texts[i], chunks[i], got, decode, ctrl, j, tol=o.tol)
            c.relax_distance, c.relax_steps = rel.distance, rel.steps
            c.cosine = run.cosine(got.ids, targets[i])
            yield c
