"""Behaviour, not spelling: identify the advantage estimator by running the code block that computes it.

The recogniser finds the statement that centres rewards on a baseline (``x - x.mean()``,
``(r - np.mean(g)) / (np.std(g) + eps)``, ``(s - r) / (k - 1)``...), cuts out the pure statements it
depends on inside its function (assignments built from arithmetic, ``.mean``/``.std``/``.sum``/``.view``,
numpy/torch/math calls, comprehensions) together with the loops and branches around it, and runs only
that block, never the user's module, in a sandboxed subprocess: isolated interpreter (``-I``), temporary
working directory, CPU-time and file-size limits (a file write fails), memory limit, sockets disabled.
Names the block cannot compute are its inputs; each is bound in turn to synthetic rewards (a list, a
numpy array, a flat or ``(B, G)`` torch tensor, objects whose every attribute or item is the reward), the
group size or the batch count, and the outputs are compared with verl_bridge's estimators: GRPO with a
population or sample std, the mean baseline (GRPO without std), RLOO's leave-one-out baseline, or
batch whitening. When the block cannot be isolated the static recognisers decide alone, and the report
says so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Optional

import libcst as cst

from .._static import Known, walk
from .base import _code, _last

PURE_CALLS = {"mean", "std", "var", "sum", "view", "reshape", "unsqueeze", "squeeze", "detach", "to", "float", "item",
              "tolist", "array", "asarray", "tensor", "as_tensor", "stack", "cat", "len", "list", "tuple", "zip", "abs",
              "max", "min", "range", "sqrt", "zeros_like", "ones_like", "clone", "cpu", "numpy", "flatten", "expand_as",
              "repeat", "repeat_interleave", "sub", "div", "mul", "add", "keepdim", "values", "items", "keys", "append",
              "extend", "mean_", "nanmean", "nanstd", "full_like", "unflatten", "transpose", "t", "enumerate", "int",
              "clamp", "clip", "where", "norm", "maximum", "minimum", "dict", "sorted", "isclose", "all", "any",
              "contiguous", "type_as", "double", "half", "bfloat16", "Tensor", "FloatTensor"}
MODULE_ALIASES = {"np", "numpy", "torch", "math", "F", "nn"}
BUILTINS = {"len", "list", "tuple", "zip", "abs", "max", "min", "range", "sum", "float", "int", "enumerate", "dict",
            "sorted", "all", "any", "True", "False", "None", "print", "isinstance", "round"}
BASELINE_RE = re.compile(r"\.(mean|sum|nanmean)\(|np\.(mean|sum)|torch\.(mean|sum)|mean|baseline|sum", re.I)

SANDBOX_PRELUDE = r'''
import json, sys, math, itertools, socket, os, tempfile
# no file can be written here (RLIMIT_FSIZE 0), so tempfile's probe of a writable directory fails;
# libraries that ask for it at import (dill, which torch imports where installed) get the cwd instead
tempfile.tempdir = os.getcwd()
import numpy as np
import torch
import torch.nn.functional as F
import builtins, io, os
_real_open = builtins.open
def _read_only_open(file, mode="r", *a, **k):
    if any(c in str(mode) for c in "wax+"):
        raise PermissionError("file writes are disabled in the verl-bridge probe")
    return _real_open(file, mode, *a, **k)
builtins.open = io.open = _read_only_open
def _denied(*a, **k):
    raise PermissionError("disabled in the verl-bridge probe")
for _n in ("remove", "unlink", "rename", "replace", "rmdir", "removedirs", "mkdir", "makedirs", "truncate", "chmod",
           "chown", "system", "popen", "kill", "fork", "execv", "execve", "symlink", "link", "utime"):
    if hasattr(os, _n):
        setattr(os, _n, _denied)
class _NoNet(socket.socket):
    def __init__(self, *a, **k):
        raise OSError("network disabled in the verl-bridge probe")
def _no_net(*a, **k):
    raise OSError("network disabled in the verl-bridge probe")
socket.socket = _NoNet
socket.create_connection = _no_net
import signal
class _Slow(Exception):
    pass
def _on_alarm(*a):
    raise _Slow("one run of an extracted block took too long")
signal.signal(signal.SIGALRM, _on_alarm)
def run_limited(code, env, seconds=0.5):
    """exec one extracted block; a block that runs longer than *seconds* raises (the probe goes on)."""
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        exec(code, env)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
'''

RUNNER = r'''
spec = json.loads(sys.stdin.read())
class R(float):
    """A reward: every attribute or item of it is itself (episode.reward, item["reward"])."""
    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        return self
    def __getitem__(self, k):
        return self
    def __iter__(self):
        raise TypeError("a reward is not a sequence")
class RA(float):
    """A reward whose attributes are itself (episode.reward) but which is no sequence, so that
    torch.tensor([e.reward for e in group]) sees plain numbers."""
    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        return self
class RD(float):
    """A sample record holding a reward: every attribute or item of it is the plain number
    (sample["reward"], sample.reward), for groups given as lists of samples."""
    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        return float(self)
    def __getitem__(self, k):
        return float(self)
B, G = 3, 4
class NS:
    """A settings object: every attribute is the group size (args.group_size, cfg.num_generations)."""
    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        return G
REW = [0.3, 1.7, -0.4, 2.2, 0.9, 0.1, 1.1, -1.3, 0.5, 0.8, 2.9, -0.2]
def forms():
    yield "list", [R(x) for x in REW], "flat"
    yield "np", np.array(REW), "flat"
    if spec["torch"]:
        yield "t1", torch.tensor(REW), "flat"
        yield "t2", torch.tensor(REW).view(B, G), "rows"
    yield "alist", [RA(x) for x in REW], "flat"
    yield "glist", [R(x) for x in REW[:G]], "group"
    yield "galist", [RA(x) for x in REW[:G]], "group"
    yield "gnp", np.array(REW[:G]), "group"
    if spec["torch"]:
        yield "gt", torch.tensor(REW[:G]), "group"
def flat(v):
    if spec["torch"] and isinstance(v, torch.Tensor):
        return v.detach().double().reshape(-1).tolist()
    if isinstance(v, (list, tuple)):
        out = []
        for x in v:
            out.extend(flat(x))
        return out
    if isinstance(v, np.ndarray):
        return v.astype(float).reshape(-1).tolist()
    return [float(v)]
out = []
for block in spec["blocks"]:
    inputs = block["inputs"]
    try:
        code = compile(block["code"], "<probe>", "exec")
    except SyntaxError:
        out.append([])
        continue
    found = []
    roles = ["rewards", "G", "B", "Blist", "ns", "groups", "glists"]
    # a name unzipped into (reward, extra) pairs (rewards, info = zip(*results)) holds pairs
    import re as _re
    paired = set(_re.findall(r"zip\(\*\s*(\w+)\s*\)", block["code"]))
    per_input = [["T", "F"] if name in block.get("flags", []) else ["pairs"] if name in paired else roles
                 for name in inputs]
    import time as _time
    _t0 = _time.process_time()  # CPU time, not wall time: a loaded machine must not change what is found
    for combo in itertools.product(*per_input):
        if _time.process_time() - _t0 > 8.0:
            break  # a block this slow on toy inputs is not an advantage computation
        if combo.count("rewards") + combo.count("groups") + combo.count("glists") + combo.count("pairs") != 1:
            continue
        whole = "groups" in combo or "glists" in combo  # every group at once: one run, whatever the scope
        for fname, rew, shape in forms():
            if whole and fname != "list" or not whole and (shape == "group") != (block["scope"] == "group"):
                continue
            env = {"np": np, "math": math, "__cap": [], "R": R}
            if spec["torch"]:
                env.update(torch=torch, F=F)
            env.update(block["consts"])
            for name, role in zip(inputs, combo):
                env[name] = {"rewards": rew, "G": G, "B": B, "Blist": list(range(B)), "ns": NS(), "T": True, "F": False,
                             "groups": {i: [R(x) for x in REW[i * G:(i + 1) * G]] for i in range(B)},
                             "glists": [[RD(x) for x in REW[i * G:(i + 1) * G]] for i in range(B)],
                             "pairs": [(x, {}) for x in rew] if isinstance(rew, list) else None}[role]
            if ("groups" in combo or "glists" in combo) and shape != "flat":
                continue
            try:
                run_limited(code, env)
                caps = env["__cap"][-1:] if block.get("cap_last") else env["__cap"]
                vals = [flat(c) for c in caps]
            except Exception as e:
                continue
            got = [x for v in vals for x in v]
            if not got or any(x != x for x in got):
                continue
            found.append({"combo": dict(zip(inputs, combo)), "form": fname,
                          "shape": "flat" if "groups" in combo or "glists" in combo else shape, "out": got})
    out.append(found)
print(json.dumps(out))
'''


def _classify(shape: str, got: list) -> Optional[tuple]:
    """(estimator, norm_by_std, detail) for the outputs of a block given the synthetic rewards."""
    import math

    rew = [0.3, 1.7, -0.4, 2.2, 0.9, 0.1, 1.1, -1.3, 0.5, 0.8, 2.9, -0.2]
    B, G = 3, 4

    def groups(vals, g):
        return [vals[i:i + g] for i in range(0, len(vals), g)]

    def refs(rs):
        n = len(rs)
        m = sum(rs) / n
        pop = math.sqrt(sum((x - m) ** 2 for x in rs) / n)
        unb = math.sqrt(sum((x - m) ** 2 for x in rs) / (n - 1))
        s = sum(rs)
        return {
            ("grpo", True, "population std"): [(x - m) / pop for x in rs],
            ("grpo", True, "sample std"): [(x - m) / unb for x in rs],
            ("grpo", False, "mean baseline"): [x - m for x in rs],
            ("rloo", None, "leave-one-out baseline"): [x - (s - x) / (n - 1) for x in rs],
        }

    def close(a, b):
        return len(a) == len(b) and all(abs(x - y) <= 2e-3 * max(1.0, abs(y)) for x, y in zip(a, b))

    if shape == "group":
        cands = [(G, rew[:G])]
    elif shape == "rows":
        cands = [(G, rew)]
    else:
        cands = [(g, rew) for g in (G, 2, 6, 12) if len(rew) % g == 0]
    for g, rs in cands:
        if len(got) != len(rs):
            continue
        for key in refs(rs[:g]):
            want = [x for grp in groups(rs, g) for x in refs(grp)[key]]
            if close(got, want):
                name, std, detail = key
                if g == len(rs) and len(rs) > G and name == "grpo" and std:
                    return ("whiten", True, "normalised over the whole batch")
                return name, std, detail
    return None


class ProbeMixin:
    def probe_loss_agg(self) -> None:
        """``algorithm.loss_agg_mode`` from running the project's masked-mean helper that aggregates the
        policy loss (``pg_loss = masked_mean(x, mask)``) on a ragged synthetic batch: a token mean over a
        micro-batch of ONE sequence (a proven ``micro_batch_size: 1``), gradients accumulated over
        micro-batches, is the per-sequence token mean averaged over sequences: seq-mean-token-mean."""
        if "algorithm.loss_agg_mode" in self.a.config or self.a.config.get("algorithm.micro_batch_size") != 1:
            return
        prov = self.a.provenance.get("algorithm.micro_batch_size", "")
        if not re.match(r"[\w./-]+\.py:\d+$", prov):
            return
        for node, info in self.p.nodes_of(cst.Assign):
            if not (isinstance(node.value, cst.Call) and len(node.targets) == 1 and
                    isinstance(node.targets[0].target, cst.Name) and
                    re.fullmatch(r"pg_?loss|policy_loss|actor_loss|pg_losses?", node.targets[0].target.value)):
                continue
            if not any(x is self.main_loop for x in self.p.ancestors(node)):
                continue
            t = self.p.resolve_callee(node.value, info)
            if t is None or len([a for a in node.value.args if a.keyword is None]) != 2:
                continue
            f = t[0]
            if f.cls is not None or not all(_pure(n.value) if isinstance(n, (cst.Assign, cst.Return)) and
                                            n.value is not None else True for n in walk(f.node.body)):
                continue
            code = (cst.Module([]).code_for_node(f.node) + "\n"
                    "x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])\n"
                    "m = torch.tensor([[True, True, False], [True, False, False]])\n"
                    f"__cap.append({f.name}(x, m))\n")
            res = run_blocks([{"code": code, "inputs": ["_r"], "consts": {}, "scope": "batch", "cap_last": True,
                               "flags": [], "torch": True}])
            if not res or not res[0]:
                return
            out = res[0][0]["out"]
            if len(out) == 1 and abs(out[0] - 7.0 / 3.0) < 1e-6:
                self.emit("algorithm.loss_agg_mode", Known("seq-mean-token-mean", self.p.line(node)))
                self.a.warn(f"algorithm.loss_agg_mode: {f.name}() ({self.loc(self.p.line(f.node))}) ran on a ragged "
                            "synthetic batch in the sandbox and returned the token mean; over micro-batches of one "
                            f"sequence ({prov}) with accumulated gradients that is seq-mean-token-mean")
            return

    def probe_advantages(self) -> Optional[tuple]:
        """(estimator, norm_by_std, line, detail) found by running the block that centres the rewards on
        synthetic rewards, or None. Sets ``self.probe_note`` to what was (not) run."""
        sites = self._probe_sites()
        if not sites:
            self.probe_note = "no block centring rewards on a baseline was found to run"
            return None
        blocks = []
        for node, info in sites[:12]:
            b = self._probe_block(node, info)
            if b is not None:
                blocks.append((node, b))
                # inputs that are parameters or names of the enclosing function: computed at the call site
                for cb in self._compose_outward(b, info):
                    blocks.append((node, cb))
        if not blocks:
            self.probe_note = ("the blocks centring rewards depend on code that cannot be run in isolation "
                               f"({self.loc(self.p.line(sites[0][0]))})")
            return None
        results = run_blocks([b for _, b in blocks])
        if results is None:
            self.probe_note = "the sandboxed probe did not finish"
            return None
        for (node, b), found in zip(blocks, results):
            if os.environ.get("VERL_BRIDGE_PROBE_DEBUG"):
                print(self.loc(self.p.line(node)), json.dumps(b), json.dumps(found)[:1500], file=sys.stderr)
            hits = []
            for f in found:
                c = _classify(f["shape"], f["out"])
                if c is not None and c[0] != "whiten":
                    hits.append((c, {k: v for k, v in f["combo"].items() if k in b.get("flags", [])}))
            if not hits:
                continue
            names = {c[0] for c, _ in hits}
            if len(names) != 1:
                self.probe_note = (f"the block at {self.loc(self.p.line(node))} computes different estimators "
                                   f"({', '.join(sorted(names))}) depending on run-time flags")
                return None
            # the input that, bound to the group size, produced the matching grouping: its static value
            self.probe_group = None
            info = self.p.func_of(node)
            g_inputs = {k for f in found for k, v in f["combo"].items() if v in ("G", "ns")
                        if _classify(f["shape"], f["out"]) is not None}
            for nm in sorted(g_inputs):
                ev = self.p.ev_param(info, nm) if info is not None and nm in info.params else None
                if isinstance(ev, Known) and isinstance(ev.value, int) and not isinstance(ev.value, bool):
                    self.probe_group = (ev, nm)
            if info is not None:
                self.advantage_funcs = getattr(self, "advantage_funcs", set()) | {id(info.node)}
            stds = {c[1] for c, _ in hits}
            if len(stds) == 1:
                c = hits[0][0]
                return (c[0], c[1], self.p.line(node), c[2])
            # the std division depends on a run-time flag: name certain, norm_adv_by_std not
            on = sorted({k for c, fl in hits if c[1] for k, v in fl.items() if v == "T"})
            self.probe_flag = (", ".join(on) or "a flag", node)
            c = hits[0][0]
            return (c[0], None, self.p.line(node), "group-normalised; the division by the std depends on the "
                    f"run-time flag {', '.join(on) or '?'}")
        self.probe_note = (f"the block at {self.loc(self.p.line(blocks[0][0]))} ran on synthetic rewards but matched no "
                           "verl-bridge estimator (GRPO with/without std, RLOO)")
        return None

    def _probe_sites(self) -> list:
        region = self.loop_region(self.main_loop)
        funcs = []
        for r in region:
            f = self.p.funcs.get(id(r)) if isinstance(r, cst.FunctionDef) else self.p.func_of(r)
            if f is not None and all(f is not g for g in funcs):
                funcs.append(f)
        out = []
        for f in funcs:
            for n in walk(f.node.body):
                if isinstance(n, cst.FunctionDef):
                    continue
                if _collect_site(n):
                    v = n.value.args[0].value  # out.extend((g - g.mean()) / g.std()): the list it fills
                elif not isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign)) or n.value is None:
                    continue
                else:
                    v = n.value
                centred = any(isinstance(b, cst.BinaryOperation) and isinstance(b.operator, cst.Subtract)
                              and self._is_baseline(b.right, f) for b in walk(v))
                if centred:
                    out.append((n, f))
        return out

    def _compose_outward(self, b: dict, info) -> list:
        """Blocks whose inputs are the callee's parameters (or names of the enclosing function of a
        nested one) rebuilt from where they are computed: the call site's argument expressions and the
        pure assignments behind them (one level of assignments), so
        ``compute_loss(r, r.mean(-1), r.std(-1))`` probes as a whole. A parameter bound by a comprehension
        or loop over a collection (``[f(e) for e in group]``) runs the block once per element."""
        out = []
        if info is None:
            return out
        params = [n for n in b["inputs"] if n in info.params]
        closure = [n for n in b["inputs"] if n not in info.params]
        if closure and info.parent is not None:
            outer = info.parent
        else:
            outer = None
            closure = []
        if not params and not closure:
            return out
        sites = self.p.calls_by_callee().get(info.qual, [])[:4] if params else [(None, outer, 0)]
        for call, caller, offset in sites:
            if params and call is None:
                continue
            pre, loop_over, ok = [], None, True
            defined: set = set()
            for nm in params:
                idx = info.params[nm][0]
                arg = self.p._arg_for(call, idx, nm, offset) if call is not None else None
                if arg is None or arg == "star":
                    ok = False
                    break
                comp = self._comprehension_target(call, arg)
                if comp is not None:
                    loop_over = (nm, _code(comp))
                    continue
                if not _pure(arg):
                    ok = False
                    break
                pre.append((nm, _code(arg), _loads(arg)))
            if not ok:
                continue
            scope = caller if params else outer
            names = {n for _, _, ld in pre for n in ld} | set(closure)
            if loop_over is not None:
                names |= set(_loads(cst.parse_expression(loop_over[1])))
            lines = []
            for nm in sorted(names - BUILTINS - MODULE_ALIASES):
                exprs = [e for e in self.p.assignments_of(nm, scope) if e is not None] if scope is not None else []
                pure = [e for e in exprs if _pure(e) and nm not in _loads(e)]
                if len(pure) == 1 and (len(exprs) == 1 or nm in closure):
                    e = pure[0]
                    for inner in sorted(set(_loads(e)) - BUILTINS - MODULE_ALIASES - defined):
                        iex = [x for x in self.p.assignments_of(inner, scope) if x is not None] if scope else []
                        if len(iex) == 1 and _pure(iex[0]) and inner not in _loads(iex[0]):
                            lines.append(f"{inner} = {_code(iex[0])}")
                            defined.add(inner)
                    lines.append(f"{nm} = {_code(e)}")
                    defined.add(nm)
            lines += [f"{nm} = {code}" for nm, code, _ in pre if code != nm]
            body = b["code"]
            if loop_over is not None:
                body = f"for {loop_over[0]} in {loop_over[1]}:\n" + "".join("    " + ln + "\n" for ln in body.splitlines())
            code = "".join(ln + "\n" for ln in lines) + body
            try:
                mod = cst.parse_module(code)
            except Exception:
                continue
            bound, free = set(), []
            for st in mod.body:
                for n in walk(st):
                    if isinstance(n, (cst.Assign, cst.AugAssign)) and n.value is not None:
                        for x in _loads(n.value):
                            if x not in bound and x not in free:
                                free.append(x)
                        bound |= _targets(n)
                    elif isinstance(n, cst.For):
                        for x in _loads(n.iter):
                            if x not in bound and x not in free:
                                free.append(x)
                        bound |= set(_loads(n.target))
            comp_t = set()
            for n in walk(mod):
                if isinstance(n, (cst.ListComp, cst.GeneratorExp, cst.SetComp, cst.DictComp)):
                    f = n.for_in
                    while f is not None:
                        comp_t |= set(_loads(f.target))
                        f = f.inner_for_in
            consts = dict(b["consts"])
            inputs = []
            for nm in free:
                if nm in BUILTINS or nm in MODULE_ALIASES or nm in consts or nm in comp_t or nm == "__cap":
                    continue
                ev = self.p.ev(cst.Name(nm), scope) if scope is not None else None
                if isinstance(ev, Known) and isinstance(ev.value, (int, float)) and not isinstance(ev.value, bool):
                    consts[nm] = ev.value
                else:
                    inputs.append(nm)
            if not inputs or len(inputs) > 4:
                continue
            out.append({**b, "code": code, "inputs": inputs, "consts": consts,
                        "scope": "group" if loop_over is not None else b["scope"],
                        "cap_last": b["cap_last"] and loop_over is None})
        return out

    def _comprehension_target(self, call, arg):
        """The iterable when *arg* is the target of the comprehension or for-loop around *call*."""
        if call is None or not isinstance(arg, cst.Name):
            return None
        for anc in self.p.ancestors(call):
            if isinstance(anc, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
                if arg.value in _loads(anc.for_in.target):
                    return anc.for_in.iter
            if isinstance(anc, cst.FunctionDef):
                break
        return None

    def _is_baseline(self, node, info) -> bool:
        """A mean / sum (or a value built from one, through the names it is assigned from)."""
        if BASELINE_RE.search(_code(node)):
            return True
        for nm in _loads(node):
            for e in self.p.assignments_of(nm, info):
                if e is not None and BASELINE_RE.search(_code(e)):
                    return True
            # a parameter: what the callers pass (and how they computed it); a closure name: the
            # enclosing function's assignment
            exprs = []
            if nm in info.params:
                idx = info.params[nm][0]
                for call, caller, offset in self.p.calls_by_callee().get(info.qual, [])[:4]:
                    arg = self.p._arg_for(call, idx, nm, offset)
                    if arg is not None and arg != "star":
                        exprs.append(arg)
                        for x in _loads(arg):
                            exprs += [e for e in self.p.assignments_of(x, caller) if e is not None] if caller else []
            elif info.parent is not None and not self.p.assignments_of(nm, info):
                exprs += [e for e in self.p.assignments_of(nm, info.parent) if e is not None]
            if any(BASELINE_RE.search(_code(e)) for e in exprs):
                return True
        return False

    def _probe_block(self, site, info) -> Optional[dict]:
        """The pure statements *site* needs (in source order, loops and ifs kept around them), its
        inputs and the module constants it reads; None when something impure is needed."""
        body = info.node.body
        order = {id(n): i for i, n in enumerate(walk(body))}
        assigns = [n for n in walk(body) if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign))
                   and n.value is not None and order[id(n)] <= order[id(site)]]
        keep = {id(site)}
        needed = set(_loads(site.value)) | ({_code(site.target.value)} if isinstance(site, cst.Assign) is False
                                            and isinstance(getattr(site, "target", None), cst.Subscript) else set())
        if isinstance(site, cst.Assign):
            for t in site.targets:
                if isinstance(t.target, cst.Subscript):
                    needed |= set(_loads(t.target.value))
        for anc in self.p.ancestors(site):
            if anc is info.node:
                break
            if isinstance(anc, cst.If):
                needed |= set(_loads(anc.test))
        # a for loop around the kept statements stays only when they read its variable (or accumulate
        # across its iterations); a loop that only repeats them (epochs, batches of a DataLoader whose
        # items the kept code never reads) is dropped, so its iterable is no input
        live: set = set()
        changed = True
        while changed:
            changed = self._close_keep(assigns, keep, needed, site, info)
            for f in self._loops_around(keep, info):
                if id(f) not in live and self._loop_needed(f, keep):
                    live.add(id(f))
                    needed |= set(_loads(f.iter))
                    changed = True
        self._probe_live = live
        return self._probe_inputs(body, keep, needed, site, info, live)

    def _loops_around(self, keep, info) -> list:
        out = {}
        for n in walk(info.node.body):
            if id(n) in keep:
                for anc in self.p.ancestors(n):
                    if anc is info.node:
                        break
                    if isinstance(anc, cst.For):
                        out[id(anc)] = anc
        return list(out.values())

    @staticmethod
    def _loop_needed(loop, keep) -> bool:
        kept = [n for n in walk(loop.body) if id(n) in keep]
        targets = set(_loads(loop.target))
        for n in kept:
            reads = set(_loads(n.value)) if getattr(n, "value", None) is not None else set()
            if isinstance(n, cst.Assign):
                for t in n.targets:
                    if isinstance(t.target, cst.Subscript):
                        reads |= set(_loads(t.target))
            if reads & targets or isinstance(n, cst.AugAssign) or reads & _targets(n):
                return True
        return False

    def _close_keep(self, assigns, keep, needed, site, info) -> bool:
        """Add to *keep* the pure assignments *needed* names come from (in place); whether any was added."""
        grew = False
        changed = True
        while changed:
            changed = False
            for a in reversed(assigns):
                if id(a) in keep:
                    continue
                tg = _targets(a)
                if not (tg & needed):
                    continue
                if not _pure(a.value):
                    continue
                if self._mutated_after(a, site, info, tg & needed):
                    continue
                if any(self.p.ancestors(a)) and not self._same_branch(a, site, info):
                    continue
                keep.add(id(a))
                needed |= set(_loads(a.value))
                changed = grew = True
        return grew

    def _probe_inputs(self, body, keep, needed, site, info, live) -> Optional[dict]:
        # inputs: names a kept statement reads before any kept statement (or loop) binds them
        bound, free = set(), set()
        comp_targets = set()
        for n in walk(body):
            if isinstance(n, (cst.ListComp, cst.GeneratorExp, cst.SetComp, cst.DictComp)):
                comp_targets |= set(_loads(n.for_in.target))
        for n in walk(body):
            if isinstance(n, cst.For) and id(n) in live and any(id(x) in keep for x in walk(n.body)):
                free |= set(_loads(n.iter)) - bound
                bound |= set(_loads(n.target))
            elif isinstance(n, cst.If) and any(id(x) in keep for x in walk(n.body)):
                free |= set(_loads(n.test)) - bound
            elif id(n) in keep:
                reads = set(_loads(n.value)) - comp_targets
                if isinstance(n, cst.AugAssign):
                    reads |= set(_loads(n.target))
                elif isinstance(n, cst.Assign):
                    for t in n.targets:
                        if isinstance(t.target, cst.Subscript):
                            reads |= set(_loads(t.target))
                free |= reads - bound
                bound |= _targets(n)
        needed = free
        bound = set()
        consts = {}
        inputs = []
        for nm in sorted(needed - bound - BUILTINS - MODULE_ALIASES):
            ev = self.p.ev_param(info, nm) if nm in info.params else self.p.ev(cst.Name(nm), info)
            # a small number (an eps, a constant) is a constant; a size could be the group size: an input
            if isinstance(ev, Known) and isinstance(ev.value, float) and abs(ev.value) < 0.01:
                consts[nm] = ev.value
            elif nm not in info.params and isinstance(ev, Known) and isinstance(ev.value, (int, float)) and \
                    not isinstance(ev.value, bool):
                consts[nm] = ev.value
            else:
                inputs.append(nm)
        # a whole-number constant may be the group size (GROUP = 5 in ``r.view(-1, GROUP)``): the probe's
        # synthetic batch has its own group size, so such a constant is tried in the roles an input takes
        sizes = [nm for nm, v in consts.items() if isinstance(v, int) and 2 <= v <= 4096]
        if inputs and len(inputs) + len(sizes) <= 4:
            for nm in sizes:
                del consts[nm]
                inputs.append(nm)
        if len(inputs) > 4 or not inputs:
            return None
        code = self._render(body, keep, site, info)
        if code is None:
            return None
        flags = sorted(self._probe_flags & set(inputs))
        # an input computed inside a loop around the site (one prompt's rewards per iteration) is a group
        # (the training loop itself and a loop that generates and trains in each iteration, e.g. over a
        # DataLoader's batches, hold whole batches: only a loop inside them is per prompt)
        batch_loops = set()
        if getattr(self, "main_loop", None) is not None:
            batch_loops = {id(x) for x in self.rollout_data_loops()} | \
                {id(x) for x in self.p.ancestors(self.main_loop) if isinstance(x, cst.For)}
        loops = [anc for anc in self.p.ancestors(site) if isinstance(anc, cst.For) and id(anc) not in batch_loops]
        scope = "batch"
        for a in walk(body):
            if isinstance(a, (cst.Assign, cst.AugAssign, cst.AnnAssign)) and _targets(a) & set(inputs) and \
                    any(any(x is a for x in walk(l.body)) for l in loops):
                scope = "group"
        cap_last = isinstance(site, cst.Assign) and isinstance(site.targets[0].target, cst.Subscript) or \
            _collect_site(site)
        return {"code": code, "inputs": inputs, "consts": consts, "scope": scope, "cap_last": cap_last, "flags": flags,
                "torch": True}

    @staticmethod
    def _mutated_after(a, site, info, names) -> bool:
        """Whether a statement between *a* and *site* appends to / updates one of *names* in place
        (``xs = []`` then ``xs.append(reward_fn(...))``): then that value is an input, not ``[]``."""
        started = False
        for n in walk(info.node.body):
            if n is a:
                started = True
                continue
            if n is site:
                return False
            if started and isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and \
                    n.func.attr.value in ("append", "extend", "insert", "update", "add", "__setitem__") and \
                    _code(n.func.value) in names:
                return True
        return False

    def _same_branch(self, a, site, info) -> bool:
        return True

    def _render(self, body, keep, site, info) -> Optional[str]:
        """Render; ``self._probe_flags`` collects run-time flags whose branches both stay.
Source of the kept statements with their enclosing for/if/else headers; the site's value is
        captured into ``__cap`` right after it runs. ``if`` tests the evaluator resolves keep one branch."""
        lines: list = []
        self._probe_flags = set()

        def emit(stmts, depth):
            any_kept = False
            for st in stmts:
                if isinstance(st, cst.SimpleStatementLine):
                    for small in st.body:
                        if id(small) in keep:
                            lines.append("    " * depth + _stmt_code(small))
                            if small is site:
                                tgt = _capture_target(site)
                                if tgt is None:
                                    return None
                                lines.append("    " * depth + f"__cap.append({tgt})")
                            any_kept = True
                elif isinstance(st, cst.For) and id(st) not in getattr(self, "_probe_live", {id(st)}):
                    if any(id(x) in keep for x in walk(st.body)):  # a loop that only repeats: its body once
                        r = emit(st.body.body, depth)
                        if r is None:
                            return None
                        any_kept = any_kept or r
                elif isinstance(st, cst.For):
                    if any(id(x) in keep for x in walk(st.body)):
                        lines.append("    " * depth + f"for {_code(st.target)} in {_code(st.iter)}:")
                        if emit(st.body.body, depth + 1) is None:
                            return None
                        any_kept = True
                elif isinstance(st, cst.If):
                    if any(id(x) in keep for x in walk(st)):
                        ev = self.p.ev(st.test, info)
                        if isinstance(ev, Known):
                            branch = st.body.body if ev.value else (
                                st.orelse.body.body if isinstance(st.orelse, cst.Else) else [])
                            if emit(branch, depth) is None:
                                return None
                        elif isinstance(st.test, cst.Name) and (st.orelse is None or isinstance(st.orelse, cst.Else)):
                            # a flag known only at run time: both branches run, the flag is an input tried
                            # both ways; a setting that depends on it is not reported as certain
                            lines.append("    " * depth + f"if {st.test.value}:")
                            n0 = len(lines)
                            if emit(st.body.body, depth + 1) is None:
                                return None
                            if len(lines) == n0:
                                lines.append("    " * (depth + 1) + "pass")
                            if isinstance(st.orelse, cst.Else):
                                lines.append("    " * depth + "else:")
                                n0 = len(lines)
                                if emit(st.orelse.body.body, depth + 1) is None:
                                    return None
                                if len(lines) == n0:
                                    lines.append("    " * (depth + 1) + "pass")
                            self._probe_flags.add(st.test.value)
                        else:
                            return None
                        any_kept = True
                elif isinstance(st, (cst.With,)):
                    if emit(st.body.body, depth) is None:
                        return None
                elif any(id(x) in keep for x in walk(st)):
                    return None
            return any_kept

        if emit(body.body, 0) is None:
            return None
        return "\n".join(lines) + "\n" if lines else None


def _stmt_code(small) -> str:
    """Source of a kept statement; ``x: T = v`` runs as ``x = v`` (the annotation may name anything)."""
    if isinstance(small, cst.AnnAssign) and small.value is not None:
        return f"{_code(small.target)} = {_code(small.value)}"
    return _code(small)


def _collect_site(n) -> bool:
    """``xs.extend(v)`` / ``xs.append(v)`` as a statement: a block may fill a list group by group."""
    return isinstance(n, cst.Expr) and isinstance(n.value, cst.Call) and isinstance(n.value.func, cst.Attribute) \
        and n.value.func.attr.value in ("extend", "append") and isinstance(n.value.func.value, cst.Name) \
        and len(n.value.args) == 1 and n.value.args[0].keyword is None


def _capture_target(site) -> Optional[str]:
    if _collect_site(site):
        return site.value.func.value.value  # the list, captured whole after its last fill
    if isinstance(site, cst.AnnAssign) and isinstance(site.target, cst.Name):
        return site.target.value
    if isinstance(site, cst.Assign):
        t = site.targets[0].target
        if isinstance(t, cst.Name):
            return t.value
        if isinstance(t, cst.Subscript):
            return _code(t.value)
    return None


def _targets(a) -> set:
    if isinstance(a, (cst.AugAssign, cst.AnnAssign)):
        return set(_loads(a.target))
    if _collect_site(a):
        return set()  # it fills a list that is already bound
    out = set()
    for t in a.targets:
        tg = t.target
        if isinstance(tg, cst.Name):
            out.add(tg.value)
        elif isinstance(tg, (cst.Tuple, cst.List)):
            for e in tg.elements:
                if isinstance(e.value, cst.Name):
                    out.add(e.value.value)
        elif isinstance(tg, cst.Subscript):
            out.add(_code(tg.value))
    return out


def _loads(node) -> list:
    """Base names read by *node* (attribute chains count by their first name)."""
    out = []
    for n in walk(node):
        if isinstance(n, cst.Name):
            out.append(n.value)
    attrs = {id(n.attr) for n in walk(node) if isinstance(n, cst.Attribute)}
    kw = {id(a.keyword) for n in walk(node) if isinstance(n, cst.Call) for a in n.args if a.keyword is not None}
    return [x.value for x in walk(node) if isinstance(x, cst.Name) and id(x) not in attrs and id(x) not in kw]


def _pure(value) -> bool:
    for n in walk(value):
        if isinstance(n, cst.Call):
            last = _last(n.func) or ""
            if last not in PURE_CALLS:
                return False
        if isinstance(n, (cst.Lambda, cst.Await, cst.Yield)):
            return False
    return True


def run_blocks(blocks: list, timeout: float = 60.0) -> Optional[list]:
    """Run the extracted blocks in a sandboxed subprocess; the list of matches per block, or None."""
    spec = {"blocks": blocks, "torch": any(b["torch"] for b in blocks)}
    return run_sandboxed(RUNNER, spec, timeout)


def run_sandboxed(runner: str, spec: dict, timeout: float = 60.0):
    """Run *runner* (a script reading *spec* as JSON on stdin and printing JSON last) in the sandbox:
    isolated interpreter, temporary cwd, CPU/file-size/memory limits, writes, os calls and sockets
    disabled; its JSON answer, or None."""
    runner = SANDBOX_PRELUDE + runner
    if os.environ.get("VERL_BRIDGE_PROBE_DUMP"):
        with open(os.environ["VERL_BRIDGE_PROBE_DUMP"], "w") as fh:
            json.dump(spec, fh)

    def limits():
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), not the process
        resource.setrlimit(resource.RLIMIT_CPU, (int(timeout), int(timeout)))
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # no file can be written
        try:
            resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        except (ValueError, OSError):
            pass
        os.setsid()

    with tempfile.TemporaryDirectory(prefix="verl_bridge_probe_") as tmp:
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
               "CUDA_VISIBLE_DEVICES": ""}
        try:
            p = subprocess.run([sys.executable, "-I", "-c", runner], input=json.dumps(spec), capture_output=True,
                               text=True, cwd=tmp, env=env, timeout=timeout, preexec_fn=limits)
        except (subprocess.TimeoutExpired, OSError):
            return None
    if p.returncode != 0:
        if os.environ.get("VERL_BRIDGE_PROBE_DEBUG"):
            print("probe failed:", p.returncode, p.stderr[-2000:], file=sys.stderr)
        return None
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
