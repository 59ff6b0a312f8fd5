"""The contract's machinery: the host-side array view, the per-op registry and the
decorator that puts a contract in front of a reference op."""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Dict, Optional

from .._args import DeviceArg, HostArg  # noqa: F401  (the two array views)

CHECKS: Dict[str, Callable] = {}   # op name -> its contract function


def check(name: str, fn: Optional[Callable] = None):
    """Register ``fn`` as the contract of op ``name`` (usable as a decorator)."""
    def register(f):
        CHECKS[name] = f
        return f
    return register(fn) if fn is not None else register


def host_values(a):
    """``values`` of the host paths: the numpy values of a HostArg, None where it has none
    (an absent optional argument, a fake tensor)."""
    return a.values()


def index_values(stream_h: int):
    """``values`` of the GPU path with ``check_indices``: copy a small index array to the
    host on the op's stream and wait for it; None while the stream captures a graph (no
    synchronous copy is possible then: the kernels flag bad indices instead). The driver is
    asked at the first use only, so a call the contract refuses earlier never touches it
    (a host array given to a GPU op is reported as such, not as a missing driver)."""
    capturing = []

    def values(a):
        if a.obj is None:
            return None
        if not capturing:
            from .. import runtime
            capturing.append(runtime.driver().stream_is_capturing(stream_h))
        if capturing[0]:
            return None
        from .._validate import to_host
        return to_host(a, stream_h)
    return values


def run_host_check(name: str, bound: dict) -> None:
    """The contract of op ``name`` on host arrays (numpy, torch on any device)."""
    fn = CHECKS[name]
    params = _params(fn)
    fn(**{k: v for k, v in bound.items() if k in params}, arg=HostArg, values=host_values)


@functools.lru_cache(maxsize=None)
def _params(fn):
    return frozenset(inspect.signature(fn).parameters)


def checked(name: str):
    """Decorator of a reference op: run op ``name``'s contract on its (host) arguments
    first. The undecorated function stays reachable as ``.unchecked`` (the torch ops
    check the torch tensors themselves, then pass the reference numpy copies)."""
    def wrap(ref_fn):
        sig = inspect.signature(ref_fn)

        @functools.wraps(ref_fn)
        def call(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            run_host_check(name, bound.arguments)
            return ref_fn(*args, **kwargs)
        call.unchecked = ref_fn
        return call
    return wrap
