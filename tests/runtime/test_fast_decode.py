"""The functional fast decoder computes what megatron's GPTModel forward computes, on its live weights.

CPU runs the eager version of the exact step the CUDA graph captures (the graph itself needs a GPU:
``benchmarks/rollout.py`` runs it on CUDA and checks it against the module path there).
"""

import pytest
import torch

from tests.dist_utils import run_distributed


def _hf_model(arch, tmp):
    from tests.arch.tiny_hf import make_tiny_hf
    from verl_bridge.arch import hf_model_provider

    make_tiny_hf(arch, tmp)
    return hf_model_provider(str(tmp))(True, True)


def _tiny_model():
    from verl_bridge.config.schema import ModelArgs
    from verl_bridge.models.tiny import tiny_model_provider

    return tiny_model_provider(ModelArgs(num_query_groups=2), 16, 64)(True, True)


def _model_and_prompts(seed: int, n: int):
    """The tiny GQA model (TP=1, eval) and ``n`` prompts of 3-11 random tokens."""
    from verl_bridge.distributed import init_model_parallel, seed_everything

    init_model_parallel(1, 1)
    seed_everything(0)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 16, (int(k),), generator=g).tolist() for k in torch.randint(3, 12, (n,), generator=g)]
    return _tiny_model().eval(), prompts


def _check_logits(rank, world_size, archs, tmp):
    from verl_bridge.distributed import init_model_parallel, seed_everything
    from verl_bridge.rollout.fast_decode import FastDecoder, _State
    from verl_bridge.common.batch import model_inputs

    init_model_parallel(1, 1)
    for arch in archs:
        seed_everything(0)
        model = _tiny_model() if arch == "tiny" else _hf_model(arch, tmp / arch)
        model.eval()
        vocab = 16 if arch == "tiny" else 100
        dec = FastDecoder(model)
        g = torch.Generator().manual_seed(1)
        B, P, R = 3, 7, 5
        seq = torch.randint(2, vocab, (B, P + R), generator=g)
        mask = torch.ones(B, P + R, dtype=torch.long)
        mask[0, :3] = 0  # left padding in two rows
        mask[2, :1] = 0
        seq[mask == 0] = 0
        with torch.no_grad():
            ids, pos, m = model_inputs(seq, mask)
            ref = model(ids, pos, m).float()  # [B, S, V] module forward, no cache
            ref = ref[..., : getattr(model, 'hf_vocab_size', ref.shape[-1])]  # the decoder drops vocab padding
            st = _State(dec, B, P, R, torch.device("cpu"), torch.float32)
            valid = mask[:, :P].bool()
            attend = (torch.ones(P, P, dtype=torch.bool).tril()[None] & valid[:, None, :]) | torch.eye(P, dtype=torch.bool)[None]
            got = dec.forward_prefill(seq[:, :P], attend, pos[:, :P], st.cache_k, st.cache_v)
            real = mask[:, :P].bool()
            torch.testing.assert_close(got[real], ref[:, :P][real], atol=2e-5, rtol=1e-4, msg=f"{arch} prefill")
            # generation's prefill: the last position's logits only, the same values
            last = dec.forward_prefill(seq[:, :P], attend, pos[:, :P], st.cache_k, st.cache_v, last_only=True)
            assert last.shape == (B, 1, got.shape[-1])
            torch.testing.assert_close(last[:, 0], got[:, -1], atol=1e-6, rtol=1e-5, msg=f"{arch} last-only prefill")
            st.key_valid[:, :P] = valid
            for t in range(R):  # teacher-forced decode through the static cache
                idx = torch.tensor(P + t)
                st.key_valid[:, P + t] = True
                step = dec.forward_decode(seq[:, P + t], pos[:, P + t], idx, st.key_valid, st.cache_k, st.cache_v)
                torch.testing.assert_close(step, ref[:, P + t], atol=2e-5, rtol=1e-4, msg=f"{arch} decode step {t}")


def test_fast_decoder_matches_module_forward(tmp_path):
    """Prefill and every decode step equal GPTModel.forward logits: Llama (GQA, untied), Qwen2 (QKV bias,
    tied), OPT (learned positions, LayerNorm, biases, ReLU) and the tiny preset."""
    run_distributed(_check_logits, 1, ["tiny", "llama", "qwen2", "opt"], tmp_path)


def _greedy_same_as_native(rank, world_size):
    from verl_bridge.distributed import init_model_parallel, seed_everything
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.fast_decode import FastEngine
    from verl_bridge.rollout.native import NativeEngine

    init_model_parallel(1, 1)
    seed_everything(0)
    model = _tiny_model()
    prompts = [[1, 5, 6, 7], [1, 9], [1, 3, 3, 3, 3, 3, 2, 4, 5]]
    sp = SamplingParams(max_new_tokens=6, temperature=0.0, eos_token_id=None, pad_token_id=0)
    a = NativeEngine(model, torch.device("cpu")).generate(prompts, sp, seed=0)
    b = FastEngine(model, torch.device("cpu"), pad_to=16).generate(prompts, sp, seed=0)
    assert b.prompt_ids.shape[1] == 16  # rounded up so steps of different widths share one graph
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask)

    # sampling: seeded runs repeat; EOS stops a row and masks what follows
    sp = SamplingParams(max_new_tokens=12, temperature=1.0, eos_token_id=3, pad_token_id=0)
    eng = FastEngine(model, torch.device("cpu"))
    x = eng.generate(prompts, sp, seed=7)
    y = eng.generate(prompts, sp, seed=7)
    assert torch.equal(x.response_ids, y.response_ids)
    for row, m in zip(x.response_ids, x.response_mask):
        hits = (row == 3).nonzero()
        if len(hits):
            first = int(hits[0])
            assert m[: first + 1].all() and not m[first + 1:].any()
            assert (row[first + 1:] == 0).all()

    # weights are read in place: an update to the model changes the next generation
    before = eng.generate(prompts, SamplingParams(max_new_tokens=3, temperature=0.0, pad_token_id=0), seed=0)
    with torch.no_grad():
        model.output_layer.weight.mul_(-1.0)  # an in-place "optimizer step": greedy picks change
    sp = SamplingParams(max_new_tokens=3, temperature=0.0, eos_token_id=None, pad_token_id=0)
    z = eng.generate(prompts, sp, seed=0)
    ref = NativeEngine(model, torch.device("cpu")).generate(prompts, sp, seed=0)
    assert not torch.equal(z.response_ids, before.response_ids)
    assert torch.equal(z.response_ids, ref.response_ids)


def test_fast_engine_greedy_equals_native_engine():
    run_distributed(_greedy_same_as_native, 1)


def test_unsupported_models_are_named():
    from verl_bridge.rollout.fast_decode import unsupported_reason

    assert "GPTModel" in unsupported_reason(torch.nn.Linear(2, 2))


def _padding_rows_never_sampled(rank, world_size, tmp):
    from verl_bridge.distributed import init_model_parallel, seed_everything
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.fast_decode import FastEngine
    from verl_bridge.rollout.native import NativeEngine

    init_model_parallel(1, 1)
    seed_everything(0)
    model = _hf_model("llama", tmp)  # HF vocab 100, megatron pads to 128
    assert model.hf_vocab_size == 100 and model.output_layer.weight.shape[0] == 128
    with torch.no_grad():
        model.output_layer.weight[100:] = 50.0  # padding rows would win every draw if sampled
    sp = SamplingParams(max_new_tokens=5, temperature=1.0, eos_token_id=None, pad_token_id=0)
    for engine in (NativeEngine(model, torch.device("cpu")), FastEngine(model, torch.device("cpu"))):
        out = engine.generate([[1, 5, 6], [1, 9]], sp, seed=0)
        assert int(out.response_ids.max()) < 100, type(engine).__name__


def test_vocabulary_padding_is_never_sampled(tmp_path):
    run_distributed(_padding_rows_never_sampled, 1, tmp_path)


def _sync_check_goes_through_fast_decoder(rank, world_size, tmp):
    from verl_bridge.distributed import init_model_parallel, seed_everything
    from verl_bridge.rollout.native import NativeEngine
    from verl_bridge.rollout.verify import SyncVerificationError, verify_native_engine

    init_model_parallel(1, 1)
    seed_everything(0)
    model = _hf_model("qwen2", tmp)  # GQA, QKV bias, tied embeddings, vocab padded 100 -> 128
    engine = NativeEngine(model, torch.device("cpu"), fast=True)
    report = verify_native_engine(model, threshold=1e-4, engine=engine)
    assert report.ok and report.tokens > 0 and report.max_abs_diff < 1e-4, report
    # a decoder that disagrees with the trainer (wrong softmax scale) is caught: the check scores the
    # probe through the path that generates, not through megatron's module forward
    engine.fast.decoder.scale *= 2.0
    with pytest.raises(SyncVerificationError):
        verify_native_engine(model, threshold=1e-4, engine=engine)
    # the module path is still what an engine without the fast decoder is checked on
    assert verify_native_engine(model, threshold=1e-4, engine=NativeEngine(model, torch.device("cpu"))).ok


def test_sync_check_scores_the_fast_decoder(tmp_path):
    run_distributed(_sync_check_goes_through_fast_decoder, 1, tmp_path)


def test_attended_lengths_cover_every_step():
    """Each decode step attends over a bucket at least as long as the slots it needs; the last is the
    whole cache; few buckets (graphs / compile specialisations) per shape."""
    from verl_bridge.rollout.fast_decode import attended_lengths

    for P, L in [(16, 32), (128, 384), (128, 1152), (7, 7 + 150), (64, 64 + 1024), (1, 2)]:
        lengths = attended_lengths(P, L)
        assert lengths == sorted(set(lengths)) and lengths[-1] == L and len(lengths) <= 4
        for need in range(P + 1, L + 1):  # decode step i needs slots [0, P + i]
            assert any(n >= need for n in lengths)
    assert len(attended_lengths(128, 1152)) == 4  # a long generation really is split


def _long_generation_bucketed(rank, world_size):
    from verl_bridge.distributed import init_model_parallel, seed_everything
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.fast_decode import FastEngine, attended_lengths
    from verl_bridge.rollout.native import NativeEngine

    init_model_parallel(1, 1)
    seed_everything(0)
    model = _tiny_model()
    model.eval()
    prompts = [[1, 5, 6, 7], [1, 9], [1, 3, 3, 3, 3, 3, 2, 4, 5]]
    R = 140  # prompt width 16 + 140 new tokens: the steps run over two attended lengths (128, 156)
    assert attended_lengths(16, 16 + R) == [128, 156]
    sp = SamplingParams(max_new_tokens=R, temperature=0.0, eos_token_id=None, pad_token_id=0)
    a = NativeEngine(model, torch.device("cpu"), decode="module").generate(prompts, sp, seed=0)
    b = FastEngine(model, torch.device("cpu"), pad_to=16).generate(prompts, sp, seed=0)
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.log_probs, b.log_probs, atol=1e-4, rtol=1e-4)


def test_fast_engine_bucketed_lengths_equal_module_path():
    """A generation long enough to cross attended-length buckets samples what the module path does."""
    run_distributed(_long_generation_bucketed, 1)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_sample_step_draws_softmax_with_exact_log_probs(compiled):
    """The decode step's draw (what the CUDA graph replays; compiled there by default): tokens follow
    softmax(z / T), log-probs are exactly log_softmax(z / T)[tok], finished rows get pad and 0.
    ``compiled`` runs it through torch.compile (inductor's own RNG, on CPU here), as the fast engine
    does on CUDA; a wrong fusion of the Gumbel draw or of logsumexp would move the frequencies."""
    from verl_bridge.rollout.fast_decode import sample_step

    torch.manual_seed(0)
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    n, V, pad = 40000, base.numel(), 99
    logits = base.expand(n, V).contiguous()
    done = torch.zeros(n, dtype=torch.bool)
    done[:7] = True
    draw = torch.compile(sample_step, dynamic=False) if compiled else sample_step
    for T in (1.0, 0.7, 0.0):
        tok, lp = draw(logits, done, T, 1.0, 0, pad)
        assert (tok[:7] == pad).all() and (lp[:7] == 0).all()
        live = tok[7:]
        ref = torch.log_softmax(base if T == 0 else base / T, dim=-1)
        torch.testing.assert_close(lp[7:], ref[live], rtol=0, atol=1e-5)
        if T == 0:
            assert (live == 0).all()
            continue
        freq = torch.bincount(live, minlength=V).float() / live.numel()
        # sd of each frequency <= 0.0025 at n = 40000: 0.012 is about five of them
        assert (freq - ref.exp()).abs().max() < 0.012, (T, freq, ref.exp())
    # two draws differ (the noise is fresh each call, in the compiled graph too)
    a, _ = draw(logits, done, 1.0, 1.0, 0, pad)
    b, _ = draw(logits, done, 1.0, 1.0, 0, pad)
    assert (a != b).any()


def test_sample_step_filtered_renormalises():
    """top-k keeps the k largest logits and renormalises over them (the log-probs too)."""
    from verl_bridge.rollout.fast_decode import sample_step

    torch.manual_seed(1)
    base = torch.tensor([2.0, 1.0, 0.5, 0.0])
    logits = base.expand(20000, 4).contiguous()
    tok, lp = sample_step(logits, torch.zeros(20000, dtype=torch.bool), 1.0, 1.0, 2, 0)
    assert set(tok.unique().tolist()) <= {0, 1}
    ref = torch.log_softmax(base[:2], dim=-1)
    torch.testing.assert_close(lp, ref[tok], rtol=0, atol=1e-5)
    freq = (tok == 0).float().mean()
    assert abs(freq - ref[0].exp()) < 0.015



def test_finished_rows_stop_costing_compute():
    """With EOS, rows that finished are dropped from the step: the live rows are gathered into a
    batch of half the size (then a quarter, ...) and decoding goes on there. Greedy decoding makes
    the tokens comparable: they, the response masks and the log-probs must equal the run that kept
    every row, in the batch's order, while fewer row-steps were computed."""
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.fast_decode import FastEngine

    model, prompts = _model_and_prompts(seed=3, n=16)
    R = 24
    free = FastEngine(model, torch.device("cpu"))
    free.compact = False
    greedy = free.generate(prompts, SamplingParams(max_new_tokens=R, temperature=0.0, eos_token_id=None,
                                                   pad_token_id=0), seed=0).response_ids
    # the EOS: the token whose first appearance splits the rows most (some finish early, some never)
    def first_hits(tok):
        hit = greedy == tok
        return torch.where(hit.any(1), hit.float().argmax(1), torch.full((16,), R))
    eos = max(range(1, 16), key=lambda t: ((first_hits(t) < 8).sum() * (first_hits(t) >= R).sum()).item())
    hits = first_hits(eos)
    assert (hits < 8).sum() >= 4 and (hits >= 12).sum() >= 2, hits  # the test needs rows finishing apart

    sp = SamplingParams(max_new_tokens=R, temperature=0.0, eos_token_id=eos, pad_token_id=0)
    ref = free.generate(prompts, sp, seed=0)
    eng = FastEngine(model, torch.device("cpu"))
    eng.check_every, eng.min_rows = 2, 1
    got = eng.generate(prompts, sp, seed=0)
    assert torch.equal(got.response_ids, ref.response_ids)
    assert torch.equal(got.response_mask, ref.response_mask)
    torch.testing.assert_close(got.log_probs, ref.log_probs, rtol=0, atol=1e-5)
    stats = eng.last_stats
    assert stats["final_batch"] < 16 and stats["row_steps"] < 0.8 * stats["row_steps_uncompacted"], stats
    assert free.last_stats["row_steps"] == free.last_stats["row_steps_uncompacted"]

    # sampling: each row's mask ends right after its first EOS; pad (0) after it
    out = eng.generate(prompts, SamplingParams(max_new_tokens=R, temperature=1.0, eos_token_id=eos,
                                               pad_token_id=0), seed=5)
    for row, mask in zip(out.response_ids, out.response_mask):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()
        assert (row[n:] == 0).all()
        if n < R:
            assert row[n - 1] == eos and (row[: n - 1] != eos).all()


def test_batch_larger_than_the_memory_budget_runs_in_equal_passes():
    """The KV cache is planned from a byte budget (rollout.gpu_memory_utilization of the free device
    memory on CUDA; given directly here): a batch that does not fit runs in equal passes, whose
    outputs (greedy, so comparable) equal the single pass, in the batch's order."""
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.fast_decode import FastEngine

    model, prompts = _model_and_prompts(seed=4, n=13)
    sp = SamplingParams(max_new_tokens=10, temperature=0.0, eos_token_id=None, pad_token_id=0)
    whole = FastEngine(model, torch.device("cpu"))
    ref = whole.generate(prompts, sp, seed=0)
    per_row = whole.row_bytes(16, 10)  # prompt width 16 (pad_to), 10 new tokens
    small = FastEngine(model, torch.device("cpu"), kv_budget_bytes=5 * per_row)
    assert small.rows_per_pass(13, 16, 10) == 5  # 13 rows, 5 fit: three passes of 5 (the last filled up)
    got = small.generate(prompts, sp, seed=0)
    assert small.last_stats["passes"] == 3
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), name
    torch.testing.assert_close(got.log_probs, ref.log_probs, rtol=0, atol=1e-5)
    # one row's budget: one row per pass; no budget: one pass
    assert FastEngine(model, torch.device("cpu"), kv_budget_bytes=per_row).rows_per_pass(13, 16, 10) == 1
    assert whole.rows_per_pass(13, 16, 10) == 13
