"""Tensor parallelism over torch.distributed: the collectives a rank needs, the per-round
rank-agreement check, and process start-up (spawn or torchrun).

The sharded model itself is ``models.tiny_hybrid_tp.TinyHybridTargetTP`` (heads split
Megatron-style, one all-reduce per layer); ``examples/tp_demo.py`` runs it over N GPUs and
checks it against one GPU. torch is imported by the functions that need it, never by
``import specdec_lib``.

    disable_nvlink_multicast()          # before torch / NCCL load (spawned children too)
    launch(worker, world, args)         # worker(rank, world, args, init_method, local_rank)
    dist = init_process_group(rank, world, "cuda", init_method, device=rank)
    comm = Comm(torch, dist, "cuda", rank, world, device, stream=be.stream)
    be = rank_checked(be, comm, log)    # seq_stop raises RankDisagreement if ranks differ
"""
from __future__ import annotations

import datetime
import os
import socket
from types import SimpleNamespace

import numpy as np

__all__ = ["Comm", "RankDisagreement", "rank_checked", "init_process_group", "launch",
           "disable_nvlink_multicast", "NVLS_OFF"]

# NVLink multicast (NVLS) stays off: set before torch / NCCL are loaded anywhere
NVLS_OFF = (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
            ("NVSHMEM_DISABLE_NVLS", "1"))


def disable_nvlink_multicast():
    """Force NCCL_NVLS_ENABLE=0 and the torch / NVSHMEM equivalents into the environment
    (spawned ranks inherit it)."""
    for k, v in NVLS_OFF:
        os.environ[k] = v


class RankDisagreement(RuntimeError):
    """The ranks' sampling / stop outputs of one round differ."""


class Comm:
    """The collectives a rank needs, on the array module of its backend.

    cuda: cupy arrays are handed to torch without a copy (DLPack) and the NCCL call is
    issued with torch's current stream set to the backend's stream (``be.stream``, where
    the library kernels and cupy's math run; torch.cuda.ExternalStream), so
    ProcessGroupNCCL waits for the kernels that produced the data and makes that stream
    wait for the reduction before the next kernel reads it. reference: numpy arrays, gloo.
    """

    def __init__(self, torch, dist, backend_name, rank, world, device=0, stream=None,
                 sync=False):
        self.torch, self.dist = torch, dist
        self.rank, self.world, self.sync = rank, world, sync
        self.cuda = backend_name == "cuda"
        self.n_all_reduce = 0
        if self.cuda:
            import cupy
            self.cp = cupy
            self.stream = stream
            self.ext = torch.cuda.ExternalStream(stream.ptr, device=torch.device("cuda", device))

    def all_reduce(self, a):
        """Sum over ranks, in place on ``a`` (made contiguous first); returns it."""
        self.n_all_reduce += 1
        torch, dist = self.torch, self.dist
        if not self.cuda:
            a = np.ascontiguousarray(a)
            dist.all_reduce(torch.from_numpy(a))
            return a
        a = self.cp.ascontiguousarray(a)
        if self.sync:
            self.stream.synchronize()
        with torch.cuda.stream(self.ext):
            dist.all_reduce(torch.from_dlpack(a))
            if self.sync:
                self.ext.synchronize()
        return a

    def all_gather_host(self, a):
        """int64 copies of ``a`` from every rank -> host numpy [world, a.size]."""
        torch, dist = self.torch, self.dist
        if not self.cuda:
            t = torch.from_numpy(np.ascontiguousarray(np.asarray(a, np.int64).ravel()))
            outs = [torch.empty_like(t) for _ in range(self.world)]
            dist.all_gather(outs, t)
            return np.stack([o.numpy() for o in outs])
        a = self.cp.ascontiguousarray(a.ravel().astype(self.cp.int64))
        with torch.cuda.stream(self.ext):
            t = torch.from_dlpack(a)
            outs = [torch.empty_like(t) for _ in range(self.world)]
            dist.all_gather(outs, t)
            return np.stack([o.cpu().numpy() for o in outs])

    def gather_objects(self, obj):
        out = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj, src=0):
        box = [obj]
        self.dist.broadcast_object_list(box, src=src)
        return box[0]

    def self_test(self, xp):
        """The all-reduce sees data just written by a kernel on our stream, and the next
        kernel sees the sum (an ordering bug shows up as a wrong sum here)."""
        n = 1 << 22
        for it in range(3):
            a = xp.arange(n, dtype=xp.float64) * (self.rank + 1) + it
            a = self.all_reduce(a)
            b = a * 2.0                                   # a kernel after the reduction
            want_scale = self.world * (self.world + 1) / 2
            ref = (np.arange(n, dtype=np.float64) * want_scale + it * self.world) * 2.0
            got = np.asarray(b.get() if self.cuda else b)
            if not np.array_equal(got, ref):
                bad = int(np.flatnonzero(got != ref)[0])
                raise RuntimeError(f"all-reduce self-test {it}: element {bad} is {got[bad]}, "
                                   f"expected {ref[bad]} (stream ordering or zero-copy broken)")


def rank_checked(be, comm, log):
    """A copy of backend ``be`` whose seq_stop all-gathers (num_accepted, emitted,
    accept_len, finished) after every call and raises RankDisagreement, on every rank at
    once (all see the same gathered data), when the ranks differ. ``log``: a dict whose
    "rounds" and "mismatch" counts are advanced."""
    ns = SimpleNamespace(**vars(be))
    xp = be.xp
    inner = be.seq_stop

    def seq_stop(emitted, num_accepted, out_tokens, out_lens, stop_ids, stop_seqs, max_new,
                 accept_len, finished, *a, **kw):
        r = inner(emitted, num_accepted, out_tokens, out_lens, stop_ids, stop_seqs, max_new,
                  accept_len, finished, *a, **kw)
        vec = xp.concatenate([num_accepted.ravel().astype(xp.int64),
                              emitted.ravel().astype(xp.int64),
                              accept_len.ravel().astype(xp.int64),
                              finished.ravel().astype(xp.int64)])
        g = comm.all_gather_host(vec)
        log["rounds"] += 1
        if not (g == g[0]).all():
            bad = [i for i in range(g.shape[0]) if not np.array_equal(g[i], g[0])]
            log["mismatch"] += 1
            raise RankDisagreement(f"seq_stop call {log['rounds']}: ranks {bad} differ from "
                                   f"rank 0 (num_accepted|emitted|accept_len|finished: "
                                   f"{g[0].tolist()} vs {g[bad[0]].tolist()})")
        return r
    ns.seq_stop = seq_stop
    return ns


def init_process_group(rank, world, backend_name, init_method, *, timeout_s=300.0, device=0):
    """torch.distributed over NCCL (``backend_name`` "cuda": GPU ``device``) or gloo
    (reference backend); returns ``torch.distributed``."""
    import torch
    import torch.distributed as dist
    if backend_name == "cuda":
        kw = dict(backend="nccl", device_id=torch.device("cuda", device))
    else:
        kw = dict(backend="gloo")
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        dist.init_process_group(init_method=init_method, rank=rank, world_size=world,
                                timeout=timeout, **kw)
    except TypeError:                         # a torch without device_id
        kw.pop("device_id", None)
        dist.init_process_group(init_method=init_method, rank=rank, world_size=world,
                                timeout=timeout, **kw)
    return dist


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(i, worker, world, args, init_method):
    rc = worker(i, world, args, init_method, None)
    if rc:
        raise SystemExit(rc)


def launch(worker, world, args, *, port=0):
    """Run ``worker(rank, world, args, init_method, local_rank)`` on every rank: in this
    process under torchrun (RANK / WORLD_SIZE / LOCAL_RANK set; its world counts), else in
    ``world`` processes started by torch.multiprocessing spawn with a TCP rendezvous on
    127.0.0.1:``port`` (0: a free one). ``worker`` must be importable by the children (a
    module-level function). Returns the worker's status under torchrun; under spawn 0, or
    raises when a rank failed (its own output says why)."""
    if all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):   # torchrun
        return worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, "env://",
                      int(os.environ["LOCAL_RANK"]))
    import torch.multiprocessing as mp
    init = f"tcp://127.0.0.1:{port or _free_port()}"
    mp.spawn(_spawned, args=(worker, world, args, init), nprocs=world, join=True)
    return 0
