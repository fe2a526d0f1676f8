"""A hand-written PPO loop over megatron-core (GRPO-style advantages), as teams write them.

Toy task without a tokenizer: a prompt is a row of digits (token id = digit), the ground truth is
the prompt's last digit, and the reward is the fraction of response digits equal to it.

Runs on CPU in a few seconds:  python examples/handwritten_ppo/train_ppo.py
`verl-bridge migrate` turns it into migrated/train_ppo.py + migrated/train_ppo.yaml.
"""

import os

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig

from verl_bridge.compat import make_cpu_safe
from verl_bridge.models.spec import get_portable_gpt_layer_spec

# ---- hyperparameters -------------------------------------------------------------------
VOCAB_SIZE = 32
PROMPT_LEN = 6
MAX_NEW_TOKENS = 4
PROMPTS_PER_STEP = 4
GROUP_SIZE = 4
TOTAL_STEPS = 3
PPO_EPOCHS = 2
MINI_BATCH_SIZE = 8
LEARNING_RATE = 1e-4
CLIP_EPS = 0.2
KL_COEF = 0.05
TEMPERATURE = 1.0
TP_SIZE = 1
PP_SIZE = 1


def initialize_megatron():
    """Our own init: a world of one on CPU (torchrun sets the env vars on a cluster)."""
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("gloo", rank=int(os.environ.get("RANK", "0")),
                                world_size=int(os.environ.get("WORLD_SIZE", "1")))
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP_SIZE,
                                                 pipeline_model_parallel_size=PP_SIZE)


def model_provider(pre_process=True, post_process=True):
    config = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, use_cpu_initialization=True,
        bias_dropout_fusion=False, masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False, apply_rope_fusion=False, hidden_dropout=0.0, attention_dropout=0.0,
    )
    model = GPTModel(
        config=config, transformer_layer_spec=get_portable_gpt_layer_spec(), vocab_size=VOCAB_SIZE,
        max_sequence_length=64, pre_process=pre_process, post_process=post_process,
        position_embedding_type="rope",
    )
    return make_cpu_safe(model)


def load_checkpoint(model, optimizer=None, opt_param_scheduler=None, load_dir=None):
    """Load a state dict saved by torch.save if one exists; returns the iteration."""
    path = os.path.join(load_dir, "model.pt") if load_dir else None
    if path and os.path.exists(path):
        model.load_state_dict(torch.load(path, map_location="cpu"))
    return 0


def reward_fn(response_text, ground_truth):
    """Fraction of response characters equal to the ground-truth digit."""
    if not response_text:
        return 0.0
    return sum(ch == ground_truth for ch in response_text) / len(response_text)


def sample_prompts(num_prompts, generator):
    return torch.randint(0, 10, (num_prompts, PROMPT_LEN), generator=generator)


def forward_logits(model, tokens):
    positions = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    return model(input_ids=tokens, position_ids=positions, attention_mask=None)


@torch.no_grad()
def generate(model, prompts, max_new_tokens, temperature=1.0):
    tokens = prompts
    for _ in range(max_new_tokens):
        logits = forward_logits(model, tokens)[:, -1, :10].float()
        probs = torch.softmax(logits / temperature, dim=-1)
        tokens = torch.cat([tokens, torch.multinomial(probs, 1)], dim=1)
    return tokens


def response_logprobs(model, tokens, prompt_len):
    logits = forward_logits(model, tokens)[:, prompt_len - 1:-1, :10].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, tokens[:, prompt_len:].unsqueeze(-1)).squeeze(-1)


def main():
    initialize_megatron()
    torch.manual_seed(1234)
    generator = torch.Generator().manual_seed(0)
    actor = model_provider()
    reference = model_provider()
    reference.load_state_dict(actor.state_dict())
    load_checkpoint(actor)
    load_checkpoint(reference, None, None)
    reference.eval()
    optimizer = torch.optim.AdamW(actor.parameters(), lr=LEARNING_RATE, weight_decay=0.0)

    for step in range(TOTAL_STEPS):
        prompts = sample_prompts(PROMPTS_PER_STEP, generator).repeat_interleave(GROUP_SIZE, dim=0)
        actor.eval()
        sequences = generate(actor, prompts, max_new_tokens=MAX_NEW_TOKENS, temperature=TEMPERATURE)
        texts = ["".join(str(t) for t in row.tolist()) for row in sequences[:, PROMPT_LEN:]]
        truths = [str(row[-1].item()) for row in prompts]
        rewards = torch.tensor([reward_fn(t, g) for t, g in zip(texts, truths)])

        # group-normalised advantages (GRPO)
        grouped = rewards.view(-1, GROUP_SIZE)
        advantages = (grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + 1e-6)
        advantages = advantages.view(-1, 1)

        with torch.no_grad():
            old_logprobs = response_logprobs(actor, sequences, PROMPT_LEN)
            ref_logprobs = response_logprobs(reference, sequences, PROMPT_LEN)

        actor.train()
        for epoch in range(PPO_EPOCHS):
            perm = torch.randperm(sequences.shape[0])
            for start in range(0, sequences.shape[0], MINI_BATCH_SIZE):
                idx = perm[start:start + MINI_BATCH_SIZE]
                logprobs = response_logprobs(actor, sequences[idx], PROMPT_LEN)
                ratio = torch.exp(logprobs - old_logprobs[idx])
                surr1 = ratio * advantages[idx]
                surr2 = torch.clamp(ratio, 1 - CLIP_EPS, 1 + CLIP_EPS) * advantages[idx]
                log_ratio = ref_logprobs[idx] - logprobs
                kl = torch.exp(log_ratio) - log_ratio - 1
                loss = -torch.min(surr1, surr2).mean() + KL_COEF * kl.mean()
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(actor.parameters(), 1.0)
                optimizer.step()
        print(f"step {step}: reward={rewards.mean().item():.3f} loss={loss.item():.4f} kl={kl.mean().item():.4f}")


if __name__ == "__main__":
    main()
