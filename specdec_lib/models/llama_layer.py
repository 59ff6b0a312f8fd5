"""The Llama decoder layer and draft-head step, written once for every way they run.

``decoder_layer`` and ``draft_step`` are the dataflow; an ``ops`` object supplies the math:

* ``LlamaTarget`` / ``LlamaDraftHead`` (inference, ``models.llama``): the library's ops on the
  backend (``rms_norm`` with the residual add fused, ``silu_mul``, ``draft_combine``), the
  GEMMs of its dense math, results written into preallocated buffers (``out``);
* the trainer's teacher and heads (``specdec_lib.train``): differentiable torch
  (``models.llama_torch.TorchOps``), new tensors each call (``out`` ignored).

The caller's ``attend(q, k, v) -> o`` does rope, the KV cache and the attention (paged
``verify_attention`` or the prefill's causal kernel at decode time; masked SDPA in training).
Names and the fused weight form are here too, so a checkpoint is read and written with one
table. No numpy or torch import: shapes are read off the arrays given.
"""
from __future__ import annotations

# a decoder layer's tensors, by role (below "model.layers.{i}." or a draft head's prefix)
LAYER_TENSORS = dict(
    ln1="input_layernorm.weight", ln2="post_attention_layernorm.weight",
    q="self_attn.q_proj.weight", k="self_attn.k_proj.weight", v="self_attn.v_proj.weight",
    o="self_attn.o_proj.weight",
    gate="mlp.gate_proj.weight", up="mlp.up_proj.weight", down="mlp.down_proj.weight")


def layer_tensor_names(prefix):
    """{role: tensor name} of the decoder layer under ``prefix`` (e.g. "model.layers.3.")."""
    return {r: prefix + n for r, n in LAYER_TENSORS.items()}


def head_tensor_names(layout, prefix):
    """{role: tensor name} of a draft head's own tensors (the registry layouts).

    deepseek_mtp (``prefix`` "model.layers.{N}."): enorm / hnorm, eh_proj, a decoder layer,
    shared_head.norm (the lm_head is the target's unless shared_head.head is given).
    eagle3 (``prefix`` "midlayer."): input_layernorm / hidden_norm (the embedding and hidden
    norms; no separate attention norm: q/k/v read the combined row), fc, norm, lm_head."""
    names = layer_tensor_names(prefix)
    if layout == "eagle3":
        del names["ln1"]
        names.update(fc="fc.weight", norm_e=prefix + "input_layernorm.weight",
                     norm_h=prefix + "hidden_norm.weight", final="norm.weight",
                     lm_head="lm_head.weight")
    elif layout == "deepseek_mtp":
        names.update(fc=prefix + "eh_proj.weight", norm_e=prefix + "enorm.weight",
                     norm_h=prefix + "hnorm.weight", final=prefix + "shared_head.norm.weight")
    else:
        raise ValueError(f"layout: {layout!r}; Llama draft heads are deepseek_mtp or eagle3")
    return names


def fuse_layer(p, cat_rows):
    """A layer's tensors by role -> the form ``decoder_layer`` reads: q/k/v as one qkv
    matrix and gate/up as one gate_up (rows concatenated by ``cat_rows``); the norms as
    they are (ln1 where present)."""
    L = dict(ln2=p["ln2"], qkv=cat_rows([p["q"], p["k"], p["v"]]), o=p["o"],
             gate_up=cat_rows([p["gate"], p["up"]]), down=p["down"])
    if "ln1" in p:
        L["ln1"] = p["ln1"]
    return L


def split_qkv(qkv, heads):
    """q [.., nq, D], k and v [.., nkv, D]: views of a fused qkv projection's rows [.., F]."""
    nq, nkv, D = heads
    lead = tuple(qkv.shape[:-1])
    return (qkv[..., :nq * D].reshape(*lead, nq, D),
            qkv[..., nq * D:(nq + nkv) * D].reshape(*lead, nkv, D),
            qkv[..., (nq + nkv) * D:].reshape(*lead, nkv, D))


def decoder_layer(ops, L, a_in, resid, next_norm, attend, heads, out=None):
    """One decoder layer from its attention input on: the target's layers, the draft heads'
    one, at decode time and in training.

        q, k, v = split(a_in @ L.qkv);  o = attend(q, k, v)
        x = resid + o @ L.o;  h = rms_norm(x, L.ln2)
        x = x + (silu(h @ Wg) * (h @ Wu)) @ Wd;  h = rms_norm(x, next_norm)

    Returns (x, h): the residual stream and its norm under ``next_norm`` (the next layer's
    input norm, or the final norm). ``heads`` = (nq, nkv, D); rows are the leading axes
    (``[T, F]`` or ``[B, N, F]``). ``out``: where ops that write in place put x (may be
    ``resid``)."""
    nq, _, D = heads
    qkv = ops.gemm(a_in, L["qkv"])
    o = attend(*split_qkv(qkv, heads))
    lead = tuple(qkv.shape[:-1])
    return layer_rest(ops, L, ops.gemm(o.reshape(*lead, nq * D), L["o"]), resid, next_norm, out)


def layer_rest(ops, L, mix, resid, next_norm, out=None):
    """A decoder layer after its mixer (attention, or a hybrid's GDN) gave ``mix``, the
    o projection's output: x = resid + mix; h = rms_norm(x, L.ln2); x += mlp(h); returns
    (x, rms_norm(x, next_norm)) (``out`` as in ``decoder_layer``)."""
    x, h = ops.add_norm(mix, resid, L["ln2"], out)
    mlp = ops.gemm(ops.silu_mul(ops.gemm(h, L["gate_up"])), L["down"])
    return ops.add_norm(mlp, x, next_norm, x)


def draft_step(ops, layout, P, embed, hid, tokens, attend, heads, hidden_size):
    """One step of a Llama draft head (MTP in the deepseek_mtp layout, or EAGLE3) over rows:
    ``hid`` the feature (target hidden, EAGLE3's aux taps on its first step, or the
    previous step's x), ``tokens`` the token after each row. ``P``: the head's tensors by
    role in fused form (``fuse_layer`` + fc, norm_e, norm_h, final, ln1 for MTP).

        MTP:     c = [rms(embed[tok], enorm), rms(hid, hnorm)];  x = eh_proj(c)
                 decoder_layer(a_in = rms(x, ln1), resid = x)
        EAGLE3:  hid = fc(aux) on the first step;  c = [rms(embed[tok]), rms(hid)]
                 decoder_layer(a_in = c (q/k/v take 2H), resid = hid)

    Returns (x, h): the step's output and its final norm (the lm_head input)."""
    if layout == "eagle3":
        if hid.shape[-1] != hidden_size:
            hid = ops.fc(hid, P["fc"])
        comb = ops.combine(embed, hid, tokens, P["norm_e"], P["norm_h"])
        return decoder_layer(ops, P, comb, hid, P["final"], attend, heads,
                             out=ops.new_rows(hid))
    comb = ops.combine(embed, hid, tokens, P["norm_e"], P["norm_h"])
    x = ops.fc(comb, P["fc"])                                   # eh_proj
    return decoder_layer(ops, P, ops.norm(x, P["ln1"]), x, P["final"], attend, heads, out=x)
