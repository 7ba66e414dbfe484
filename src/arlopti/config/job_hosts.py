"""Rollout-worker URLs from the nodes of the job: ``${job_urls:PORT,PER_NODE[,FIRST]}``.

Under SLURM (``hydra/launcher=slurm``, or an sbatch script) the job's nodes are
``$SLURM_JOB_NODELIST`` in SLURM's compressed form (``gpu[01-03,07],head``). With hand-started rollout
workers (``rollout.placement=server rollout.server.spawn=false``) on every node of the job, ``PER_NODE``
of them listening on ``PORT``, ``PORT + 1``, ..., the trainer's ``rollout.server.urls`` are
``host:port`` for each node, node by node: ``rollout.server.urls='${job_urls:8100,8}'`` gives rank
``r`` (node-major, as SLURM numbers the tasks) the worker on its own node at ``8100 + r mod 8``
(each rank drives its contiguous share of the URLs, ``arlopti.config.rules``); ``FIRST`` skips the
job's first nodes (``${job_urls:8100,1,1}``: a worker on every node but node 0, the trainer's, the
layout of docs/scaling.md's sbatch script). Outside SLURM the one node is this host.
:func:`expand_nodelist` reads the compressed form without ``scontrol``.
"""

from __future__ import annotations

import os
import re
import socket

_BRACKET = re.compile(r"\[([^\]]*)\]")


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur] if cur else out


def _expand_range(spec: str) -> list[str]:
    """``01-03,07`` -> ``['01', '02', '03', '07']`` (zero padding kept)."""
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        if not hi:
            out.append(lo)
            continue
        if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
            raise ValueError(f"SLURM node list: bad range [{spec}]")
        out += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
    return out


def expand_nodelist(nodelist: str) -> list[str]:
    """The host names of a SLURM node list, in order: ``a[1-2]-ib,b`` -> ``[a1-ib, a2-ib, b]``."""
    hosts: list[str] = []
    for item in _split_top(nodelist.strip()):
        match = _BRACKET.search(item)
        if match is None:
            hosts.append(item)
            continue
        head, tail = item[:match.start()], item[match.end():]
        hosts += [h for n in _expand_range(match.group(1)) for h in expand_nodelist(head + n + tail)]
    return hosts


def job_hosts() -> list[str]:
    """The job's nodes (``$SLURM_JOB_NODELIST``), else this host alone."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    return expand_nodelist(nodelist) if nodelist else [socket.gethostname()]


def job_urls(port, per_node=1, first=0) -> list[str]:
    """``host:port+i`` for every node of the job from its ``first`` (0-based; e.g. 1 when node 0 runs
    the trainer alone) and ``i < per_node``, node by node."""
    port, per_node, first = int(port), int(per_node), int(first)
    if per_node < 1 or not 0 < port <= 65535 - per_node + 1:
        raise ValueError(f"job_urls:{port},{per_node}: a port in [1, 65535] and at least one worker per node")
    hosts = job_hosts()
    if not 0 <= first < len(hosts):
        raise ValueError(f"job_urls:{port},{per_node},{first}: the job has {len(hosts)} node(s) ({', '.join(hosts)})")
    return [f"{h}:{port + i}" for h in hosts[first:] for i in range(per_node)]


__all__ = ["expand_nodelist", "job_hosts", "job_urls"]
