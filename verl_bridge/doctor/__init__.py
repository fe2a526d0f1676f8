"""``verl-bridge doctor``: find why imports fail and versions clash, and say what to run.

The doctor never imports torch, megatron, vLLM or any native extension in its own process: it
reads versions, RECORDs and top-level names through ``importlib.metadata``, resolves modules on
the ``sys.path`` that the user's ``python`` has in the current directory (``env.user_sys_path``)
and runs the real imports in parallel subprocesses started the same way, under one deadline
(``probe.py``; a probe that does not finish is "unknown", never ok). Fixes name distributions,
not import names (``dists.py``). Each check (``checks_*.py``) turns those facts into a ``CheckResult`` with a
status, a summary, the evidence and a fix command. ``explain.py`` matches a pasted traceback
against the signatures in ``knowledge.py``; ``scan.py`` reads user code with ``ast`` and looks up
megatron.core names that moved (``renames.py``).

Check ids are a contract: ``python``, ``torch``, ``megatron-core``, ``megatron-namespace``,
``megatron-training``, ``transformer-engine``, ``apex``, ``flash-attn``, ``vllm``, ``nccl``,
``verl-bridge``.
"""

CHECK_IDS = (
    "python",
    "torch",
    "megatron-core",
    "megatron-namespace",
    "megatron-training",
    "transformer-engine",
    "apex",
    "flash-attn",
    "vllm",
    "nccl",
    "verl-bridge",
)
