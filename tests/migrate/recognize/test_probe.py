"""The behaviour probe: extracted blocks run in a sandboxed subprocess and are named by their output."""

from __future__ import annotations

import os

from verl_bridge.codemods.recognize.probe import _classify, run_blocks


def _block(code, inputs, scope="batch", consts=None):
    return {"code": code, "inputs": inputs, "consts": consts or {}, "scope": scope, "cap_last": False,
            "flags": [], "torch": True}


def test_estimators_are_named_by_what_the_block_returns():
    blocks = [
        # per-group Python loop over numpy arrays, population std
        _block("for g in range(0, len(r), k):\n    x = np.asarray(r[g:g + k])\n"
               "    a = (x - x.mean()) / (x.std() + 1e-4)\n    __cap.append(a)\n", ["k", "r"]),
        # torch (B, G) rows, sample std
        _block("t = r.view(-1, k)\na = (t - t.mean(1, keepdim=True)) / t.std(1, keepdim=True)\n__cap.append(a)\n",
               ["k", "r"]),
        # one group's floats, mean baseline only
        _block("m = sum(xs) / len(xs)\nfor x in xs:\n    a = x - m\n    __cap.append(a)\n", ["xs"], scope="group"),
        # leave-one-out
        _block("t = r.view(-1, k)\na = t - (t.sum(1, keepdim=True) - t) / (k - 1)\n__cap.append(a)\n", ["k", "r"]),
    ]
    results = run_blocks(blocks)
    assert results is not None
    named = []
    for found in results:
        hits = [c for f in found for c in [_classify(f["shape"], f["out"])] if c is not None]
        named.append(hits[0][:2] if hits else None)
    assert named == [("grpo", True), ("grpo", True), ("grpo", False), ("rloo", None)]
    # population vs sample std are told apart
    details = [_classify(f["shape"], f["out"]) for f in results[0] + results[1]]
    assert {d[2] for d in details if d} >= {"population std", "sample std"}


def test_the_sandbox_refuses_file_writes_and_network(tmp_path):
    target = tmp_path / "escaped.txt"
    blocks = [
        _block(f"open({str(target)!r}, 'w').write('x' * 10)\na = r - r.mean()\n__cap.append(a)\n", ["r"]),
        _block("import socket\ns = socket.socket()\na = r - r.mean()\n__cap.append(a)\n", ["r"]),
    ]
    results = run_blocks(blocks)
    assert results == [[], []]  # neither block ran to the end
    assert not target.exists() or os.path.getsize(target) == 0


ONE_SEQ_MICRO = """
import torch

def model_provider(pre_process=True, post_process=True):
    return build()

def reward_fn(response_text, ground_truth):
    return 1.0

def avg_over(v, keep):
    return (v * keep).sum() / keep.sum()

def main():
    model = model_provider()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for step in range(20):
        out = model.generate(prompts(), max_new_tokens=32)
        r = torch.tensor([reward_fn(t, a) for t, a in pairs(out)])
        g = r.view(-1, 4)
        adv = ((g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True) + 1e-6)).view(-1)
        old = lp(model, out).detach()
        for start in range(0, 16, 8):
            for one in range(start, start + 8, 1):
                ratio = torch.exp(lp(model, out[one:one + 1]) - old[one:one + 1])
                pg_loss = avg_over(-torch.min(ratio * adv[one], torch.clamp(ratio, 0.8, 1.2) * adv[one]), mask(out, one))
                pg_loss.backward()
            opt.step()
            opt.zero_grad()

if __name__ == "__main__":
    main()
"""


def test_token_mean_helper_over_one_sequence_micro_batches_is_seq_mean_token_mean():
    from .helpers import recognizer

    r = recognizer(ONE_SEQ_MICRO)
    assert r.a.config.get("algorithm.micro_batch_size") == 1, (r.a.config, r.a.warnings)
    assert r.a.config["algorithm.loss_agg_mode"] == "seq-mean-token-mean"
    assert any("avg_over() (t.py:10) ran on a ragged synthetic batch" in w for w in r.a.warnings)
    # the same helper with two sequences per micro-batch proves no canonical mode: left out
    r2 = recognizer(ONE_SEQ_MICRO.replace("range(start, start + 8, 1)", "range(start, start + 8, 2)")
                    .replace("out[one:one + 1]", "out[one:one + 2]").replace("old[one:one + 1]", "old[one:one + 2]"))
    assert "algorithm.loss_agg_mode" not in r2.a.config


def test_unzipped_reward_pairs_and_a_non_sequence_reward_do_not_hang():
    # (reward, info) pairs unzipped per group; iterating a synthetic reward fails fast instead of looping
    blk = _block("scores, extra = zip(*res)\nscores = np.array(scores)\n"
                 "a = (scores - scores.mean()) / (scores.std() + 1e-4)\n__cap.append(a)\n", ["res"],
                 scope="group")
    results = run_blocks([blk], timeout=30)
    assert results is not None
    named = {_classify(f["shape"], f["out"])[:2] for f in results[0] if _classify(f["shape"], f["out"])}
    assert named == {("grpo", True)}
