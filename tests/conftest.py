"""Shared test helpers. GPU tests carry ``@needs_gpu`` (the ``gpu`` marker): they are
skipped, with the reason, where there is no CUDA GPU or the extension is not built."""
import os
import re

import numpy as np
import pytest

from specdec_lib import runtime

_GPU_REASON = runtime.gpu_unavailable_reason()
needs_gpu = pytest.mark.gpu

# .ci/run runs these tests against the installed release wheel: SPECDEC_TEST_INSTALLED=1 makes
# sure they import it from site-packages, not the source tree they sit in.
if os.environ.get("SPECDEC_TEST_INSTALLED") == "1":
    import specdec_lib
    _where = os.path.realpath(os.path.dirname(specdec_lib.__file__))
    _tree = os.path.realpath(os.path.join(os.path.dirname(__file__), ".."))
    if "site-packages" not in _where.split(os.sep) or _where == os.path.join(_tree, "specdec_lib"):
        raise pytest.UsageError(f"SPECDEC_TEST_INSTALLED=1 but specdec_lib is imported from {_where}")


# ---------------------------------------------------------------- sanitizer runs
# tools/gpu/sanitize.sh runs the GPU tests under compute-sanitizer, which is 10-100x slower per
# launch (racecheck more on shared-memory-heavy kernels). SPECDEC_SANITIZE selects small
# shapes: level 1 deselects the statistical tests with huge sample counts and the
# multi-GiB large-index module; level 2 also the large-vocab / long-context cases. Both
# keep at least one case of every kernel and code path. SPECDEC_SANITIZE_MAX_PER_TEST=N
# keeps at most N evenly spaced parametrizations of each GPU test function.
def _sanitize_level():
    v = os.environ.get("SPECDEC_SANITIZE", "").strip()
    if v in ("", "0"):
        return 0
    return int(v) if v.isdigit() else 1


SANITIZE = _sanitize_level()
SANITIZE_DROP = {
    1: [r"test_large_index\.py::",
        r"::test_spec_sample_gpu_chi_square\b"],                  # 100k sequences
    2: [r"::test_spec_sample_gpu_greedy_bit_exact\[.*151936",     # V=5003 keeps 3 tiles
        r"::test_spec_sample_gpu_deterministic_across_runs_and_streams\b",
        r"::test_verify_attention_gpu_long_context\b",            # 32k keys; many_splits stays
        r"::test_copy_contiguous\[.*1000003"],
}


def _sanitize_selection(config, items):
    level = SANITIZE
    cap = int(os.environ.get("SPECDEC_SANITIZE_MAX_PER_TEST", "0") or 0)
    pats = [re.compile(p) for lv in sorted(SANITIZE_DROP) if lv <= level for p in SANITIZE_DROP[lv]]
    keep, drop = [], []
    for item in items:
        (drop if any(p.search(item.nodeid) for p in pats) else keep).append(item)
    if cap > 0:
        groups = {}
        for item in keep:
            if "gpu" in item.keywords:
                groups.setdefault((item.path, getattr(item, "originalname", item.name)), []).append(item)
        thin = set()
        for group in groups.values():
            n = len(group)
            if n > cap:
                chosen = {round(i * (n - 1) / (cap - 1)) for i in range(cap)} if cap > 1 else {0}
                thin.update(id(it) for j, it in enumerate(group) if j not in chosen)
        drop += [it for it in keep if id(it) in thin]
        keep = [it for it in keep if id(it) not in thin]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config):
    if os.environ.get("SPECDEC_TEST_INSTALLED") == "1":
        import specdec_lib
        return f"specdec_lib under test: {os.path.dirname(specdec_lib.__file__)} (installed)"
    if SANITIZE or os.environ.get("SPECDEC_SANITIZE_MAX_PER_TEST"):
        return (f"SPECDEC_SANITIZE={SANITIZE} SPECDEC_SANITIZE_MAX_PER_TEST="
                f"{os.environ.get('SPECDEC_SANITIZE_MAX_PER_TEST', '0')}: small-shape selection")
    return None


def pytest_collection_modifyitems(config, items):
    if SANITIZE or os.environ.get("SPECDEC_SANITIZE_MAX_PER_TEST"):
        _sanitize_selection(config, items)
    if os.environ.get("SPECDEC_SLOW", "") in ("", "0"):     # the ``slow`` marker: opt-in
        slow = pytest.mark.skip(reason="slow (over ~30 s on the CPU): set SPECDEC_SLOW=1")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(slow)
    if _GPU_REASON is None:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {_GPU_REASON}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def poison(shape, dtype, device=0):
    """A device array whose every byte is 0xFF: NaN for floats, -1 for ints, so an element
    a kernel fails to write shows up."""
    from specdec_lib import DeviceArray
    return DeviceArray.empty(shape, dtype, device).fill_bytes(0xFF)


def switched(module, name, run):
    """{False: run(), True: run()} with the module switch ``module.name`` set to each (its
    value restored after): the A/B of an orchestrator switch (serve.LIVE_ROWS, ...)."""
    was, out = getattr(module, name), {}
    try:
        for on in (False, True):
            setattr(module, name, on)
            out[on] = run()
    finally:
        setattr(module, name, was)
    return out


def rel_err(out, ref):
    """||out - ref|| / ||ref|| in float64; inf when out holds NaN/inf the reference lacks."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise AssertionError(f"shape {out.shape} != reference {ref.shape}")
    if not np.all(np.isfinite(out) == np.isfinite(ref)):
        return float("inf")
    fin = np.isfinite(ref)
    den = np.linalg.norm(ref[fin])
    num = np.linalg.norm(out[fin] - ref[fin])
    return float(num / den) if den > 0 else float(num)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """(config, tensors, draft weights) of the demo checkpoint (models.tiny_hybrid), made
    once a module (test_tp.py has its own)."""
    from specdec_lib.models import load_demo_checkpoint, make_demo_checkpoint
    path = str(tmp_path_factory.mktemp("demo_ckpt"))
    make_demo_checkpoint(path)
    return load_demo_checkpoint(path)


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test id (reproducible, different per case)."""
    import zlib
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


# ---------------------------------------------------------------- the argument contract
# Every op refuses a host-visible mistake with TypeError/ValueError naming the argument,
# before it writes anything, on the reference path (numpy arrays) and the eager torch path
# (CPU tensors through torch.ops.specdec). Tests build one op call as a dict of numpy arrays
# with the torch dtype each tensor should have, then break one argument.
REFUSAL_PATHS = ("reference", "torch")


def _torch_or_skip():
    return pytest.importorskip("torch", reason="the eager torch path needs torch")


def on_path(path, args, torch_dtypes=None):
    """args (name -> numpy array / scalar / None) as the path's arrays: numpy as given for
    "reference"; CPU torch tensors for "torch", converted to ``torch_dtypes[name]`` (a torch
    dtype name such as "bfloat16") where given, else numpy's dtype."""
    if path == "reference":
        return dict(args)
    torch = _torch_or_skip()
    out = {}
    for name, v in args.items():
        if isinstance(v, np.ndarray):
            t = torch.from_numpy(v.copy())
            dt = (torch_dtypes or {}).get(name)
            out[name] = t.to(getattr(torch, dt)) if dt else t
        else:
            out[name] = v
    return out


def call_op(path, name, args, kwargs=None):
    """Op ``name`` on the path's arrays (positional ``args`` in the op's order)."""
    if path == "reference":
        from specdec_lib import reference
        return getattr(reference, name)(*args, **(kwargs or {}))
    torch = _torch_or_skip()
    import specdec_lib.torch_ops  # noqa: F401  (registers torch.ops.specdec)
    return getattr(torch.ops.specdec, name)(*args, **(kwargs or {}))


def _snapshot(a):
    if isinstance(a, np.ndarray):
        return a.copy().view(np.uint8)
    return a.detach().clone().contiguous().view(-1).view(__import__("torch").uint8).numpy()


def assert_refused(call, exc, match, outputs):
    """``call()`` raises ``exc`` whose message matches ``match`` (it should start with the
    argument's name), and leaves every array of ``outputs`` byte for byte as it was."""
    before = [_snapshot(o) for o in outputs if o is not None]
    with pytest.raises(exc, match=match):
        call()
    after = [_snapshot(o) for o in outputs if o is not None]
    for i, (b, a) in enumerate(zip(before, after)):
        assert np.array_equal(b, a), f"output {i} was written before the error"


def strided_last(a):
    """``a`` with the same values but a last dimension of stride 2 (numpy or torch)."""
    if isinstance(a, np.ndarray):
        return np.repeat(a, 2, axis=-1)[..., ::2]
    return a.repeat_interleave(2, dim=-1)[..., ::2]


def cast(path, a, dtype):
    """``a`` converted to ``dtype`` (a dtype name) on the path's array type."""
    if path == "reference":
        return a.astype(dtype)
    torch = _torch_or_skip()
    return a.to(getattr(torch, dtype))


def vals(path, xs, dtype="int32"):
    """The values ``xs`` as a 1-D array of ``dtype`` on the path's array type."""
    if path == "reference":
        return np.array(xs, dtype)
    torch = _torch_or_skip()
    return torch.tensor(xs, dtype=getattr(torch, dtype))


def zeros_on(path, shape, dtype):
    """A zero array of ``shape`` and ``dtype`` (a dtype name) on the path's array type."""
    if path == "reference":
        return np.zeros(shape, dtype)
    torch = _torch_or_skip()
    return torch.zeros(shape, dtype=getattr(torch, dtype))
