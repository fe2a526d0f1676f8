"""Typed configuration: the dotted-key contract of DESIGN.md as keyword-only dataclasses.

Every field here is a contract key (``algorithm.kl.coef`` is ``Config.algorithm.kl.coef``).
Fields are keyword-only; nested sections are dataclasses; ``args`` mappings of the seed article
(``trainer.args``, ``model.<role>.args``) are dataclasses too, so unknown keys are caught there
as well. Validation lives in :mod:`verl_bridge.config.validate`, loading in
:mod:`verl_bridge.config.loader`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

ENGINES = ("native", "vllm")
KL_ESTIMATORS = ("k1", "k2", "k3")
KL_PLACEMENTS = ("reward", "loss")
ROLLOUT_CORRECTIONS = ("tis",)
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
ACTOR_TYPES = ("megatron",)
CRITIC_TYPES = ("megatron", "huggingface")
REWARD_TYPES = ("function", "model")
PRESETS = ("tiny", "tiny-moe")
CHECKPOINT_FORMATS = ("legacy", "torch_dist")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "fp16")
DECODE_PATHS = ("auto", "fast", "module")  # rollout.decode (verl_bridge.rollout.native)


@dataclass(kw_only=True)
class TrainerArgs:
    tp_size: int = 1
    pp_size: int = 1
    dp_size: Optional[int] = None  # derived from the world size when omitted
    sequence_parallel: bool = False
    ep_size: int = 1  # expert parallelism (MoE models): experts split over ep_size ranks of each DP x TP slice
    use_distributed_optimizer: bool = True  # used on CUDA; CPU runs use a plain torch optimizer
    # dynamic batching (verl's use_dynamic_bsz): micro-batches of old/ref log-probs, values and the
    # update formed by a token budget, each packed into one row without padding (runtime/batch.py);
    # algorithm.micro_batch_size is then unused
    use_dynamic_bsz: bool = False
    max_tokens_per_micro_batch: Optional[int] = None  # real tokens (prompt + response) per micro-batch
    # torch.compile each megatron TransformerLayer (one shared graph; verl_bridge/models/compile.py):
    # null = auto (CUDA, the portable spec, dense, TP=1), true = any layers (CPU too), false = never
    compile_layers: Optional[bool] = None


@dataclass(kw_only=True)
class TrainerConfig:
    type: str = "megatron"
    args: TrainerArgs = field(default_factory=TrainerArgs)
    total_steps: int = 50
    save_every: int = 0  # 0 = only at the end when output_dir is set
    output_dir: Optional[str] = "runs/quickstart"  # null: no run directory (metrics only in memory)
    seed: int = 1234
    log_every: int = 1
    device: str = "auto"
    precision: str = "fp32"
    checkpoint_format: str = "legacy"
    resume: str = "never"  # auto | never | PATH
    keep_last: int = 2
    nproc_per_node: int = 1
    progress_bar: Optional[bool] = None  # None = on a TTY only
    eval_every: int = 0  # evaluate on held-out prompts every N steps; 0 = off
    eval_before_train: bool = False  # also evaluate before the first step (logged as step 0)
    # where metrics go: console, jsonl (metrics.jsonl), tensorboard, wandb, mlflow (verl_bridge.runtime.trackers)
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    project: str = "verl-bridge"  # wandb project / MLflow experiment
    experiment_name: Optional[str] = None  # the run's name in wandb / MLflow; default: output_dir's last part
    overwrite: bool = False  # a new run may replace another run's checkpoints/metrics in output_dir
    break_stale_lock: bool = False  # take over output_dir/run.lock when no live process holds it
    collective_timeout_s: float = 600.0  # a collective waiting longer on a peer fails, naming it


@dataclass(kw_only=True)
class ModelArgs:
    model_name_or_path: Optional[str] = None  # a local HF directory or a hub id (verl_bridge.data.hub)
    revision: Optional[str] = None  # hub ids: branch, tag or commit (default main)
    preset: Optional[str] = None
    model_provider: Optional[str] = None  # "module:function"
    initialize_megatron: Optional[str] = None  # "module:function"
    load_checkpoint: Optional[str] = None  # "module:function"
    load_path: Optional[str] = None  # a Megatron checkpoint directory to start from
    use_flash_attn: bool = False
    offload: bool = False  # keep a frozen role's weights on CPU between uses
    path: Optional[str] = None  # reward function "module:function"
    timeout_s: Optional[float] = None  # reward function: seconds per call (None: 60, 0: no limit)
    # tiny preset shape (ignored otherwise)
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    num_query_groups: Optional[int] = None
    ffn_hidden_size: Optional[int] = None
    # tiny-moe preset (verl_bridge.models.tiny): experts, top-k, expert / shared-expert sizes, aux-loss coefficient
    num_experts: Optional[int] = None
    moe_router_topk: Optional[int] = None
    moe_ffn_hidden_size: Optional[int] = None
    moe_shared_expert_intermediate_size: Optional[int] = None
    moe_aux_loss_coeff: Optional[float] = None


@dataclass(kw_only=True)
class ModelRole:
    type: str = "megatron"
    args: ModelArgs = field(default_factory=ModelArgs)
    placement: Any = "colocated"  # or {ranks: N, tp_size: T}: own ranks (verl_bridge.placement.spec)


@dataclass(kw_only=True)
class ModelConfig:
    actor: ModelRole = field(default_factory=ModelRole)
    critic: Optional[ModelRole] = None
    reference: Optional[ModelRole] = None  # defaults to the actor's provider and initial weights
    reward: ModelRole = field(default_factory=lambda: ModelRole(type="function"))


@dataclass(kw_only=True)
class DataConfig:
    rollout_batch_size: int = 32  # prompts per step
    num_rollout_workers: Optional[int] = None  # None: derived, N / rollout TP (config/derived.py)
    max_prompt_length: int = 16
    max_response_length: int = 8
    task: Optional[str] = "digits"  # built-in toy task; None when train_files is set
    train_files: Optional[str] = None
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    eval_files: Optional[str] = None  # held-out prompts (JSONL/Parquet); toy tasks use a held-out seed stream
    eval_samples: int = 32  # prompts per evaluation (global, divided across DP ranks)


@dataclass(kw_only=True)
class KLConfig:
    coef: float = 0.0
    estimator: str = "k1"
    placement: str = "reward"
    target: Optional[float] = None  # adaptive controller when set
    horizon: int = 10000


@dataclass(kw_only=True)
class RolloutCorrectionConfig:
    type: str = "tis"
    cap: float = 2.0


@dataclass(kw_only=True)
class AlgorithmConfig:
    name: str = "ppo"
    gamma: float = 1.0
    lam: float = 0.95
    clip_ratio: float = 0.2
    clip_ratio_low: Optional[float] = None
    clip_ratio_high: Optional[float] = None
    dual_clip_c: Optional[float] = None
    value_clip: Optional[float] = 0.2
    vf_coef: float = 0.5
    entropy_coef: float = 0.0
    kl: KLConfig = field(default_factory=KLConfig)
    ppo_epochs: int = 1
    mini_batch_size: Optional[int] = None  # samples per optimizer step (global); None = whole batch
    micro_batch_size: int = 8  # samples per forward/backward (per DP rank)
    group_size: int = 1  # responses per prompt
    whiten_advantages: bool = True
    norm_adv_by_std: bool = True  # grpo only
    loss_agg_mode: str = "token-mean"
    # off (None) by default; {type: tis, cap: 2.0}: truncated importance sampling of each token's
    # policy-gradient loss by min(exp(old log-prob - rollout log-prob), cap) (algorithms/rollout_correction.py)
    rollout_correction: Optional[RolloutCorrectionConfig] = None
    # MoE routing replay (R3): the rollout's expert choices reused in the training forwards
    # (verl_bridge.common.routing_replay); needs megatron-core's RouterReplay
    moe_routing_replay: bool = False


@dataclass(kw_only=True)
class OptimRole:
    lr: float = 1e-5
    clip_grad: float = 1.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0


@dataclass(kw_only=True)
class OptimConfig:
    actor: OptimRole = field(default_factory=OptimRole)
    critic: OptimRole = field(default_factory=lambda: OptimRole(lr=1e-4))


@dataclass(kw_only=True)
class RolloutConfig:
    engine: str = "native"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    tp_size: Optional[int] = None  # vLLM only; defaults to the training TP size
    bucket_mb: int = 256
    verify_sync: bool = True
    verify_threshold: Optional[float] = None  # None: 1e-3 for fp32 weights, 0.1 for bf16/fp16 (rollout/verify.py)
    # vLLM: its gpu_memory_utilization; native engine on CUDA: the share of the device memory free when a
    # batch shape first generates that its KV cache and step buffers may take (larger batches run in passes)
    gpu_memory_utilization: float = 0.5
    eval_temperature: float = 0.0  # 0 = greedy decoding in evaluation
    compile_decode: bool = False  # native engine on CUDA: torch.compile the decode step before graph capture
    decode: str = "auto"  # native engine: auto (fast decoder on CUDA when it can run the model) | fast | module


@dataclass(kw_only=True)
class Config:
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    # where the config came from (not a key): used to resolve relative paths and modules
    source_dir: Optional[str] = field(default=None, metadata={"internal": True})

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


def to_plain(obj: Any) -> Any:
    """Dataclasses -> plain dicts/lists (for YAML dumps and reports)."""
    if dataclasses.is_dataclass(obj):
        return {
            f.name: to_plain(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not f.metadata.get("internal")
        }
    if isinstance(obj, tuple):
        return [to_plain(v) for v in obj]
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj
