"""What the report adds beyond the config: canonical keys left at a default, and hyperparameters
found in the source that no canonical key takes (so nothing silently changes the algorithm)."""

from __future__ import annotations

import dataclasses

import libcst as cst

from .._static import Known, Record, _is_dataclass

# The canonical keys of the config contract (docs: DESIGN.md, "Config contract").
CANONICAL_KEYS = (
    "algorithm.name", "algorithm.gamma", "algorithm.lam", "algorithm.clip_ratio", "algorithm.value_clip",
    "algorithm.vf_coef", "algorithm.entropy_coef", "algorithm.kl.coef", "algorithm.kl.estimator",
    "algorithm.kl.placement", "algorithm.kl.target", "algorithm.kl.horizon", "algorithm.ppo_epochs",
    "algorithm.mini_batch_size", "algorithm.micro_batch_size", "algorithm.group_size",
    "algorithm.whiten_advantages", "optim.actor.lr", "optim.critic.lr", "optim.actor.clip_grad",
    "optim.actor.weight_decay", "data.rollout_batch_size", "data.max_response_length", "rollout.engine",
    "rollout.temperature", "rollout.top_p", "trainer.total_steps", "trainer.save_every",
    "trainer.args.tp_size", "trainer.args.pp_size", "trainer.output_dir",
)
MODEL_SOURCES = ("model.actor.args.model_provider", "model.actor.args.model_name_or_path", "model.actor.args.preset")


def schema_default(key: str):
    """verl-bridge's own default for a dotted key (from the config dataclasses; no torch)."""
    from verl_bridge.config.schema import Config

    cur = Config()
    for part in key.split("."):
        cur = getattr(cur, part)
    if dataclasses.is_dataclass(cur):
        return None
    return cur


class ReportMixin:
    def finish_report(self) -> None:
        a = self.a
        self._micro_without_batch()
        # framework defaults (TRL's PPOConfig, ...) are in the config but not from the source
        for key, source in getattr(self, "framework_defaults", {}).items():
            if key in a.config:
                a.defaults_used[key] = {"value": a.config[key], "from": source}
        for key in CANONICAL_KEYS:
            if key in a.config:
                continue
            if key in ("algorithm.clip_ratio",) and "algorithm.clip_ratio_low" in a.config:
                continue
            a.defaults_used[key] = {"value": schema_default(key), "from": "verl-bridge default"}
        if not any(k in a.config for k in MODEL_SOURCES):
            for key in MODEL_SOURCES:
                a.defaults_used[key] = {"value": None, "from": "verl-bridge default"}
        a.unmapped = self.unmapped_hyperparameters()
        a.unmapped += [u for k, u in getattr(self, "runtime_left", {}).items() if k not in a.config]
        self.drop_role_conflicts()  # values.py: never a certain value that an unused flag of that role contradicts
        if self.cli_values_used():
            a.warn("values read from command-line parser defaults (argparse / HfArgumentParser / dataclass "
                   "fields) are the values the script runs with when no flag is given; flags passed at launch "
                   "override them, so check the YAML against your launch command")

    def _micro_without_batch(self) -> None:
        """A proven micro-batch with no proven batch to divide (the batch is the per-rank size times the
        world size): the verl-bridge default batch would not hold it, so it goes to unmapped, named."""
        a = self.a
        micro = a.config.get("algorithm.micro_batch_size")
        if not isinstance(micro, int) or "data.rollout_batch_size" in a.config or \
                "algorithm.mini_batch_size" in a.config and a.config["algorithm.mini_batch_size"] is not None:
            return
        group = a.config.get("algorithm.group_size", schema_default("algorithm.group_size"))
        rollout = schema_default("data.rollout_batch_size")
        if isinstance(group, int) and isinstance(rollout, int) and (rollout * group) % micro == 0:
            return
        prov = a.provenance.pop("algorithm.micro_batch_size", "?")
        del a.config["algorithm.micro_batch_size"]
        self.__dict__.setdefault("runtime_left", {})["algorithm.micro_batch_size"] = \
            f"algorithm.micro_batch_size={micro} ({prov}): per rank, of a batch whose size is known only at launch"
        a.warn(f"algorithm.micro_batch_size={micro} ({prov}) is left out: the batch it divides is not a static value "
               "(data.rollout_batch_size is left at the default, which it does not divide); set both for your launch")

    def cli_values_used(self) -> bool:
        p = self.p
        rec = p.args_record()
        lines = set()
        for name in rec.fields:
            ev = p.record_field(rec, name, 0)
            if isinstance(ev, Known):
                lines.add(self.loc(ev.line))
        for cname, cdef in p.classes.items():
            if _is_dataclass(p, cdef):
                drec = p.dataclass_record(cdef, None, None)
                for name in drec.fields:
                    ev = p.record_field(drec, name, 0)
                    if isinstance(ev, Known):
                        lines.add(self.loc(ev.line))
        return bool(lines & set(self.a.provenance.values())) or bool(p.unpacks and any(
            "PPOConfig default" in v for v in self.a.provenance.values()))

    # ------------------------------------------------------------------ unmapped
    def unmapped_hyperparameters(self) -> list:
        """``name=value (file:line)`` for every numeric/bool setting in the source that no key took."""
        used = set(self.a.provenance.values())
        out, seen = [], set()

        def add(name, ev, allow_str=False):
            if not isinstance(ev, Known) or isinstance(ev.value, Record):
                return
            v = ev.value
            if not isinstance(v, (int, float, bool)) and not (isinstance(v, str) and allow_str):
                return
            where = self.loc(ev.line)
            if where in used or (name, where) in seen:
                return
            seen.add((name, where))
            out.append(f"{name}={v!r} ({where})")

        p = self.p
        rec = p.args_record()
        for name in rec.fields:
            add(f"--{name.replace('_', '-')}", p.record_field(rec, name, 0))
        for cname, cdef in p.classes.items():
            if _is_dataclass(p, cdef):
                drec = p.dataclass_record(cdef, None, None)
                for name in drec.fields:
                    add(f"{cname}.{name}", p.record_field(drec, name, 0))
        for name, exprs in p.module_assigns.items():
            if len(exprs) == 1 and isinstance(exprs[0], (cst.Integer, cst.Float, cst.Name, cst.UnaryOperation)):
                add(name, p.ev(exprs[0], None))
        # locals of the functions that run the loop: constants and dict-literal configs
        funcs = [f for f in (self.a.entry, getattr(self, "loop_func", None)) if f is not None]
        for info in {id(f): f for f in funcs}.values():
            for name, exprs in info.assigns.items():
                if len(exprs) != 1 or exprs[0] is None:
                    continue
                e = exprs[0]
                if isinstance(e, (cst.Integer, cst.Float, cst.UnaryOperation)):
                    add(name, p.ev(e, info))
                elif isinstance(e, cst.Dict):
                    r = p.ev_record(e, info)
                    if r is not None:
                        for k in r.fields:
                            add(f"{name}[{k!r}]", p.record_field(r, k, 0))
        for rname, rec2 in getattr(self, "framework_records", []):
            for name in rec2.fields:
                add(f"{rname}.{name}", p.record_field(rec2, name, 0), allow_str=True)
        return out
