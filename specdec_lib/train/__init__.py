"""Draft-head training (``python -m specdec_lib train-draft``) for a Llama target: an MTP
head (deepseek_mtp layout) and an EAGLE3 head; with ``--hybrid DIR`` an MTP head for the GDN
hybrid in DIR (``train-hybrid``'s), written to DIR/smollm2_hybrid_mtp.

    python -m specdec_lib train-draft --method both --out specdec_lib/models/heads      # on a GPU
    python -m specdec_lib train-draft --hybrid DIR --data data.npz                     # the hybrid's

1. Prompts (``--prompts-from``): ``mix`` (default) the prompt mix (``prompt_mix``: questions,
   explanations, creative writing, code, code review, math, advice, rewriting and
   summarising, plus the standard-library docstrings of ``models.prompts``), ``--prompts``
   spread evenly over the training families; translation and multi-turn chat (with system
   prompts) are held out of training entirely; every family gives ``--heldout`` report
   prompts that are never trained on. ``stdlib``: the docstrings only (held out by module),
   the data of the heads before the mix. All go through the tokenizer's chat template as
   messages. No download.
2. Data: the target's own replies, decoded through the library (``SpeculativeDecoder``,
   torch backend, graph-captured; ``--backend reference`` on a CPU): greedy, or for
   ``--sampled-fraction`` of the training prompts sampled at temperature 0.7 (fixed seeds;
   the labels stay the target's argmax); saved with ``--data`` (with each one's family).
3. Teacher: one plain torch forward over every prompt + reply, keeping the features each
   head reads (final hidden for MTP, the three auxiliary layers' outputs for EAGLE3) and the
   target's argmax at every position (the token a draft must guess to be accepted). With
   ``--hybrid`` the teacher is the hybrid's own forward (``train.hybrid_model``, the GDN
   math it was distilled with; ``teacher.HybridTeacher``) over the same base replies: its
   final hidden and its argmax; EAGLE3 (no taps) is refused. The head's config records
   ``target_model`` smollm2_hybrid and the hybrid's ``target_hybrid_weights_sha256``.
4. Training, multi-step (EAGLE3's training-time test): step 0 of anchor p is fed the target
   feature of p and token p+1; step j the previous step's own output and token p+j+1, at
   position p+j; it attends to the step-0 keys of positions <= p and to its own chain's keys
   (exactly what ``models.llama_draft`` computes at decode time) and must predict the
   target's argmax at p+j+1. Loss: cross entropy, step j weighted 0.8^j.
5. Held-out report, over all report prompts and per family (held-out families marked):
   accuracy per step, acceptance per draft position and the mean accepted length the chain
   implies (1 + sum over j of P(steps 0..j all right)); the heads as safetensors +
   config.json, which records the command, the data's sizes and the report.

Each head trains for ``--train-seconds`` (cosine schedule over that time), fixed seed,
from random weights or, with ``--init DIR[,DIR]``, from a saved head of its method (a head
DIR each, or a DIR holding ``<name-prefix>_<method>``), whose architecture (sizes, EAGLE3
draft vocabulary and feature layers) it keeps; heads of another method or target, and size
options that contradict them, are refused naming the argument. The schedule warms up again
(a fresh optimizer). The config's ``specdec_training.init`` is the init's own record (with
its own ``init``, and so on) and ``init_sha256`` the file it started from; every head also
records ``target_gguf_sha256``, checked by a later ``--init`` where both record it.

The math is the inference code's: the teacher and the heads run ``models.llama_layer``'s
``decoder_layer`` / ``draft_step`` with ``models.llama_torch.TorchOps``, and read and write
tensors through its name tables. Modules: ``cli`` (arguments, the run; no torch until it
runs), ``data`` (prompts -> the target's replies, npz), ``teacher`` (the target's forward),
``head`` (a head's parameters, unrolled chain, labels, export), ``loop`` (training and the
held-out report). ``import specdec_lib`` never imports this package; torch is imported by
its modules, not by ``specdec_lib.train`` itself.
"""
