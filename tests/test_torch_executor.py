"""The torch executor on the CPU tiny configuration: paged attention against a dense reference,
chunked prefill, batched decode, OOM, KV resizing through the engine, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from runtime.engine.block_pool import BlockPool  # noqa: E402
from runtime.engine.engine import Engine, EngineConfig  # noqa: E402
from runtime.engine.profiling import SyntheticRequests, make_batch  # noqa: E402
from runtime.engine.request import Request, Status  # noqa: E402
from runtime.engine.torch_executor import TorchExecutor  # noqa: E402
from runtime.engine.torch_model import (  # noqa: E402
    TINY,
    LlamaConfig,
    LlamaModel,
    load_config,
    load_safetensors,
    token_ids,
)
from runtime.knobs import Knobs  # noqa: E402

MIB = 1024 ** 2
ATOL = 2e-5


@pytest.fixture(autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def make_executor(**kw) -> TorchExecutor:
    kw.setdefault("budget_bytes", 256 * MIB)
    kw.setdefault("keep_logits", True)
    return TorchExecutor(TINY, device="cpu", **kw)


def reference(ex: TorchExecutor, req_id: int, length: int) -> torch.Tensor:
    """Dense logits of the last of ``length`` tokens of request ``req_id``."""
    ids = token_ids(torch.full((length,), req_id), torch.arange(length), TINY.vocab_size)
    return ex.model.reference_logits(ids)[-1]


def scattered_request(pool: BlockPool, req_id: int, prompt: int, reserve: int) -> Request:
    """A request whose blocks are scattered over the pool (every other free block)."""
    r = Request(req_id, 0.0, prompt, 64, "interactive", 1.0, 1.0)
    need = -(-reserve // 16)
    got = pool.allocate(2 * need)
    r.block_ids, spare = got[::2][::-1], got[1::2]
    pool.free(spare)
    r.status = Status.RUNNING
    return r


def decode_step(ex: TorchExecutor, reqs: list[Request]) -> None:
    """One decode iteration of ``reqs`` (one token each), then advance them."""
    res = ex.execute(make_batch(reqs, []), 0.5)
    assert not res.oom
    for r in reqs:
        r.num_computed_tokens += 1
        r.num_output_tokens += 1


def prefill(ex: TorchExecutor, chunks: list[tuple[Request, int]]) -> None:
    res = ex.execute(make_batch([], chunks), 0.5)
    assert not res.oom
    for r, n in chunks:
        r.num_computed_tokens += n
        if r.num_computed_tokens == r.num_tokens:
            r.num_output_tokens += 1


# ---------------------------------------------------------------------- attention
@pytest.mark.parametrize("attention", ["ragged", "sdpa"])
def test_paged_attention_matches_dense_reference_across_slabs(attention):
    # slabs of 5 blocks and scattered block tables: gathers and writes cross slab boundaries
    ex = make_executor(slab_blocks=5, decode_attention=attention)
    ex.resize_kv(80, {})
    pool = BlockPool(80)
    reqs = [scattered_request(pool, i, p, p + 12) for i, p in enumerate((37, 16, 70))]
    prefill(ex, [(r, r.prompt_tokens) for r in reqs])
    for r in reqs:
        torch.testing.assert_close(ex.last_logits[r.req_id],
                                   reference(ex, r.req_id, r.prompt_tokens), atol=ATOL, rtol=0)
    for _ in range(6):
        decode_step(ex, reqs)
        for r in reqs:
            torch.testing.assert_close(ex.last_logits[r.req_id],
                                       reference(ex, r.req_id, r.num_computed_tokens),
                                       atol=ATOL, rtol=0)


def test_mixed_batch_of_decodes_and_prefill_matches_reference():
    ex = make_executor()
    ex.resize_kv(64, {})
    pool = BlockPool(64)
    a = scattered_request(pool, 0, 40, 60)
    prefill(ex, [(a, 40)])
    b = scattered_request(pool, 1, 33, 40)
    c = scattered_request(pool, 2, 50, 60)
    prefill(ex, [(c, 20)])  # c: a first chunk, its second comes with a decode and a fresh prompt
    res = ex.execute(make_batch([a], [(b, 33), (c, 30)]), 0.5)
    assert not res.oom
    torch.testing.assert_close(ex.last_logits[0], reference(ex, 0, 41), atol=ATOL, rtol=0)
    torch.testing.assert_close(ex.last_logits[1], reference(ex, 1, 33), atol=ATOL, rtol=0)
    torch.testing.assert_close(ex.last_logits[2], reference(ex, 2, 50), atol=ATOL, rtol=0)


@pytest.mark.parametrize("continued", ["split", "masked"])
def test_chunked_prefill_equals_unchunked(continued, monkeypatch):
    # split: the CPU's context + own-block attention merged by log-sum-exp; masked: one SDPA call
    # with the bottom-right causal mask (the CUDA path, and the CPU's without the flash operator)
    if continued == "masked":
        import runtime.engine.torch_model as tm
        monkeypatch.setattr(tm, "_cpu_flash_with_lse", lambda: None)
    ex = make_executor()
    ex.resize_kv(64, {})
    pool = BlockPool(64)
    whole = scattered_request(pool, 7, 75, 75)
    prefill(ex, [(whole, 75)])
    logits_whole = ex.last_logits[7].clone()
    kv_whole = torch.stack([ex.kv.tokens(li, whole.block_ids, 75) for li in range(TINY.num_layers)])

    # the same request id (so the same tokens) in other blocks, in chunks of 16, 5, 31, 23
    chunked = scattered_request(pool, 7, 75, 75)
    for n in (16, 5, 31, 23):
        prefill(ex, [(chunked, n)])
    torch.testing.assert_close(ex.last_logits[7], logits_whole, atol=ATOL, rtol=0)
    kv_chunked = torch.stack([ex.kv.tokens(li, chunked.block_ids, 75)
                              for li in range(TINY.num_layers)])
    torch.testing.assert_close(kv_chunked, kv_whole, atol=ATOL, rtol=0)


@pytest.mark.parametrize("attention", ["ragged", "sdpa"])
@pytest.mark.parametrize("gather_bytes", [None, 8 * 1024])
def test_batched_decode_equals_one_request_at_a_time(gather_bytes, attention):
    # 8 KiB per layer gathers one block of one sequence: one group per decode row
    lengths = (5, 40, 17, 64, 33)
    outs = []
    for batched in (True, False):
        ex = make_executor(decode_gather_bytes=gather_bytes, decode_attention=attention)
        ex.resize_kv(128, {})
        pool = BlockPool(128)
        reqs = [scattered_request(pool, i, p, p + 8) for i, p in enumerate(lengths)]
        prefill(ex, [(r, r.prompt_tokens) for r in reqs])
        seen = []
        for _ in range(4):
            if batched:
                decode_step(ex, reqs)
            else:
                for r in reqs:
                    decode_step(ex, [r])
            seen.append(torch.stack([ex.last_logits[r.req_id] for r in reqs]))
        outs.append(torch.stack(seen))
    torch.testing.assert_close(outs[0], outs[1], atol=ATOL, rtol=0)


GQA4 = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=128, num_layers=2,
                   num_heads=8, num_kv_heads=2, max_position=1024, name="gqa4")
"""four query heads per KV head (TINY has two)"""


@pytest.mark.parametrize("page_tokens", [16, 32, 64])
def test_ragged_decode_matches_dense_reference_for_gqa_and_varied_lengths(page_tokens):
    # contexts on both sides of block and page edges, one far longer than the rest; 4 KiB of
    # gather per layer (16 blocks) cuts the decodes into several runs, the longest alone in
    # one; slabs of 7 blocks and scattered tables make gathers and writes cross slabs
    ex = TorchExecutor(GQA4, budget_bytes=64 * MIB, device="cpu", keep_logits=True,
                       slab_blocks=7, decode_gather_bytes=4096, decode_page_tokens=page_tokens,
                       decode_attention="ragged")
    ex.resize_kv(200, {})
    pool = BlockPool(200)
    lengths = (1, 14, 15, 16, 31, 33, 63, 64, 65, 200)
    reqs = [scattered_request(pool, i, p, p + 4) for i, p in enumerate(lengths)]
    prefill(ex, [(r, r.prompt_tokens) for r in reqs])
    for _ in range(2):
        decode_step(ex, reqs)
        assert len(ex._plan(make_batch(reqs, []))[0].decode_runs) > 2
        for r in reqs:
            ids = token_ids(torch.full((r.num_computed_tokens,), r.req_id),
                            torch.arange(r.num_computed_tokens), GQA4.vocab_size)
            torch.testing.assert_close(ex.last_logits[r.req_id],
                                       ex.model.reference_logits(ids)[-1], atol=ATOL, rtol=0)


def test_decode_time_follows_the_summed_context_not_the_longest():
    """Loose on purpose (timings on a shared machine): at 8 sequences, the time grows with the
    summed context, and one long sequence among short ones costs about what the same summed
    context spread evenly costs (a padded attention would pay 8x the longest)."""
    import statistics

    from runtime.gc_pause import gc_paused

    # 8 MiB of gather per layer: one ragged run for any of these batches (a padded attention
    # would put the longest sequence with three others and pay for 4 x its length)
    ex = make_executor(keep_logits=False, timer="thread", decode_gather_bytes=8 * MIB)
    ex.resize_kv(ex.memory.num_kv_blocks(0.9), {})
    synth = SyntheticRequests(ex.kv.num_blocks, 16)
    shapes = {s: [s // 8] * 8 for s in (256, 1024, 2048, 4096, 8192)}
    shapes["skewed"] = [4096 - 7 * 64] + [64] * 7  # TINY has 4096 positions
    batches = {k: make_batch([synth.decode(c) for c in v], []) for k, v in shapes.items()}
    times: dict = {k: [] for k in batches}
    with gc_paused():
        for rep in range(8):
            for k, b in batches.items():
                res = ex.execute(b, 0.9)
                assert not res.oom
                if rep:
                    times[k].append(res.duration_s)
    best = {k: min(v) for k, v in times.items()}
    sums = [s for s in shapes if s != "skewed"]
    r = np.corrcoef(sums, [best[s] for s in sums])[0, 1]
    assert r > 0.8, (r, best)
    assert best[8192] > 1.3 * best[256], best
    assert 0.6 < best["skewed"] / best[4096] < 1.6, best
    assert statistics.median(times[8192]) > statistics.median(times[256])


def test_a_position_beyond_the_rotary_table_is_refused_by_name():
    ex = make_executor()
    ex.resize_kv(600, {})
    r = scattered_request(BlockPool(600), 5, TINY.max_position, TINY.max_position + 1)
    r.num_computed_tokens = TINY.max_position  # decoding position max_position
    with pytest.raises(ValueError, match=r"request 5: position 4096 is beyond the model's "
                                         r"max_position=4096"):
        ex.execute(make_batch([r], []), 0.5)


# ---------------------------------------------------------------------- memory
def test_oom_under_a_small_budget_is_reported_not_raised():
    ex = make_executor(budget_bytes=8 * MIB, act_fixed_bytes=0, act_bytes_per_token=4096)
    ex.resize_kv(ex.memory.num_kv_blocks(0.9), {})
    synth = SyntheticRequests(ex.kv.num_blocks, 16)
    workspace = ex.memory.workspace_bytes(0.9)
    too_many = workspace // 4096 + 16
    res = ex.execute(make_batch([], [synth.prefill(0, too_many)]), 0.9)
    assert res.oom and res.duration_s >= 0
    ok = ex.execute(make_batch([], [synth.prefill(0, 32)]), 0.9)
    assert not ok.oom


def test_engine_counts_ooms_and_finishes_every_request():
    ex = make_executor(budget_bytes=8 * MIB, act_fixed_bytes=0, act_bytes_per_token=4096,
                       keep_logits=False)
    knobs = Knobs(batch_window_ms=5.0, prefill_chunk_tokens=1024, kv_cache_ratio=0.9)
    # room for about 180 tokens of activations at ratio 0.9: a 1024-token chunk cannot fit
    assert ex.memory.fits(128, 0.9) and not ex.memory.fits(1024, 0.9)
    eng = Engine(ex, knobs, EngineConfig(fast_path=False))
    eng.add_requests([0.0, 0.0, 0.001], [600, 300, 50], [4, 3, 5])
    eng.run_to_completion(max_time_s=60)
    assert eng.num_ooms >= 1
    assert all(r.status == Status.FINISHED for r in eng.requests)
    eng.check_invariants()


def test_resize_keeps_moved_blocks_and_frees_memory():
    ex = make_executor(slab_blocks=8)
    ex.resize_kv(40, {})
    assert ex.bytes_held == 40 * ex.memory.kv_block_bytes
    pool = BlockPool(40)
    pool.allocate(30)  # the request lands in blocks 30.., above the cut
    r = scattered_request(pool, 3, 20, 40)
    prefill(ex, [(r, 20)])
    before = ex.last_logits[3].clone()
    moves = {b: i for i, b in enumerate(r.block_ids)}  # to blocks 0, 1, 2
    ex.resize_kv(12, moves)
    r.block_ids = [moves[b] for b in r.block_ids]
    assert ex.bytes_held == 12 * ex.memory.kv_block_bytes
    decode_step(ex, [r])
    torch.testing.assert_close(ex.last_logits[3], reference(ex, 3, 21), atol=ATOL, rtol=0)
    assert not torch.equal(ex.last_logits[3], before)


def test_lowering_the_ratio_through_the_engine_preempts_and_frees_bytes():
    ex = make_executor(budget_bytes=4 * MIB, act_fixed_bytes=0, act_bytes_per_token=1024,
                       keep_logits=False)
    eng = Engine(ex, Knobs(5.0, 512, 0.95), EngineConfig(fast_path=False, watermark=0.0))
    held_high = ex.bytes_held
    assert held_high == eng.pool.num_blocks * ex.memory.kv_block_bytes
    n = eng.pool.num_blocks * 16 // 400  # enough 300+100-token requests to fill the pool
    eng.add_requests([0.0] * n, [300] * n, [100] * n)
    # run (in measured time, so step by the engine's state, not by a clock) until more blocks
    # are in use than the lower ratio holds
    low = Knobs(5.0, 512, 0.4)
    while eng.pool.num_used <= eng.memory.num_kv_blocks(0.4) and eng.has_work():
        eng.run_until(eng.now + 0.005)
    assert eng.memory.num_kv_blocks(0.4) < eng.pool.num_used, "the pool never over-filled"
    eng.set_knobs(low)
    assert eng.num_preemptions >= 1
    assert ex.bytes_held == eng.pool.num_blocks * ex.memory.kv_block_bytes < held_high
    eng.check_invariants()
    eng.run_to_completion(max_time_s=600)
    assert all(r.status == Status.FINISHED for r in eng.requests)


def test_tiny_trace_through_the_engine_finishes_every_request():
    ex = make_executor(keep_logits=False)
    eng = Engine(ex, Knobs(10.0, 256, 0.9), EngineConfig(fast_path=False))
    eng.add_requests([0.0, 0.01, 0.02, 0.05, 0.05, 0.3], [20, 300, 7, 120, 64, 500],
                     [5, 9, 1, 12, 3, 4])
    eng.run_to_completion(max_time_s=120)
    s = eng.summary()
    assert s.finished == 6 and s.rejected == 0
    assert eng.num_iterations > 0 and eng.now > 0
    eng.check_invariants()


def test_refuses_a_budget_below_the_weights():
    with pytest.raises(ValueError, match=r"budget_bytes=1000 does not exceed the weights"):
        TorchExecutor(TINY, budget_bytes=1000, device="cpu")


def test_decode_cost_is_not_promised():
    assert make_executor().decode_cost() is None


# ---------------------------------------------------------------------- checkpoints
def _hf_state(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The model's weights in the Hugging Face layout (separate q/k/v and gate/up)."""
    cfg = model.cfg
    nh, nkv, hd, i_ = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    sd = {"model.embed_tokens.weight": model.embed, "model.norm.weight": model.norm,
          "lm_head.weight": model.lm_head}
    for i, layer in enumerate(model.layers):
        pre = f"model.layers.{i}."
        q, k, v = layer.qkv_proj.split((nh * hd, nkv * hd, nkv * hd))
        g, u = layer.gate_up_proj.split((i_, i_))
        sd.update({pre + "self_attn.q_proj.weight": q, pre + "self_attn.k_proj.weight": k,
                   pre + "self_attn.v_proj.weight": v,
                   pre + "self_attn.o_proj.weight": layer.o_proj,
                   pre + "mlp.gate_proj.weight": g, pre + "mlp.up_proj.weight": u,
                   pre + "mlp.down_proj.weight": layer.down_proj,
                   pre + "input_layernorm.weight": layer.input_norm,
                   pre + "post_attention_layernorm.weight": layer.post_norm})
    return {k: t.detach().clone().contiguous() for k, t in sd.items()}


def test_safetensors_checkpoint_loads_into_the_executor(tmp_path):
    import json

    from safetensors.torch import save_file

    src = LlamaModel(TINY, seed=123)
    save_file(_hf_state(src), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096}))
    cfg = load_config(tmp_path)
    assert (cfg.hidden_size, cfg.num_kv_heads, cfg.num_layers) == (128, 2, 2)
    ex = TorchExecutor(cfg, budget_bytes=256 * MIB, device="cpu", checkpoint=str(tmp_path),
                       keep_logits=True)
    ids = token_ids(torch.full((9,), 1), torch.arange(9), 512)
    torch.testing.assert_close(ex.model.reference_logits(ids), src.reference_logits(ids))


def test_safetensors_refuses_a_wrong_shape_and_names_the_tensor(tmp_path):
    from safetensors.torch import save_file

    sd = _hf_state(LlamaModel(TINY, seed=1))
    sd["model.layers.1.mlp.up_proj.weight"] = torch.zeros(255, 128)
    save_file(sd, str(tmp_path / "m.safetensors"))
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.up_proj.weight.*\(255, 128\).*"
                                         r"\(256, 128\)"):
        load_safetensors(LlamaModel(TINY), tmp_path / "m.safetensors")
    sd["model.layers.1.mlp.up_proj.weight"] = torch.zeros(256, 128)
    del sd["model.norm.weight"]
    save_file(sd, str(tmp_path / "m.safetensors"))
    with pytest.raises(KeyError, match="model.norm.weight"):
        load_safetensors(LlamaModel(TINY), tmp_path / "m.safetensors")


def test_config_refuses_heads_that_do_not_divide():
    with pytest.raises(ValueError, match=r"num_heads=4 is not a multiple of num_kv_heads=3"):
        LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=8, num_layers=1,
                    num_heads=4, num_kv_heads=3)
