"""Framework adapters: TRL's PPOTrainer loop, framework entry points that own the loop."""

from __future__ import annotations

import re
import sys
from typing import Optional

import libcst as cst

from .._static import FuncInfo, Known, Record, Runtime, dotted, walk
from .base import (ENTROPY_RE, GEN_RE, LOSS_RE, OLD_NAME_RE, OPTIMIZERS, REF_NAME_RE, REWARD_RE, SCHEDULER_RE,
                   VALUE_LOSS_RE, _MISSING, _call_arg, _code, _factors, _find_modulo, _is_one, _kwarg, _last,
                   _names_in)


GYM_MODULES = {"gym", "gymnasium", "envpool", "ale_py", "procgen", "dm_control", "pettingzoo", "stable_baselines3"}

# qualified name of a function that runs a whole RL training loop -> how to name it
FRAMEWORK_ENTRIES = {
    "trlx.train": "trlx.train() (trlx owns the PPO loop)",
    "trlx.trlx.train": "trlx.train() (trlx owns the PPO loop)",
    "megatron.training.pretrain": "Megatron-LM's pretrain() (megatron.training)",
    "megatron.training.training.pretrain": "Megatron-LM's pretrain() (megatron.training)",
    "megatron.training.pretrain_gpt": "Megatron-LM's pretrain()",
    "megatron.pretrain": "Megatron-LM's pretrain()",
    "megatron.training.training.pretrain_gpt": "Megatron-LM's pretrain()",
}
# libraries whose functions take callbacks but never own an RL loop
NOT_FRAMEWORKS = set(sys.stdlib_module_names) | {
    "torch", "transformers", "datasets", "numpy", "accelerate", "tqdm", "peft", "tokenizers", "deepspeed"}
# top-level package -> framework whose trainer object owns the loop
FRAMEWORK_OWNERS = {
    "openrlhf": "OpenRLHF (Ray trainer)", "nemo_aligner": "NeMo-Aligner", "verl": "verl (Ray trainer)",
    "trl": "TRL", "trlx": "trlx", "ray": "Ray", "deepspeed": "DeepSpeed", "realhf": "ReaLHF",
    "stable_baselines3": "Stable-Baselines3", "ray.rllib": "RLlib", "nemo": "NeMo",
}


class FrameworksMixin:
    def is_trl_trainer(self, recv, call) -> bool:
        if recv is None:
            return False
        exprs = []
        scope = self.p.func_of(call)
        if isinstance(recv, cst.Name):
            exprs = self.p.assignments_of(recv.value, scope)
        elif isinstance(recv, cst.Attribute) and isinstance(recv.value, cst.Name) and recv.value.value == "self":
            cls = self.p.class_of(scope)
            exprs = [e for e, _ in self.p.self_assignments(cls, recv.attr.value)] if cls else []
        for e in exprs:
            if isinstance(e, cst.Call):
                qs = self.qn(e.func)
                if any(q.startswith("trl") and q.endswith("PPOTrainer") for q in qs):
                    return True
        return False

    def refuse_non_llm(self) -> bool:
        """A gym / Atari PPO trains on environment observations, not on language-model generations."""
        for local, qual in self.p.imports.items():
            root = qual.lstrip(".").split(".")[0]
            if root in GYM_MODULES:
                line = self.p.import_lines.get(local, 0)
                self.a.refuse(f"{self.loc(line)}: not an LLM loop: the script imports {qual} and trains a policy "
                              "on environment observations (gym/Atari PPO); verl-bridge migrates PPO/GRPO loops "
                              "that generate text with a language model")
                return True
        return False

    def framework_entry(self, call: cst.Call, scope) -> Optional[str]:
        """The name of a framework entry point that owns the training loop, or None.

        Decided by qualified names and by what the call receives, never by the spelling of a function
        name: ``trlx.train``, Megatron-LM's ``pretrain``, ``.fit()``/``.train()`` of a trainer object
        built from an imported (non-local) class, or an imported function handed this file's hooks.
        """
        qs = self.qn(call.func)
        for q in qs:
            for known, label in FRAMEWORK_ENTRIES.items():
                if q == known:
                    return label
        if self.p.resolve_callee(call, scope) is not None:
            return None
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("fit", "train", "learn", "run"):
            cls = self._imported_class_of(call.func.value, scope)
            if cls is not None:
                root = cls.lstrip(".").split(".")[0]
                owner = FRAMEWORK_OWNERS.get(root)
                if owner is not None or cls.rsplit(".", 1)[-1].endswith("Trainer"):
                    what = f"{owner}: " if owner else ""
                    return f"{what}{cls}.{call.func.attr.value}()"
        # an imported function handed the file's own hooks (model_provider, reward_fn, ...)
        if any(q in self.p.imports.values() or "." in q for q in qs) and self._imported(call.func) and \
                self.p._resolve_qual(call.func).split(".")[0] not in NOT_FRAMEWORKS:
            local_funcs = {s.name.value for s in self.p.module.body if isinstance(s, cst.FunctionDef)}
            passed = [a.value.value for a in call.args if isinstance(a.value, cst.Name) and a.value.value in local_funcs]
            if passed:
                q = self.p._resolve_qual(call.func)
                return f"{q}() (it receives this file's {', '.join(passed)})"
        return None

    def _imported(self, func) -> bool:
        base = func
        while isinstance(base, cst.Attribute):
            base = base.value
        if not (isinstance(base, cst.Name) and base.value in self.p.imports):
            return False
        qual = self.p.imports[base.value].lstrip(".")
        return not any(qual == m or qual.startswith(m + ".") for m in self.p.local_modules)

    def _imported_class_of(self, recv, scope) -> Optional[str]:
        exprs = []
        if isinstance(recv, cst.Call):
            exprs = [recv]
        elif isinstance(recv, cst.Name):
            exprs = [e for e in self.p.assignments_of(recv.value, scope) if e is not None]
        elif isinstance(recv, cst.Attribute) and isinstance(recv.value, cst.Name) and recv.value.value == "self":
            cls = self.p.class_of(scope)
            exprs = [e for e, _ in self.p.self_assignments(cls, recv.attr.value)] if cls else []
        for e in exprs:
            if isinstance(e, cst.Call) and self._imported(e.func):
                return self.p._resolve_qual(e.func)
            if isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value == "remote":
                inner = e.func.value
                if isinstance(inner, (cst.Name, cst.Attribute)) and self._imported(inner):
                    return self.p._resolve_qual(inner)
        return None

    def refuse_no_loop(self) -> Analysis:
        a = self.a
        found = []
        for call, scope in self.calls:
            label = self.framework_entry(call, scope)
            if label is not None:
                found.append((label, call))
        for label, call in found:
            a.refuse(f"{self.loc(self.p.line(call))}: no training loop of its own: training runs inside the "
                     f"framework entry point {label}; the script only provides hooks. Point a verl-bridge config "
                     "at them instead (model.actor.args.model_provider, model.reward.args.path; "
                     "`verl-bridge init` writes one)")
        if found:
            return a
        why = self._async_generation()
        if why:
            return a.refuse(why)
        text = self.p.module.code
        if re.search(r"\bppo\b|\bgrpo\b|rlhf|PPO|GRPO", text):
            return a.refuse(f"{self.fname()}: not an RL training loop: the file mentions PPO/GRPO but no loop "
                            "generates responses and then updates the policy from them (a loop that calls "
                            "model.generate(...) and loss.backward())")
        return a.refuse(f"{self.fname()}: no PPO/GRPO training loop found (no loop both generates responses and "
                        "updates a model)")

    def _async_generation(self) -> Optional[str]:
        """Generation in another process or thread: a function that generates is the ``target`` of
        ``multiprocessing.Process`` / ``threading.Thread`` (or handed to a pool), while a loop of this
        script updates a model from batches that arrive from a queue or a server. The sampling policy
        lags the trained one (asynchronous, off-policy), which MegatronTrainer's rollout does not do."""
        update_loop = None
        for loop in self.loops:
            if "backward" in self.reach(loop):
                update_loop = loop
                break
        if update_loop is None:
            return None
        for call, scope in self.calls:
            qs = self.qn(call.func)
            if not any(q.endswith(("multiprocessing.Process", "threading.Thread", "torch.multiprocessing.Process",
                                   "multiprocessing.spawn", "torch.multiprocessing.spawn")) or
                       q.endswith(".Process") and "multiprocessing" in q for q in qs):
                continue
            target = _kwarg(call, "target") if _last(call.func) != "spawn" else (call.args[0].value if call.args else None)
            if not isinstance(target, cst.Name):
                continue
            info = self.p.funcs_by_qual.get(target.value)
            if info is None or "gen" not in self.reach(info.node):
                continue
            return (f"{self.loc(self.p.line(call))}: responses are generated in another process "
                    f"({target.value}() started by {_last(call.func)}(...)) while the loop at "
                    f"{self.loc(self.p.line(update_loop))} trains on batches that arrive from it: asynchronous, "
                    "off-policy generation with a lagging copy of the policy; MegatronTrainer generates with the "
                    "current policy inside each step, so this pipeline cannot be migrated as it is")
        return None

    # ------------------------------------------------------------------ TRL
    def extract_trl(self) -> None:
        """TRL's legacy ``PPOTrainer.step`` loop (trl <= 0.11): every value comes from its PPOConfig,
        and a field the script does not set takes that version's default (TRL_LEGACY_PPO_DEFAULTS)."""
        a = self.a
        cfg, trainer_call = None, None
        for call, scope in self.calls:
            qs = self.qn(call.func)
            if any(q.startswith("trl") and q.endswith("PPOTrainer") for q in qs):
                trainer_call = call
                arg = _kwarg(call, "config")
                if arg is None and call.args and call.args[0].keyword is None:
                    arg = call.args[0].value
                if arg is not None:
                    cfg = self.p.ev_record(arg, scope)
                    if cfg is None:
                        a.refuse(f"{self.loc(self.p.line(call))}: the PPOConfig passed to PPOTrainer is not static "
                                 "(built at run time); build it with PPOConfig(key=value, ...) in the script")
                        return
        if cfg is None:
            line = self.p.line(trainer_call) if trainer_call is not None else self.p.line(self.main_loop)
            a.refuse(f"{self.loc(line)}: cannot find the PPOConfig given to TRL's PPOTrainer; pass "
                     "config=PPOConfig(...) built in this file")
            return
        newer = sorted(k for k in cfg.fields if k in TRL_NEW_API_FIELDS)
        if newer:
            a.refuse(f"{self.loc(cfg.line)}: PPOConfig sets {', '.join(newer)}, fields of trl >= 0.12 whose "
                     "PPOTrainer owns the loop (trainer.train()); only the legacy ppo_trainer.step() loop "
                     "(trl <= 0.11) is migrated")
            return
        self.framework_records.append(("PPOConfig", cfg))
        src = TRL_LEGACY_SOURCE
        self.p.derived_fields[cfg.kind] = _trl_derived

        def val(k):
            if k in cfg.fields:
                return self.p.record_field(cfg, k, cfg.line), False
            return TRL_LEGACY_PPO_DEFAULTS[k], True

        def put(key, k, transform=None):
            v, default = val(k)
            if default:
                self.emit_default(key, transform(v) if transform else v, f"{src}: {k}={v!r}")
            elif isinstance(v, Known) and transform is not None:
                self.emit(key, Known(transform(v.value), v.line), k)
            else:
                self.emit(key, v, k)

        self.emit("algorithm.name", Known("ppo", cfg.line))
        put("algorithm.clip_ratio", "cliprange")
        put("algorithm.value_clip", "cliprange_value")
        put("algorithm.vf_coef", "vf_coef")
        put("algorithm.ppo_epochs", "ppo_epochs")
        put("algorithm.gamma", "gamma")
        put("algorithm.lam", "lam")
        # TRL's batch_size and mini_batch_size count samples PER PROCESS (accelerate): the global rollout
        # batch is batch_size * the number of processes, known only at launch. Never a global value here.
        bs, bs_default = val("batch_size")
        mini, mini_default = val("mini_batch_size")
        gas, gas_default = val("gradient_accumulation_steps")
        mini_v = mini if mini_default else (mini.value if isinstance(mini, Known) else None)
        gas_v = gas if gas_default else (gas.value if isinstance(gas, Known) else None)
        bs_v = bs if bs_default else (bs.value if isinstance(bs, Known) else None)
        a.warn(f"{self.loc(cfg.line)}: TRL's PPOConfig batch_size={bs_v!r}, mini_batch_size={mini_v!r} and "
               f"gradient_accumulation_steps={gas_v!r} count samples per process; the global rollout batch "
               "(batch_size x processes) and mini-batch (mini_batch_size x gradient_accumulation_steps x processes) "
               "depend on the launch, so data.rollout_batch_size, algorithm.mini_batch_size and "
               "algorithm.micro_batch_size (which must divide them) are left out: set them for the number of "
               "processes you train with")
        if trainer_call is not None and _kwarg(trainer_call, "optimizer") is not None and \
                not self.none_by_default(_kwarg(trainer_call, "optimizer"), self.p.func_of(trainer_call)):
            pass  # the optimizer handed to PPOTrainer carries the learning rate (extract_optimizers)
        else:
            put("optim.actor.lr", "learning_rate")
        mg, mg_default = val("max_grad_norm")
        if mg_default or (isinstance(mg, Known) and mg.value is None):
            line = mg.line if isinstance(mg, Known) else None
            if line is None:
                self.emit_default("optim.actor.clip_grad", 0.0, f"{src}: max_grad_norm=None (no clipping; 0 = off)")
            else:
                self.emit("optim.actor.clip_grad", Known(0.0, line), "max_grad_norm")
        else:
            self.emit("optim.actor.clip_grad", mg, "max_grad_norm")
        put("algorithm.kl.coef", "init_kl_coef")
        self.emit_default("algorithm.kl.placement", "reward", f"{src}: PPOTrainer.compute_rewards subtracts the KL "
                          "penalty from the rewards")
        kp, kp_default = val("kl_penalty")
        kp_v = kp if kp_default else (kp.value if isinstance(kp, Known) else None)
        est = {"kl": "k1", "mse": "k2"}.get(kp_v)
        if est is None:
            a.refuse(f"{self.loc(kp.line if isinstance(kp, Known) else cfg.line)}: PPOConfig kl_penalty={kp_v!r} "
                     "has no MegatronTrainer estimator (k1 = 'kl', k2 = 'mse'); use kl_penalty='kl' or 'mse'")
        elif kp_default:
            self.emit_default("algorithm.kl.estimator", est, f"{src}: kl_penalty='kl' (logp - ref_logp)")
        else:
            self.emit("algorithm.kl.estimator", Known(est, kp.line), "kl_penalty")
        adap, adap_default = val("adap_kl_ctrl")
        adap_v = adap if adap_default else (adap.value if isinstance(adap, Known) else None)
        if adap_v is True:
            put("algorithm.kl.target", "target")
            put("algorithm.kl.horizon", "horizon")
        elif adap_v is None:
            a.refuse(f"{self.loc(cfg.line)}: PPOConfig adap_kl_ctrl is not static, so whether the KL coefficient "
                     "adapts (kl.target) is unknown; set adap_kl_ctrl=True or False in the script")
        self.emit_default("algorithm.whiten_advantages", True, f"{src}: PPOTrainer.compute_advantages whitens "
                          "the advantages")
        es, es_default = val("early_stopping")
        if (es is True) or (isinstance(es, Known) and es.value is True):
            tk, _ = val("target_kl")
            tk_v = tk.value if isinstance(tk, Known) else tk
            a.warn(f"{self.loc(cfg.line)}: early_stopping with target_kl={tk_v!r} stops the PPO epochs early; "
                   "MegatronTrainer has no early stopping (target_kl is not the adaptive-KL target)")
        for k in ("use_score_scaling", "use_score_norm", "whiten_rewards"):
            v, d = val(k)
            if not d and isinstance(v, Known) and v.value:
                a.warn(f"{self.loc(v.line)}: PPOConfig {k}=True is not supported by MegatronTrainer; rewards are "
                       "used as returned")
        sc, sc_default = val("score_clip")
        if not sc_default and isinstance(sc, Known) and sc.value is not None:
            a.warn(f"{self.loc(sc.line)}: PPOConfig score_clip={sc.value!r} (reward clipping) is not supported "
                   "by MegatronTrainer; rewards will not be clipped")
        if "model_name" in cfg.fields:
            v = self.p.record_field(cfg, "model_name", cfg.line)
            if isinstance(v, Known) and isinstance(v.value, str):
                self.a.config.setdefault("_model_name", (v.value, v.line))
        for call, scope in self.calls:
            last = _last(call.func)
            if last == "generate" or (last or "").endswith("generate"):
                self.rollout_kwargs(call, scope)
            elif last == "step" and "trl_step" in self.call_tags(call):
                # ppo_trainer.step(queries, responses, scores): the scores come from the reward function
                scores = _call_arg(call, 2, "scores")
                if isinstance(scores, cst.Name):
                    self.reward_exprs = [(e, scope) for e in self.p.assignments_of(scores.value, scope)
                                         if e is not None]
        loop = self.main_loop
        inner = any(isinstance(n, (cst.For, cst.While)) and "trl_step" in self.reach(n)
                    for n in walk(loop.body) if n is not loop)
        cap = None if inner else self.step_cap(loop, self.loop_func)
        if cap is not None:
            self.emit("trainer.total_steps", cap, "the step limit")
            self.a.warn(f"{self.loc(self.p.line(loop))}: the loop stops after trainer.total_steps={cap.value} steps "
                        "(`break`), or earlier when the data runs out")
        elif inner or not (isinstance(loop, cst.For) and isinstance(loop.iter, cst.Call) and _last(loop.iter.func) == "range"):
            a.warn(f"{self.loc(self.p.line(loop))}: trainer.total_steps is left out: the number of steps depends "
                   "on the size of the dataset")
        else:
            self.emit("trainer.total_steps", self.loop_count(loop, self.loop_func), "the number of training steps")


def _trl_derived(prog, rec: Record, name: str, line: int):
    """Fields the legacy PPOConfig computes in ``__post_init__`` (trl/trainer/ppo_config.py):
    ``total_ppo_epochs = int(np.ceil(steps / batch_size))``, ``backward_batch_size``."""
    import math

    def get(k):
        if k in rec.fields:
            v = prog.record_field(rec, k, line)
            return v.value if isinstance(v, Known) else v
        return TRL_LEGACY_PPO_DEFAULTS[k]

    if name == "total_ppo_epochs":
        steps, bs = get("steps"), get("batch_size")
        if isinstance(steps, int) and isinstance(bs, int) and bs > 0:
            return Known(int(math.ceil(steps / bs)), line)
        return steps if isinstance(steps, Runtime) else (bs if isinstance(bs, Runtime) else None)
    return None


# huggingface/trl, trl/trainer/ppo_config.py at commit 008c2a6a (the legacy PPOConfig dataclass that
# trl <= 0.11 ships with PPOTrainer.step): the defaults below were read from that file.
TRL_LEGACY_SOURCE = "trl<=0.11 PPOConfig default"
TRL_LEGACY_PPO_DEFAULTS = {
    "steps": 20000, "learning_rate": 1e-5, "adap_kl_ctrl": True, "init_kl_coef": 0.2, "kl_penalty": "kl",
    "target": 6, "horizon": 10000, "gamma": 1, "lam": 0.95, "cliprange": 0.2, "cliprange_value": 0.2,
    "vf_coef": 0.1, "batch_size": 256, "mini_batch_size": 1, "gradient_accumulation_steps": 1, "ppo_epochs": 4,
    "max_grad_norm": None, "early_stopping": False, "target_kl": 1, "ratio_threshold": 10.0,
    "use_score_scaling": False, "use_score_norm": False, "score_clip": None, "whiten_rewards": False,
}
# fields that only the trl >= 0.12 PPOConfig (a TrainingArguments subclass) has
TRL_NEW_API_FIELDS = {"num_ppo_epochs", "kl_coef", "num_mini_batches", "total_episodes", "response_length",
                      "per_device_train_batch_size", "local_rollout_forward_batch_size", "missing_eos_penalty"}
