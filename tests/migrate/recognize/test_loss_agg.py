"""algorithm.loss_agg_mode named by running the statements that reduce the masked loss (loss_agg.py)."""

from __future__ import annotations

from .helpers import recognizer

HEAD = """
import torch

def model_provider(pre_process=True, post_process=True):
    return build()

def reward_fn(response_text, ground_truth):
    return 1.0

def centred(r):
    g = r.view(-1, 4)
    return ((g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True) + 1e-6)).view(-1)
"""

# the divisor is the batch's token count, computed away from the reduction; an entropy metric is
# reduced the same way under no_grad (it never reaches backward)
GLOBAL_COUNT = HEAD + """
def update(model, opt, seqs, adv, n_resp_tokens):
    logp = lp(model, seqs)
    keep_mask = valid(seqs)
    with torch.no_grad():
        ent = (entropy_of(model, seqs) * keep_mask).sum(dim=-1).mean()
    weighted = logp * adv[:, None] * keep_mask
    total = weighted.sum() / n_resp_tokens
    objective_value = -total
    objective_value.backward()
    opt.step()
    opt.zero_grad()
    return ent

def main():
    model = model_provider()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for it in range(30):
        seqs = model.generate(prompts(), max_new_tokens=64)
        adv = centred(torch.tensor([reward_fn(t, a) for t, a in pairs(seqs)]))
        n_resp_tokens = sum(len(s.response_ids) for s in seqs)
        update(model, opt, seqs, adv, n_resp_tokens)

if __name__ == "__main__":
    main()
"""

# per-sequence sums leave a helper inside a tuple; the loop averages them over sequences
SEQ_SUMS = HEAD + """
def sample_and_score(model, batch):
    seqs = model.generate(batch, max_new_tokens=48)
    tok_lp = lp(model, seqs)
    answer_mask = valid(seqs)
    per_seq = (tok_lp * answer_mask).sum(-1)
    per_seq = per_seq.reshape(-1)
    return seqs, per_seq

def main():
    model = model_provider()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-6)
    for it in range(12):
        opt.zero_grad()
        seqs, seq_lp = sample_and_score(model, prompts())
        adv = centred(torch.tensor([reward_fn(t, a) for t, a in pairs(seqs)])).to(seq_lp.device)
        loss = -(seq_lp * adv).mean()
        loss.backward()
        opt.step()

if __name__ == "__main__":
    main()
"""

# a helper averages each row over its own tokens, in the branch the flag's default takes; the
# result is divided by the accumulation count before backward
ROW_MEAN = HEAD + """
PER_ROW = True

def avg_tokens(v, msk, axis=None):
    if axis is None:
        return (v * msk).sum() / msk.sum()
    return (v * msk).sum(axis) / msk.sum(axis)

def step_loss(model, seqs, adv, accum):
    token_obj = -lp(model, seqs) * adv[:, None]
    resp_mask = valid(seqs)
    if PER_ROW:
        token_obj = avg_tokens(token_obj, resp_mask, axis=-1).mean()
    else:
        token_obj = avg_tokens(token_obj, resp_mask)
    token_obj = token_obj / accum
    token_obj.backward()

def main():
    model = model_provider()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for it in range(8):
        seqs = model.generate(prompts(), max_new_tokens=32)
        adv = centred(torch.tensor([reward_fn(t, a) for t, a in pairs(seqs)]))
        step_loss(model, seqs, adv, 1)
        opt.step()
        opt.zero_grad()

if __name__ == "__main__":
    main()
"""


def test_a_token_count_divisor_is_token_mean():
    r = recognizer(GLOBAL_COUNT)
    assert r.a.config.get("algorithm.loss_agg_mode") == "token-mean", (r.a.config, r.a.warnings, r.a.reasons)
    assert any("ragged synthetic batch" in w for w in r.a.warnings)


def test_per_sequence_sums_returned_by_a_helper_are_seq_mean_token_sum():
    r = recognizer(SEQ_SUMS)
    assert r.a.config.get("algorithm.loss_agg_mode") == "seq-mean-token-sum", (r.a.config, r.a.warnings)


def test_a_row_mean_helper_in_the_default_branch_is_seq_mean_token_mean():
    r = recognizer(ROW_MEAN)
    assert r.a.config.get("algorithm.loss_agg_mode") == "seq-mean-token-mean", (r.a.config, r.a.warnings)
    # the other branch of the same flag: a token mean over the whole batch
    r2 = recognizer(ROW_MEAN.replace("PER_ROW = True", "PER_ROW = False"))
    assert r2.a.config.get("algorithm.loss_agg_mode") == "token-mean", (r2.a.config, r2.a.warnings)


def test_a_flag_known_only_at_run_time_leaves_the_mode_out():
    src = ROW_MEAN.replace("PER_ROW = True\n", "").replace("if PER_ROW:", "if seqs.per_row:")
    r = recognizer(src)
    assert "algorithm.loss_agg_mode" not in r.a.config


# the loss helper also returns a dict of logged numbers built from values computed elsewhere
# (stats["spread"].item(), a kl term's .sum()): those side computations run on stand-in values and
# do not stop the reduction from being identified (token mean over the batch, its count passed in)
WITH_LOGGED_STATS = HEAD + """
def step_loss(model, seqs, adv, tok_total, stats):
    logp = lp(model, seqs)
    resp_mask = valid(seqs)
    drift = kl_to_ref(model, seqs) * resp_mask
    term = -(logp * adv[:, None]) * resp_mask
    loss = (term + 0.01 * drift).sum() / tok_total
    logged = {"drift": drift.sum().item() / tok_total.item(), "spread": stats["spread"].item(),
              "term": term.sum().item()}
    return loss, logged

def main():
    model = model_provider()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for it in range(30):
        seqs = model.generate(prompts(), max_new_tokens=64)
        adv = centred(torch.tensor([reward_fn(t, a) for t, a in pairs(seqs)]))
        tok_total = valid(seqs).sum()
        loss, info = step_loss(model, seqs, adv, tok_total, summary(seqs))
        loss.backward()
        opt.step()
        opt.zero_grad()

if __name__ == "__main__":
    main()
"""


def test_logged_side_values_do_not_hide_the_reduction():
    r = recognizer(WITH_LOGGED_STATS)
    assert r.a.config.get("algorithm.loss_agg_mode") == "token-mean", (r.a.config, r.a.warnings, r.a.reasons)
