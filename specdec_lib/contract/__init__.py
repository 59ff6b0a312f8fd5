"""Every op's argument contract, in one place, checked on every path.

One function per op, named like the op, in ``contract/<family>.py``:
``append_kv(k, v, k_cache, ..., *, arg=DeviceArg, values=None)``. It checks what the host
can see -- dtypes, shapes, strides, devices, and, where ``values`` reads them, the index
arrays' values (offsets, lengths, page and slot ids) -- and raises ``TypeError`` /
``ValueError`` naming the argument before anything is written. It returns the validated
views (``DeviceArg`` / ``HostArg``) the caller launches with.

The paths that call it:

* the GPU ops (``specdec_lib.ops``): ``arg=DeviceArg``; ``values`` copies the index arrays
  to the host when ``check_indices`` is on (never while a stream captures a graph);
* the numpy reference (``specdec_lib.reference``): ``@checked`` runs the contract with
  ``arg=HostArg`` and the arrays' own values before the reference computes;
* the torch ops (``specdec_lib.torch_ops``): CUDA tensors go through the GPU op; CPU
  tensors are checked here on the tensors themselves (so a float32 ``k`` for a bf16 cache
  is refused, although the reference computes on float32 copies) and then run the
  unchecked reference; fake tensors under ``torch.compile`` are checked here too (without
  values, which a fake tensor does not have).

What the host cannot see without a copy during a captured round -- NaN logits,
out-of-vocabulary draft ids, bad indices with ``check_indices=False`` -- is never a fault:
the kernels flag the row (``specdec_lib.status``).
"""
from ._core import (CHECKS, DeviceArg, HostArg, check, checked, host_values,  # noqa: F401
                    index_values, run_host_check)

# every family's contract registers itself in CHECKS on import
from . import attention, conv, copy, draft, gdn, layers, sampling, sequence  # noqa: E402,F401
