"""``MegatronBridge``: the user's Megatron hooks -> actor, reference and critic roles.

A few lines wrap an existing script::

    from verl_bridge import MegatronBridge, MegatronTrainer
    bridge = MegatronBridge(model_provider=model_provider,          # their function, unchanged
                            initialize_megatron=initialize_megatron,  # optional
                            load_checkpoint=load_checkpoint)          # optional
    MegatronTrainer(bridge.load_config("ppo.yaml"), bridge=bridge).train()

(``bridge.load_config`` names the functions in the config and clears a template's ``preset``: with a
``model_provider`` the bridge is the model; ``MegatronTrainer(load_config(path), bridge=bridge)``
does the same. ``config=`` takes a loaded one.)

Hooks may also be ``"module:function"`` strings in the config
(``model.actor.args.model_provider`` / ``initialize_megatron`` / ``load_checkpoint``).

Order of operations (``initialize`` then ``build_roles``):

1. ``initialize_megatron``: if the user's function sets up megatron's ``parallel_state``, its
   process groups are reused and TP/PP are read from them (and compared with the config, every
   difference reported); otherwise verl-bridge initialises from ``trainer.args``.
2. ``model_provider``: called through :func:`verl_bridge.common.hooks.call_model_provider`,
   whatever its signature. A provider that reads Megatron-LM's ``get_args()`` works: the user's
   initialiser set those globals, or (no initialiser) :mod:`verl_bridge.bridge.megatron_args`
   is filled from the config. The model is then cast as Megatron-LM's ``get_model()`` does for
   ``bf16`` / ``fp16`` (``Float16Module``: :mod:`verl_bridge.common.precision`).
3. ``load_checkpoint``: the user's loader with whichever signature it has; without one,
   ``model.actor.args.load_path`` is read with verl-bridge's own Megatron checkpoint reader.
4. roles: actor (trainable + optimizer), reference (frozen twin with the actor's initial weights),
   critic (the provider's model with a scalar value head, or a Hugging Face critic:
   :mod:`verl_bridge.runtime.hf_critic`).
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import torch

from verl_bridge.common.hooks import call_load_checkpoint, call_model_provider, provider_accepts
from verl_bridge.config import Config
from verl_bridge.data.files import local_dir


class BridgeError(RuntimeError):
    pass


def _resolve(hook, source_dir, what):
    if hook is None or callable(hook):
        return hook
    from verl_bridge.rewards.loading import resolve_callable

    return resolve_callable(hook, source_dir, what=what)


def _presets_of(source, overrides) -> dict[str, str]:
    """``{"model.actor.args.preset": ..., "model.critic.args.preset": ...}`` as *source* (+ *overrides*)
    sets them (a megatron critic only: it is built by the actor's provider), without validating."""
    import copy

    from verl_bridge.config.loader import apply_overrides, read_yaml, to_plain

    if isinstance(source, Config):
        data = to_plain(source)
    elif isinstance(source, dict):
        data = source
    elif source is None:
        data = {}
    else:
        data = read_yaml(os.fspath(source))
    data = apply_overrides(copy.deepcopy(data or {}), list(overrides or []))
    out = {}
    for role in ("actor", "critic"):
        node = (data.get("model") or {}).get(role) if isinstance(data.get("model"), dict) else None
        if not isinstance(node, dict) or (role == "critic" and node.get("type", "megatron") != "megatron"):
            continue
        preset = (node.get("args") or {}).get("preset") if isinstance(node.get("args"), dict) else None
        if preset:
            out[f"model.{role}.args.preset"] = preset
    return out


def _hook_name(hook) -> str:
    if isinstance(hook, str):
        return hook
    return f"{getattr(hook, '__module__', '?')}:{getattr(hook, '__qualname__', repr(hook))}"


def _info_rank0(msg: str) -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return
    from verl_bridge.runtime.metrics import info

    info(msg)


class MegatronBridge:
    def __init__(self, model_provider: Callable | str | None = None, initialize_megatron: Callable | str | None = None,
                 load_checkpoint: Callable | str | None = None, *, config: Optional[Config] = None,
                 model_builder: Optional[Callable] = None, tokenizer=None):
        self.config = config
        self._provider = model_provider
        self._init = initialize_megatron
        self._loader = load_checkpoint
        self.model_builder = model_builder
        self.tokenizer = tokenizer  # the user's tokenizer; None: verl_bridge.data.tokenizer loads one
        self.layout = None
        self.reused_groups = False

    @property
    def supplies_model(self) -> bool:
        """True when this bridge has a ``model_provider``: it, not the config, says what the model is."""
        return self._provider is not None

    def load_config(self, source, overrides: Optional[list[str]] = None, **kwargs) -> Config:
        """Load and validate *source* (a YAML path, dict or Config) for this bridge, and keep it as
        ``self.config``.

        When this bridge has a ``model_provider``, the bridge is the model: ``model.actor.args.preset``
        (every template sets ``preset: tiny``) and a megatron critic's preset (the critic is the
        provider's model with a value head) are cleared with one info line, and a config that names no
        model source is fine. Hooks that are module-level
        functions of an importable module are named in the config (``model.actor.args.model_provider:
        "module:function"``, ...), so a run directory's ``config.yaml`` records where the model came
        from; closures and functions of the ``__main__`` script are used as given, unnamed.
        """
        from verl_bridge.config import load_config

        named = []
        for key, hook in (("model_provider", self._provider), ("initialize_megatron", self._init),
                          ("load_checkpoint", self._loader)):
            name = _hook_name(hook) if hook is not None else None
            if name is not None and ("<" in name or name.startswith("__main__:") or name.startswith("?:")):
                name = None  # not importable by name: used as given
            if name is not None:
                named.append(f"model.actor.args.{key}={name}")
        clear = []
        if self._provider is not None:
            presets = _presets_of(source, overrides)
            clear = [f"{key}=null" for key in presets]
            if presets:
                _info_rank0(f"{', '.join(f'{k}={v}' for k, v in presets.items())} cleared: the model comes from "
                            f"the bridge's model_provider ({_hook_name(self._provider)})")
        self.config = load_config(source, named + list(overrides or []) + clear, **kwargs)
        return self.config

    def adopt_config(self, config, overrides: Optional[list[str]] = None) -> Config:
        """The config a trainer runs with this bridge (:meth:`load_config`'s rules), unless *config*
        is already the one this bridge loaded."""
        if config is self.config and not overrides and not (self.supplies_model and _presets_of(config, None)):
            return config
        return self.load_config(config, overrides)

    @classmethod
    def from_config(cls, config: Config) -> "MegatronBridge":
        """A bridge from the hooks the config names; a config that names no model is refused here
        (before any process group starts), as ``load_config(..., require_model_source=True)`` would."""
        from verl_bridge.config.loader import ConfigError
        from verl_bridge.config.validate import NO_MODEL_SOURCE

        a = config.model.actor.args
        if not (a.preset or a.model_name_or_path or a.model_provider):
            raise ConfigError([NO_MODEL_SOURCE])
        return cls(a.model_provider, a.initialize_megatron, a.load_checkpoint, config=config)

    # ------------------------------------------------------------------ process groups
    def initialize(self):
        """Set up torch.distributed and megatron's parallel_state; return the ParallelLayout."""
        from megatron.core import parallel_state as mpu

        from verl_bridge.bridge import megatron_args
        from verl_bridge.distributed import current_layout, init_distributed, init_model_parallel

        cfg = self.config
        src = cfg.source_dir
        init_fn = _resolve(self._init, src, "model.actor.args.initialize_megatron")
        ta = cfg.trainer.args
        megatron_args.clear_config_fill()
        if init_fn is not None:
            init_distributed()
            init_fn()
            if mpu.model_parallel_is_initialized():
                self.reused_groups = True
                layout = current_layout(ta.sequence_parallel)
                diffs = []
                if layout.tp_size != ta.tp_size:
                    diffs.append(f"tensor parallel size: your initialize_megatron set {layout.tp_size}, "
                                 f"trainer.args.tp_size is {ta.tp_size}")
                if layout.pp_size != ta.pp_size:
                    diffs.append(f"pipeline parallel size: your initialize_megatron set {layout.pp_size}, "
                                 f"trainer.args.pp_size is {ta.pp_size}")
                if layout.ep_size != ta.ep_size:
                    diffs.append(f"expert parallel size: your initialize_megatron set {layout.ep_size}, "
                                 f"trainer.args.ep_size is {ta.ep_size}")
                if ta.dp_size is not None and layout.dp_size != ta.dp_size:
                    diffs.append(f"data parallel size: your initialize_megatron gives {layout.dp_size}, "
                                 f"trainer.args.dp_size is {ta.dp_size}")
                if diffs:
                    raise BridgeError("the process groups set up by initialize_megatron differ from the config:\n  - "
                                      + "\n  - ".join(diffs)
                                      + "\nMake them agree (or drop the keys from the config to take yours).")
                self.layout = layout
                self._fill_megatron_args()
                return layout
        from verl_bridge.placement.groups import apply_placement

        self.layout = apply_placement(cfg, init_model_parallel(ta.tp_size, ta.pp_size, ta.sequence_parallel,
                                                                    ta.ep_size))
        self._fill_megatron_args()
        return self.layout

    def _fill_megatron_args(self) -> None:
        """Providers reading ``get_args()``: fill verl_bridge.bridge.megatron_args from the config,
        unless the user's initializer already set them (then they are left exactly as set)."""
        from verl_bridge.bridge import megatron_args

        if megatron_args.is_set():
            return
        from verl_bridge.data.tokenizer import TokenizerError, builtin_task, load_tokenizer

        try:
            tok = self.tokenizer or load_tokenizer(self.config, builtin_task(self.config))
            vocab = len(tok) if hasattr(tok, "__len__") else getattr(tok, "vocab_size", None)
        except (TokenizerError, OSError, ValueError):
            vocab = None  # no tokenizer yet: vocab_size / padded_vocab_size stay None (setup reports why)
        megatron_args.set_from_config(megatron_args.args_from_config(self.config, self.layout, vocab_size=vocab))

    # ------------------------------------------------------------------ models
    def vocab_and_length(self) -> tuple[int, int]:
        """(vocab size, max sequence length) of the tiny preset models."""
        cfg = self.config
        return 16, cfg.data.max_prompt_length + cfg.data.max_response_length + 8

    def actor_builder(self, whole_model: bool = False) -> Callable[[], torch.nn.Module]:
        """A zero-argument function that builds this rank's actor model (on the right device);
        ``whole_model``: with pre- and post-processing whatever the pipeline stage (a generation
        replica, built inside :func:`verl_bridge.rollout.replica.pipeline_merged`)."""
        cfg = self.config
        args = cfg.model.actor.args
        provider = _resolve(self._provider, cfg.source_dir, "model.actor.args.model_provider")
        if provider is not None:
            fn = provider
        elif args.preset in ("tiny", "tiny-moe"):
            from verl_bridge.models.tiny import tiny_model_provider

            vocab, length = self.vocab_and_length()
            fn = tiny_model_provider(args, vocab, length, cfg.trainer.precision,
                                     tp_size=self.layout.tp_size, sequence_parallel=cfg.trainer.args.sequence_parallel,
                                     ep_size=self.layout.ep_size,
                                     routing_replay=bool(getattr(cfg.algorithm, "moe_routing_replay", False)))
        elif args.model_name_or_path:
            from verl_bridge.arch import hf_model_provider
            from verl_bridge.models.tiny import precision_kwargs

            sp = bool(cfg.trainer.args.sequence_parallel and self.layout.tp_size > 1)
            fn = hf_model_provider(local_dir(args.model_name_or_path, cfg.source_dir, args.revision),
                                   **precision_kwargs(cfg.trainer.precision), **({"sequence_parallel": True} if sp else {}))
        else:
            raise BridgeError("model.actor.args: no model source (preset, model_name_or_path or model_provider)")
        pre = self.layout.is_first_stage or whole_model
        post = self.layout.is_last_stage or whole_model
        device = self.layout.device

        from verl_bridge.common.precision import PrecisionMismatchError, cast_like_float16_module, resolve_precision
        from verl_bridge.compat import make_cpu_safe
        from verl_bridge.compat.mcore_versions import default_pg_collection

        said = []

        def build() -> torch.nn.Module:
            # megatron-core >= 0.15 providers may take the process groups as a ProcessGroupCollection
            pgs = default_pg_collection() if provider_accepts(fn, "pg_collection") else None
            from verl_bridge.compat.sequence_parallel import sequence_parallel_build

            with sequence_parallel_build(_hook_name(fn)):  # CPU shims; an SP norm refusal named
                model = call_model_provider(fn, pre, post, vp_stage=None, model_builder=self.model_builder,
                                            pg_collection=pgs)
            if isinstance(model, (list, tuple)):
                if len(model) != 1:
                    raise BridgeError(f"model_provider returned {len(model)} chunks; verl-bridge expects one model")
                model = model[0]
            # Megatron-LM's get_model(): Float16Module casts the whole model for --bf16 / --fp16
            try:
                precision, note = resolve_precision(model, cfg.trainer.precision)
            except PrecisionMismatchError as exc:
                raise BridgeError(str(exc)) from None
            if note and not said:
                _info_rank0(note)
                said.append(note)
            model = cast_like_float16_module(model, precision)
            from verl_bridge.compat.sequence_parallel import check_sequence_parallel_norms

            check_sequence_parallel_norms(model, _hook_name(fn))
            model = make_cpu_safe(model.to(device))
            from verl_bridge.models.compile import compile_layers

            n, why = compile_layers(model, cfg.trainer.args.compile_layers, device, self.layout.tp_size)
            if why not in said and (n or cfg.trainer.args.compile_layers is not None):
                _info_rank0(why)
                said.append(why)
            return model

        return build

    def _load_initial_weights(self, model: torch.nn.Module) -> None:
        cfg = self.config
        args = cfg.model.actor.args
        loader = _resolve(self._loader, cfg.source_dir, "model.actor.args.load_checkpoint")
        if loader is not None:
            call_load_checkpoint(loader, [model], None, None, path=args.load_path)
        elif args.load_path:
            from verl_bridge.checkpoint import load_model_weights

            load_model_weights(model, args.load_path)
        # model_name_or_path: verl_bridge.arch.hf_model_provider already loaded this rank's HF shard

    def build_hf_critic(self) -> torch.nn.Module:
        """``model.critic.type: huggingface``: a transformers backbone + value head, replicated on every
        TP/PP rank and run outside megatron's schedules (see :mod:`verl_bridge.runtime.hf_critic`)."""
        from verl_bridge.runtime.hf_critic import build_hf_critic

        cfg = self.config
        path = local_dir(cfg.model.critic.args.model_name_or_path, cfg.source_dir, cfg.model.critic.args.revision)
        try:
            return build_hf_critic(path, cfg.trainer.precision, self.layout.device)
        except (OSError, ValueError) as exc:
            raise BridgeError(f"model.critic.args.model_name_or_path={path!r}: could not load a Hugging Face "
                              f"model from it ({exc})") from None

    def build_roles(self):
        from verl_bridge.runtime.optimizer import build_optimizer
        from verl_bridge.common.roles import frozen_copy, to_critic
        from verl_bridge.common.roles import Roles

        cfg = self.config
        build = self.actor_builder()
        actor = build()
        self._load_initial_weights(actor)
        source = cfg.model.actor.args.model_name_or_path or cfg.model.actor.args.load_path
        if source and self._provider is None:
            world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
            _info_rank0(f"Actor model loaded from {source} (sharded across {world} ranks)")
        actor_opt = build_optimizer(actor, cfg.optim.actor, self.layout)
        a = cfg.algorithm
        reference = None
        if cfg.model.reference is not None or a.kl.coef > 0 or a.kl.target is not None:
            offload = bool(cfg.model.reference and cfg.model.reference.args.offload)
            reference = frozen_copy(build, actor, offload=offload)
        critic = critic_opt = None
        if cfg.model.critic is not None:
            if cfg.model.critic.type == "huggingface":
                critic = self.build_hf_critic()
            else:
                critic = build()
                critic.load_state_dict(actor.state_dict())
                critic = to_critic(critic)
            if getattr(critic, "runs_outside_megatron_schedule", False):
                from verl_bridge.runtime.hf_critic import build_replicated_optimizer

                critic_opt = build_replicated_optimizer(critic, cfg.optim.critic, self.layout)
            else:
                critic_opt = build_optimizer(critic, cfg.optim.critic, self.layout)
        self.roles = Roles(actor=actor, actor_optimizer=actor_opt, reference=reference, critic=critic,
                           critic_optimizer=critic_opt)
        return self.roles
